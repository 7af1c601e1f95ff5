"""dlc report on fixture runs: PNG sizes, the table's numbers, and derived series by hand."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dlc.observe.report import write_report
from dlc.observe.runs import RunData, goodput_series, learner_steps_at, load_run, merged_share
from dlc.run import events
from tests.fixtures_runs import T0, finished_run, make_run


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def table(report_md: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in report_md.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_report_of_two_runs(tmp_path):
    a = finished_run(tmp_path / "a" / "r")
    b = finished_run(tmp_path / "b" / "r", goodput=0.875, status="failed", error="learner 2 died: gone\nstack")
    written = write_report([a, b], tmp_path / "out")
    names = [p.name for p in written]
    assert names == [
        "eval_loss_vs_tokens.png",
        "eval_loss_vs_time.png",
        "train_loss_r.png",
        "train_loss_r-2.png",  # two runs named r: the second is told apart
        "goodput.png",
        "timeline_r.png",  # each run's learner states under its goodput
        "timeline_r-2.png",
        "bytes_sent.png",
        "report.md",
    ]
    for png in written[:-1]:
        assert png_size(png) == (800, 450) and png.stat().st_size > 10_000
    rows = table((tmp_path / "out" / "report.md").read_text())
    assert rows[""] == ["r", "r-2"]
    expected = {
        "status": ["completed", "failed"],
        "learners": ["4", "4"],
        "parameters": ["219,520", "219,520"],
        "tokens": ["409,600", "409,600"],
        "wall time": ["3:20", "3:20"],
        "throughput (tok/s)": ["2,048", "2,048"],  # 409,600 tokens / 200 s
        "eval loss initial": ["5.426", "5.426"],
        "eval loss final": ["3.100", "3.100"],
        "goodput (%)": ["-", "87.5"],
        "rounds closed": ["400", "400"],
        "merge lag (steps, push to adoption)": ["2.50", "2.50"],  # the learners' 2, 2, 3 and 3
        "pushes rejected": ["2", "2"],
        "bytes up (MiB)": ["3.35", "3.35"],  # 3,512,320 B
        "bytes down (MiB)": ["10.00", "10.00"],
        # 4 B x 219,520 x 400 learner steps = 351,232,000 B = 334.96 MiB, 100x the bytes sent up
        "data-parallel each way (MiB)": ["334.96", "334.96"],
        "data-parallel / ours up (x)": ["100.0", "100.0"],
        "data-parallel / ours down (x)": ["33.5", "33.5"],  # 10,485,760 B down
        "data-parallel / ours up + down (x)": ["50.2", "50.2"],  # 702,464,000 B / 13,998,080 B
        "faults injected": ["2", "2"],
        "error": ["-", "learner 2 died: gone"],
    }
    assert {k: rows[k] for k in expected} == expected
    assert "![goodput](goodput.png)" in (tmp_path / "out" / "report.md").read_text()


def test_goodput_is_plotted_over_a_window_from_the_ledgers_totals(tmp_path):
    path = finished_run(tmp_path / "r")
    with open(path / "metrics.jsonl", "a") as f:  # 4 learners; one down from 40 s to 50 s
        for t, productive, allocated in ((30, 100, 100), (40, 140, 140), (50, 170, 180), (60, 210, 220)):
            f.write(f'{{"t": {T0 + t}, "kind": "goodput", "goodput": 0.9, "productive_s": {productive}, ')
            f.write(f'"allocated_s": {allocated}}}\n')
    run = load_run(path, "r")
    x, y, what = goodput_series(run)
    # Window max(10 s, 60 s / 30) = 10 s: each sample against the one 10 s before it.
    assert what == "goodput over 10 s (%)" and x.tolist() == [40.0, 50.0, 60.0] and y.tolist() == [1.0, 0.75, 1.0]
    intervals = {(i.learner, i.state) for i in run.intervals}
    assert {(i, "starting") for i in range(4)} <= intervals


def test_load_run_reads_progress_bytes_and_steps(tmp_path):
    run = load_run(finished_run(tmp_path / "r"), "r")
    # 400 rounds of 24 x 1,024 tokens over 24 fragments: 1,024 tokens merged each.
    assert len(run.merged) == 400 and sum(x for _, x in run.merged) == 409_600
    assert sum(b for _, b in run.sent) == 400 * (3_512_320 // 400)
    # Learner 0 starts at t0+10 and first pushes at t0+20; train lines at steps 50 and 100.
    assert run.steps[0] == [(T0 + 20, 0), (T0 + 59.2, 50), (T0 + 99.2, 100)]
    assert run.t0 == T0 and len(run.evals) == 2 and sorted(run.train) == [0, 1, 2, 3]
    assert [c["phase"] for c in run.chaos] == ["injected", "detected", "restarted", "injected"]


def test_a_push_and_a_round_lost_with_the_syncer_and_made_again_count_once(tmp_path):
    path = finished_run(tmp_path / "r")
    # Learner 0's next push of fragment 3 and the next round of fragment 5 (the fixture's left both at version 17).
    push = events.PushAccepted(learner=0, fragment=3, seq=101, base_version=16, version=17, bytes=500, steps=24)
    round_ = events.RoundClosed(
        fragment=5,
        version=18,
        contributors=[1],
        weights=[1.0],
        tokens=[24 * 1024],
        seqs=[101],
        staleness=[1],
        merged=[(1, 101)],
    )
    restarted = events.SyncerRestarted(
        after_s=3.0, resent_pushes=1, versions=[17] * 24, checkpoint_rounds=384, journal_rounds=15, rounds_closed=399
    )
    later = [
        push,
        round_,
        events.SyncerDied(),
        events.RoundLost(fragment=5, version=18, reason="syncer_died"),
        events.PushLost(learner=0, fragment=3, seq=101, version=17, bytes=500, reason="syncer_died"),
        restarted,
        push,  # re-sent and accepted again
        round_,  # made again
    ]
    with open(path / "events.jsonl", "a") as f:
        f.writelines(json.dumps({"t": T0 + 100 + i, **e.record()}) + "\n" for i, e in enumerate(later))
    run = load_run(path, "r")
    # The fixture's 400 rounds of 1,024 tokens and 400 pushes, then one more of each.
    assert len(run.merged) == 401 and sum(x for _, x in run.merged) == 410_624
    assert len(run.sent) == 401 and sum(b for _, b in run.sent) == 400 * (3_512_320 // 400) + 500


def test_without_chaos_the_faults_are_the_deaths_in_the_event_log(tmp_path):
    path = make_run(tmp_path / "r")
    died = events.LearnerDied(t=1800000070, learner=1, step=62, data_position=62, pid=4321)
    with open(path / "events.jsonl", "a") as f:
        f.write(json.dumps(died.record()) + "\n")
    (entry,) = load_run(path, "r").chaos
    # Its numbers come along, as the feed of `dlc status` shows them.
    assert entry == {
        "t": 1800000070,
        "step": 62,
        "data_position": 62,
        "pid": 4321,
        "fault": "unplanned",
        "target": "learner 1",
        "learner": 1,
        "phase": "died",
    }


def test_merged_share_by_hand():
    run = RunData(Path("x"), "x", {}, {}, merged=[(1, 100), (3, 100), (5, 50), (7, 100)], t0=0.0)
    # Width max(2, 7 / 60) = 2 s: bins [0,2) [2,4) [4,6) [6,8] hold 100, 100, 50, 100 tokens, so
    # 50, 50, 25, 50 tok/s; the steady rate (90th percentile) is 50.
    x, share = merged_share(run, min_width_s=2.0)
    assert x.tolist() == [2.0, 4.0, 6.0, 8.0] and share.tolist() == [1.0, 1.0, 0.5, 1.0]


def test_learner_steps_by_hand():
    run = RunData(Path("x"), "x", {}, {}, steps={0: [(10, 0), (20, 50)], 1: [(10, 0), (30, 100)]}, t0=0.0)
    # Learner 0: 0 before t=10, 25 at 15, 50 from 20 on; learner 1: 25 at 15, 50 at 20, 100 from 30.
    assert learner_steps_at(run, np.array([5.0, 15.0, 20.0, 30.0, 40.0])).tolist() == [0, 50, 100, 150, 150]


def as_older_dlc_wrote(path: Path, kind: str, older: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Rewrite each `kind` line of the run's events.jsonl as `older` makes it: the line an older dlc wrote,
    which lacks fields this one's record needs."""
    log = path / "events.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps(older(line) if line["kind"] == kind else line) + "\n" for line in lines))


def test_the_table_says_which_devices_the_learners_trained_on(tmp_path):
    from dlc.observe.report import table_rows

    h100 = "gpu: NVIDIA H100 80GB HBM3"
    mixed = finished_run(tmp_path / "mixed")
    summary = json.loads((mixed / "summary.json").read_text())
    for row, device in zip(summary["learners"], [h100, "cpu", "cpu", "cpu"], strict=True):
        row["device"] = device
    (mixed / "summary.json").write_text(json.dumps(summary))
    assert dict(table_rows(load_run(mixed, "mixed")))["devices"] == f"3 x cpu, 1 x {h100}"
    # A run whose rows do not say (written before devices were recorded): its learner_started events do.
    older = finished_run(tmp_path / "older")
    as_older_dlc_wrote(older, "learner_started", lambda line: {k: line[k] for k in ("t", "kind", "learner", "pid")})
    assert dict(table_rows(load_run(older, "older")))["devices"] == "-"
    with open(older / "events.jsonl", "a") as f:
        for i in range(4):
            started = events.LearnerStarted(
                t=T0 + 11,
                learner=i,
                pid=1000 + i,
                platform="gpu",
                device_kind="NVIDIA H100 80GB HBM3",
                device=h100,
                node="10.0.0.2",
                node_id="bbbbbb22" * 7,
                allocator="kept, one arena",
            )
            f.write(json.dumps(started.record()) + "\n")
    assert dict(table_rows(load_run(older, "older")))["devices"] == f"4 x {h100}"


def test_the_table_says_what_the_run_trained_on_and_its_vocabulary(tmp_path):
    from dlc.observe.report import table_rows

    run = finished_run(tmp_path / "bpe")
    # A run from before tokenizers were recorded: its run_started said the corpus's bytes, not the data.
    as_older_dlc_wrote(
        run,
        "run_started",
        lambda line: {
            **{k: line[k] for k in ("t", "kind", "run_dir", "storage", "learners", "algorithm", "resumed")},
            "corpus_bytes": 1_000_000,
            "eval_bytes": 50_000,
        },
    )
    assert dict(table_rows(load_run(run, "bpe")))["data"] == "-"
    started = events.RunStarted(
        t=T0 + 1,
        run_dir=str(run),
        storage=str(run),
        algorithm="decoupled",
        learners=4,
        data="/d/stdlib-bpe",
        tokenizer="bpe:4096",
        train_tokens=400_000,
        eval_tokens=20_000,
        eval_bytes_per_token=2.5,
        resumed=False,
    )
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps(started.record()) + "\n")
    recipe = (run / "recipe.yaml").read_text()
    (run / "recipe.yaml").write_text(recipe.replace("vocab_size: null", "vocab_size: 4096"))
    ended = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**ended, "params": 465_280}))  # as the driver records it
    rows = dict(table_rows(load_run(run, "bpe")))
    assert rows["data"] == "/d/stdlib-bpe (bpe:4096, 4,096 tokens)"
    assert rows["parameters"] == "465,280"  # tiny with 4,096 embeddings instead of 256
