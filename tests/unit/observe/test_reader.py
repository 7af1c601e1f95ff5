"""The run reader behind `dlc status` and `dlc report`: tolerance of half-written files, byte rates
over live snapshots, the parameter count the driver recorded, and finding the run."""

from __future__ import annotations

import json
import os
import time

import pytest

from dlc.errors import UserError
from dlc.observe.reader import RunReader, voided
from dlc.run import events
from dlc.run.files import JsonlTail, resolve_run
from tests.fixtures_runs import ELAPSED_S, NOW, T0, make_run, status, summary


def test_corrupt_status_keeps_the_last_good_copy(tmp_path):
    path = make_run(tmp_path / "r")
    reader = RunReader(path, clock=lambda: NOW)
    assert reader.snapshot()["learners"][0]["step"] == 100
    (path / "status.json").write_text("{")
    snap = reader.snapshot()
    assert snap["learners"][0]["step"] == 100
    assert snap["warnings"] == ["status.json could not be read; showing the last good copy"]


def test_jsonl_tail_reads_complete_lines_once(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"a": 1}\n{"b"')
    tail = JsonlTail(path)
    assert tail.read() == [{"a": 1}] and tail.partial
    with open(path, "a") as f:
        f.write(": 2}\n[3]\n")
    assert tail.read() == [{"b": 2}] and not tail.partial and tail.skipped == 1  # [3] is no object
    assert tail.read() == []
    path.write_text("{}\n")  # shorter than what was read: a new file
    assert tail.read() is None
    assert JsonlTail(tmp_path / "missing.jsonl").read() == []


def test_byte_rates_over_live_snapshots(tmp_path):
    path = make_run(tmp_path / "r")
    now = [NOW]
    reader = RunReader(path, clock=lambda: now[0])
    reader.snapshot()
    later = status(updated_at=T0 + ELAPSED_S + 10, elapsed_s=ELAPSED_S + 10)
    later["syncer"]["bytes_up"] += 102_400
    later["syncer"]["bytes_down"] += 1_024_000
    (path / "status.json").write_text(json.dumps(later))
    now[0] += 10
    sync = reader.snapshot()["syncer"]
    assert (sync["bytes_up_per_s"], sync["bytes_down_per_s"]) == (10_240.0, 102_400.0)  # over the 10 s


def test_resumed_run_ignores_the_previous_summary(tmp_path):
    path = make_run(tmp_path / "r", summary=summary("interrupted"))
    os.utime(path / "summary.json", (time.time() - 60, time.time() - 60))
    assert RunReader(path, clock=lambda: NOW).snapshot()["state"] == "running"
    os.utime(path / "summary.json")
    assert RunReader(path, clock=lambda: NOW).snapshot()["state"] == "interrupted"


def test_the_parameter_count_is_the_one_the_driver_recorded(tmp_path):
    """`dlc status` builds no model: the count comes from status.json, else summary.json, else it is unknown."""
    path = make_run(tmp_path / "r")
    assert RunReader(path, clock=lambda: NOW).snapshot()["dp_equivalent"]["params"] == 219_520
    (path / "status.json").write_text(json.dumps({k: v for k, v in status().items() if k != "params"}))
    assert RunReader(path, clock=lambda: NOW).snapshot()["dp_equivalent"]["params"] is None
    written = {k: v for k, v in status().items() if k != "params"}
    path = make_run(tmp_path / "ended", status_obj=written, summary=summary(params=1_234))
    assert RunReader(path, clock=lambda: NOW).snapshot()["dp_equivalent"]["params"] == 1_234


def test_resolve_run_picks_the_latest_and_refuses_non_runs(tmp_path):
    runs = tmp_path / "runs"
    for name, age_s in (("old", 100), ("new", 10)):
        (runs / name).mkdir(parents=True)
        (runs / name / "recipe.yaml").write_text("run: {}\n")
        for p in (runs / name / "recipe.yaml", runs / name):
            os.utime(p, (time.time() - age_s, time.time() - age_s))
    (runs / "stray").mkdir()
    assert resolve_run(None, runs) == runs / "new"
    with pytest.raises(UserError, match="no run directory under"):
        resolve_run(None, tmp_path / "nowhere")
    with pytest.raises(UserError, match="does not exist"):
        resolve_run(tmp_path / "nowhere")
    with pytest.raises(UserError, match="is not a run directory"):
        resolve_run(runs / "stray")


def test_a_lost_record_voids_the_latest_acceptance_or_round_before_it():
    def accepted(seq, learner=0):
        return events.PushAccepted(learner=learner, fragment=0, seq=seq, base_version=1, version=2, bytes=512, steps=4)

    def lost_push(seq):
        return events.PushLost(learner=0, fragment=0, seq=seq, version=2, bytes=512, reason="syncer_died")

    def closed(fragment, version):
        return events.RoundClosed(
            fragment=fragment, version=version, contributors=[0], weights=[1.0], tokens=[64], seqs=[1]
        )

    def lost_round(fragment, version, reason="syncer_died"):
        return events.RoundLost(fragment=fragment, version=version, reason=reason)

    logged = [
        accepted(1),  # 0: merged
        accepted(2),  # 1: lost with the syncer ...
        accepted(2, learner=1),  # 2: another learner's seq 2: kept
        closed(0, 3),  # 3: lost at a resume from an older state
        lost_round(0, 3, "run_stopped"),
        lost_push(2),
        accepted(2),  # 6: ... and accepted again: kept
        closed(0, 3),  # 7: made again: kept
        lost_push(9),  # an acceptance the log never held: voids nothing
        lost_round(1, 1),
    ]
    assert voided(logged) == {1, 3}
