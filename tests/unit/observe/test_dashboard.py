"""The `dlc status` dashboard: frames of fixture run directories on a recording console, and (slow)
the live view of a real run in tmux."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dlc.observe.dashboard import render, sparkline
from dlc.observe.reader import RunReader
from dlc.run import events
from tests.fixtures_runs import NOW, T0, chaos_entries, dead_pid, learner_row, make_run, status, summary
from tests.helpers import REPO, TINY, cells, kill_tree, row, start_train, wait_for_step


def frame(path: Path, now: float = NOW, interactive: bool = False) -> str:
    snap = RunReader(path, clock=lambda: now).snapshot()
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(render(snap, interactive))
    return console.export_text()


def test_healthy_run_frame(tmp_path):
    text = frame(make_run(tmp_path / "healthy"))
    assert "tiny · decoupled · running" in text
    assert "step 100.0 (25%)   tokens 409,600   4,096 tok/s   ETA 5:00" in text
    assert "eval loss 3.100 (from 5.426)   bits/byte 4.472   train loss 3.150   goodput -" in text
    # id state step tokens tok/s loss last-push stale restarts rejected (no goodput column: no
    # learner reports one). Learner 2 had two pushes rejected in events.jsonl; every learner's
    # last round had staleness 1.
    assert "id  state       step   tokens  tok/s   loss  last push  stale  restarts  rejected\n" in text
    assert [row(text, i)[1] for i in range(4)] == ["training"] * 4
    assert row(text, 2) == ["2", "training", "100", "102,400", "1,024", "3.200", "0.5s", "1", "0", "2"]
    assert "rounds closed 400   quorum 1   grace window 0.25 s" in text
    assert "contributors/round 1.50   healthy 0,1,2,3" in text
    assert "merge lag 2.50 steps, push to adoption" in text  # the learners' 2, 2, 3 and 3
    assert "rejected 2 (norm_outlier 2)" in text
    # One snapshot: rates are the run's averages, 3,512,320 B / 100 s = 34.3 KiB/s, 10 MiB / 100 s.
    assert "sent up 3.35 MiB (34.3 KiB/s)" in text and "sent down 10.00 MiB (102.4 KiB/s)" in text
    # 4 B x 219,520 params x 400 learner steps = 351,232,000 B = 334.96 MiB each way: 100x the
    # 3,512,320 B sent up, 33.5x the 10,485,760 B sent down, 702,464,000 / 13,998,080 = 50.2x both.
    assert "data-parallel: 334.96 MiB each way" in text and "50x ours in all (up 100x, down 33x)" in text
    assert "no faults recorded" in text
    assert "updated 0.5s ago" in text and "q or Ctrl-C quits" not in text
    assert "q or Ctrl-C quits" in frame(tmp_path / "healthy", interactive=True)


def test_learners_on_several_nodes_show_their_node(tmp_path):
    # Two nodes on one host share an address: the start of each node's id tells them apart; a node
    # with an address of its own is named by it. On one node the column is left out (the frame above).
    nodes = ["aaaaaa11", "bbbbbb22", "aaaaaa11", "cccccc33"]
    ips = ["127.0.0.1", "127.0.0.1", "127.0.0.1", "10.0.0.3"]
    rows = [learner_row(i, node_id=nodes[i], node=ips[i]) for i in range(4)]
    text = frame(make_run(tmp_path / "r", status(learners=rows)))
    assert "rejected  node" in text
    assert [cells(text, i)["node"] for i in range(4)] == ["127.0.0.1/aaaaaa", "127.0.0.1/bbbbbb", "127.0.0.1/aaaaaa",
                                                          "10.0.0.3"]  # fmt: skip


def test_loss_chart_by_hand(tmp_path):
    text = frame(make_run(tmp_path / "r"))
    # Points: eval (t0+10, 5.426), (t0+99.5, 3.1); mean train loss (t0+59.2, 3.75) at step 50,
    # (t0+99.2, 3.15) at step 100, and status.json's 3.15 at t0+100. 30 bins of 3 s from t0+10;
    # heights int((v - 3.1) / 2.326 * 8): 5.426 -> 8 (clipped to the top block), 3.75 -> 2, 3.15 -> 0.
    assert "loss over time (3.10 to 5.43)" in text
    assert "eval  " + "█" * 29 + "▁" + " 5.43→3.10" in text
    assert "train " + " " * 16 + "▃" * 13 + "▁" + " 3.75→3.15" in text
    assert "0:00" in text and "1:30" in text  # the chart spans t0+10 .. t0+100


def test_sparkline_by_hand():
    # Bins end at 0.75, 1.5, 2.25, 3; values 4, 3, 2, 1 on [1, 4]: (v - 1) / 3 * 8 = 8, 5.3, 2.7, 0.
    assert sparkline([(0, 4), (1, 3), (2, 2), (3, 1)], 4, 0, 3, 1, 4) == "█▆▃▁"
    assert sparkline([(2, 1)], 3, 0, 3, 1, 1) == " ▅▅"  # flat: mid height; nothing before t=2


def test_dead_stalled_and_slow_learners(tmp_path):
    rows = [
        learner_row(0, goodput=1.0),
        {k: v for k, v in learner_row(1, state="dead", goodput=0.5).items() if k != "restarts"},
        learner_row(2, tokens_per_s=300.0),  # under half the median 1,024 of training learners
        learner_row(3),  # no heartbeat: not in the syncer's healthy list
    ]
    st = status(learners=rows, goodput=0.875, badput={"dead": 10.0, "stalled": 2.5})
    st["syncer"]["healthy"] = [0, 1, 2]
    text = frame(make_run(tmp_path / "r", st, chaos=chaos_entries()))
    assert [row(text, i)[1] for i in range(4)] == ["training", "dead", "slow", "stalled"]
    assert cells(text, 1) | {"loss": ""} == {
        "id": "1",
        "state": "dead",
        "step": "100",
        "tokens": "102,400",
        "tok/s": "1,024",
        "loss": "",
        "last_push": "0.5s",
        "stale": "1",
        "restarts": "1",  # from chaos.jsonl: the row has no count of its own
        "rejected": "0",
        "goodput": "50.0%",
    }
    assert cells(text, 0)["goodput"] == "100.0%"
    assert "goodput 87.5%   badput dead 0:10, stalled 0:02" in text
    feed = text[text.index("faults and recoveries") :]
    assert "kill         learner 1  injected     SIGKILL" in feed
    assert "detected" in feed and "after_s=1.5" in feed and "restarted" in feed
    assert "stall        learner 3  injected     SIGSTOP" in feed


def test_a_killed_learner_shows_dead_before_the_driver_notices(tmp_path):
    # Today's engine: no chaos fields; the row still says training but its process is gone.
    st = status(learners=[learner_row(i, pid=dead_pid() if i == 2 else os.getpid()) for i in range(4)])
    text = frame(make_run(tmp_path / "r", st))
    assert [row(text, i)[1] for i in range(4)] == ["training", "training", "dead", "training"]


def test_deaths_outside_chaos_come_from_the_event_log(tmp_path):
    path = make_run(tmp_path / "r")
    died = events.LearnerDied(t=T0 + 70, learner=1, step=62, data_position=62, pid=123)
    recovered = events.LearnerRecovered(t=T0 + 80, learner=1, after_s=9.5, fault="kill")
    with open(path / "events.jsonl", "a") as f:
        f.writelines(json.dumps(e.record()) + "\n" for e in (died, recovered))
    feed = frame(path).split("faults and recoveries")[1]
    lines = [line.split() for line in feed.splitlines()]
    death = ["unplanned", "learner", "1", "died", "step=62", "data_position=62", "pid=123"]
    assert any(line[2:9] == death for line in lines)
    assert any(line[2:7] == ["unplanned", "learner", "1", "recovered", "after_s=9.5"] for line in lines)
    # With chaos.jsonl present, the feed is chaos's own record (it logs the same deaths).
    (path / "chaos.jsonl").write_text(json.dumps(chaos_entries()[0]) + "\n")
    feed = frame(path).split("faults and recoveries")[1]
    assert "unplanned" not in feed and "SIGKILL" in feed


def test_failed_run_names_the_dead_learner(tmp_path):
    # What the driver writes today when learner 2 is SIGKILLed: every row failed, an error.
    st = status("failed", learners=[learner_row(i, state="failed") for i in range(4)])
    error = "learner 2 died: The actor died unexpectedly before finishing this task.\nmore"
    text = frame(make_run(tmp_path / "r", st, summary=summary("failed", error=error)))
    assert "tiny · decoupled · failed" in text
    assert [row(text, i)[1] for i in range(4)] == ["failed", "failed", "dead", "failed"]
    assert "run failed: learner 2 died: The actor died unexpectedly before finishing this task." in text
    assert "more" not in text


def test_finished_run(tmp_path):
    st = status("completed", learners=[learner_row(i, state="completed") for i in range(4)])
    ended = summary(goodput=0.9, badput_s={"dead": 5.0, "startup": 0.0})  # the chaos driver's names
    text = frame(make_run(tmp_path / "r", st, summary=ended), now=NOW + 3600)
    assert "tiny · decoupled · completed" in text
    assert "goodput 90.0%   badput dead 0:05" in text  # empty buckets are left out
    assert [row(text, i)[1] for i in range(4)] == ["completed"] * 4
    assert "ETA" not in text and "4,096 tok/s" not in text  # no live rates for a finished run
    assert "sent up 3.35 MiB (34.3 KiB/s)" in text  # whole-run averages
    assert "last update" in text and "updated" not in text and "!" not in text


def test_truncated_and_corrupt_files_never_crash(tmp_path):
    path = make_run(tmp_path / "r", events_tail='not json\n{"t": 1800000070, "kind": "push_rej')
    (path / "metrics.jsonl").write_text((path / "metrics.jsonl").read_text()[:-30])
    (path / "recipe.yaml").write_text("model: [unclosed")
    snap = RunReader(path, clock=lambda: T0 + 3600).snapshot()  # stale: the cut lines stay cut
    text = frame(path, now=T0 + 3600)
    assert snap["learners"][2]["rejected"] == 2  # the half-written third rejection is not counted
    assert "! events.jsonl: skipped 1 unreadable line(s)" in text
    assert "! events.jsonl: last line is incomplete (ignored)" in text
    assert "! metrics.jsonl: last line is incomplete (ignored)" in text
    assert "data-parallel: 334.96 MiB each way" in text  # from the count status.json recorded, not recipe.yaml
    assert "status.json not updated for 58:20: is the driver still running?" in text  # 3,600 - 100 s
    (path / "status.json").write_text(json.dumps(status(learners="oops", syncer=[1], goodput="high")))
    assert "goodput -" in frame(path) and "rounds closed 0" in frame(path)  # wrong types read as absent
    (path / "status.json").write_text('{"run": "tiny", "lear')
    text = frame(path)
    assert "! status.json could not be read" in text and "no learner has reported yet" in text


# -- a real run in a real terminal ---------------------------------------------------------------


def _state(screen: str, learner: int) -> str | None:
    """The state word of a learner's row; a starting learner's phase follows it ("restarting: ...")."""
    rows = (line.split() for line in screen.splitlines())
    return next((cells[1].rstrip(":") for cells in rows if cells[:1] == [str(learner)] and len(cells) > 1), None)


def _screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "-L", session, "capture-pane", "-p", "-t", session], capture_output=True, text=True
    ).stdout


def _whole(screen: str) -> bool:
    """Whether the capture holds one whole frame: the view redraws by erasing from the bottom up and then
    writing top to bottom, so a capture taken mid-redraw lacks the footer, its last line."""
    lines = [line for line in screen.splitlines() if line.strip()]
    return bool(lines) and (" ago" in lines[-1] and "updated " in lines[-1] or lines[-1].startswith("last update "))


def _wait_screen(session: str, ok: Any, timeout_s: float, what: str) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        screen = _screen(session)
        if _whole(screen) and ok(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{what}: not seen within {timeout_s:.0f} s; screen:\n{screen}")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_view_of_a_real_run_shows_a_killed_learner(tmp_path):
    run_dir = tmp_path / "live"
    session = f"dlcstatus{os.getpid()}"
    # Paced: the run only has to last until the view has shown the kill and the restart; unpaced, its
    # four learners would take both cores from the tests beside it all that time.
    paced = "learners.step_time_s=0.2"
    proc = start_train(str(TINY), f"run.dir={run_dir}", "run.max_steps=2000", "checkpoint.every_steps=1000", paced)
    try:
        # The view as `dlc status RUN` runs it, in a 130 x 50 terminal of a private tmux server.
        show = "import sys, pathlib; from dlc.observe.dashboard import show; show(pathlib.Path(sys.argv[1]))"
        view = f"cd {REPO} && COLUMNS=130 LINES=50 {sys.executable} -c '{show}' {run_dir}"
        tmux = ["tmux", "-L", session]
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "130", "-y", "50", view], check=True)
        wait_for_step(run_dir, 5, proc, timeout_s=400)
        screen = _wait_screen(
            session, lambda s: all(_state(s, i) == "training" for i in range(4)), 60, "four training learners"
        )
        assert "tiny · decoupled · running" in screen and "q or Ctrl-C quits" in screen
        victim = json.loads((run_dir / "status.json").read_text())["learners"][2]["pid"]
        os.kill(victim, signal.SIGKILL)
        # Dead until the driver notices (the view checks the pid), then dead or restarting.
        _wait_screen(session, lambda s: _state(s, 2) in ("dead", "restarting"), 60, "learner 2 down")
        screen = _wait_screen(
            session, lambda s: "· failed" in s or _state(s, 2) == "training", 300, "the run failed or learner 2 back"
        )
        assert "tiny · decoupled · running" in screen and cells(screen, 2)["restarts"] == "1", screen
        subprocess.run([*tmux, "send-keys", "-t", session, "q"], check=True)
        deadline = time.time() + 10
        while subprocess.run([*tmux, "has-session", "-t", session], capture_output=True).returncode == 0:
            assert time.time() < deadline, "q did not quit the view"
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True)
        (Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / session).unlink(missing_ok=True)
        kill_tree(proc)
        proc.communicate()  # closes the pipes


def test_start_up_phases_and_hot_spares_show_while_live(tmp_path):
    rows = [
        learner_row(0),
        learner_row(1, state="restarting", phase="spare s0 taking over", phase_s=0.4),
        learner_row(2, state="starting", phase="loading compiled step", phase_s=1.25),
        learner_row(3, state="rejoining", phase="copying state from 0"),  # written before phase_s existed
    ]
    spares = [
        {"id": "s1", "state": "spare", "phase": "compiling", "phase_s": 12.0, "startup": {}},
        {"id": "s2", "state": "spare", "phase": "ready", "phase_s": 30.0, "startup": {}},
    ]
    text = frame(make_run(tmp_path / "r", status(learners=rows, spares=spares)))
    # What each starting learner is doing, and for how long so far.
    assert "restarting: spare s0 taking over 0.4s" in text
    assert "starting: loading compiled step 1.2s" in text and "rejoining: copying state from 0 " in text
    assert row(text, 0)[1] == "training"  # a trained learner shows no phase
    spare = next(line for line in text.splitlines() if line.lstrip().startswith("s1 "))
    assert spare.split()[:4] == ["s1", "spare:", "compiling", "12.0s"]
    ready = next(line for line in text.splitlines() if line.lstrip().startswith("s2 "))
    assert ready.split()[:3] == ["s2", "spare:", "ready"] and "30.0s" not in ready  # waiting is not starting
    # A finished run holds no spares.
    done = frame(make_run(tmp_path / "done", status("completed", learners=rows, spares=spares), summary=summary()))
    assert "s1 " not in done


def test_the_devices_are_in_the_header_and_per_learner_on_mixed_hardware(tmp_path):
    same = status(learners=[learner_row(i, device="cpu") for i in range(4)])
    text = frame(make_run(tmp_path / "cpu", same))
    assert "devices 4 x cpu" in text
    assert "device" not in next(line for line in text.splitlines() if line.startswith("id "))  # no column
    devices = ["gpu: NVIDIA H100 80GB HBM3", "cpu", "cpu", "cpu"]
    mixed = status(learners=[learner_row(i, device=d) for i, d in enumerate(devices)])
    text = frame(make_run(tmp_path / "mixed", mixed))
    assert "devices 3 x cpu, 1 x gpu: NVIDIA H100 80GB HBM3" in text
    header = next(line for line in text.splitlines() if line.startswith("id "))
    assert header.split()[-1] == "device"
    assert row(text, 0)[-4:] == ["gpu:", "H100", "80GB", "HBM3"] and row(text, 1)[-1] == "cpu"


def test_status_json_times_each_start_up_phase_from_when_it_began(monkeypatch):
    from dlc.config.budget import Budget
    from dlc.config.load import load_recipe
    from dlc.observe.snapshot import RunView, Snapshots

    recipe = load_recipe(TINY, [])
    snapshots = Snapshots(recipe, "runs/x", Budget(recipe), started=0.0)
    clock = [1000.0]
    monkeypatch.setattr("dlc.observe.snapshot.time.time", lambda: clock[0])

    def learners_at(t, phases):
        clock[0] = t
        rows = [{"id": i, "state": state, "phase": phase} for i, (state, phase) in enumerate(phases)]
        view = RunView(
            wall_s=t, step=0.0, tokens=0, learners=rows, goodput={"goodput": None, "badput": {}}, syncer={}, rejected={}
        )
        return [r.get("phase_s") for r in snapshots.status("running", view)["learners"]]

    assert learners_at(1000.0, [("starting", "compiling"), ("restarting", "starting process")]) == [0.0, 0.0]
    assert learners_at(1003.0, [("starting", "compiling"), ("restarting", "starting process")]) == [3.0, 3.0]
    # Learner 0 moves on to its next phase, learner 1 trains: the clock starts again, or stops.
    assert learners_at(1004.5, [("starting", "copying state"), ("training", None)]) == [0.0, None]
    assert learners_at(1006.0, [("starting", "copying state"), ("restarting", "starting process")]) == [1.5, 0.0]
