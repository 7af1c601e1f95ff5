"""Chaos targets on real processes: signals, the stall timer that outlives its controller, and a run
directory's status, control and chaos files.

The process tests signal `sleep` children and clean every one of them up, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.controller import Controller
from chaos.faults import FaultKind
from chaos.target import LearnerInfo, ProcessSignals, RunDirTarget, TargetError
from dlc.run.files import CHAOS_FILE, CONTROL_FILE, append_jsonl, read_lines_after
from tests.fakes import SleepingClock
from tests.helpers import REPO, bare_plan, write_status


@pytest.fixture
def stray_pids() -> Iterator[list[int]]:
    """Pids of processes started by our children (stall timers); killed at teardown if still there."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    """The process state letter from /proc (R, S, T for stopped, Z, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_process_signals_refuse_pids_that_address_groups_or_ourselves():
    sent: list[tuple[int, int]] = []
    signals = ProcessSignals(send=lambda pid, sig: sent.append((pid, sig)))
    for pid in (0, -1, 1, os.getpid()):
        with pytest.raises(TargetError):
            signals.kill(pid)
    assert sent == []


def test_stall_timer_resumes_the_victim_after_the_controller_dies(spawn, stray_pids):
    victim = spawn(["sleep", "30"])
    code = (
        "import sys, time\n"
        "from chaos.target import ProcessSignals\n"
        "timer = ProcessSignals().stall(int(sys.argv[1]), 1.0)\n"
        "print(timer.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    controller = spawn(
        [sys.executable, "-c", code, str(victim.pid)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    stray_pids.append(int(controller.stdout.readline()))
    stalled_at = time.monotonic()
    assert _wait_for(lambda: _state(victim.pid) == "T", 1.0), "SIGSTOP did not freeze the victim"
    controller.kill()
    controller.wait(timeout=5)
    if time.monotonic() - stalled_at < 0.8:  # the timer has not fired yet: whoever resumes it, it is not the controller
        assert _state(victim.pid) == "T"
    assert _wait_for(lambda: _state(victim.pid) != "T", 4.0), "the victim stayed frozen"
    assert victim.poll() is None


def test_run_dir_target_asks_the_driver_for_every_fault(tmp_path: Path):
    # A pid means something only on its node: kills and stalls are requests too, carried out by the
    # agent on the learner's node, and they name the process chaos saw (a replaced one is spared).
    write_status(tmp_path, {0: 4100, 1: 4101}, 4200)
    status = json.loads((tmp_path / "status.json").read_text())
    status["learners"][0]["node_id"] = "n-a"
    (tmp_path / "status.json").write_text(json.dumps(status))
    target = RunDirTarget(tmp_path)
    assert target.learners() == [LearnerInfo(0, 4100, "training", "n-a"), LearnerInfo(1, 4101, "training")]
    assert target.quorum() == 2 and target.running()

    target.stall(1, 0.5)
    target.kill(0)
    target.kill_node(0)
    target.kill_syncer()
    with pytest.raises(TargetError, match="no learner 7"):
        target.kill(7)
    with pytest.raises(TargetError, match="no node for learner 1"):
        target.kill_node(1)
    target.slow(1, 2.5, 20.0)
    target.join(60.0)
    target.leave(1)
    lines, offset = read_lines_after(tmp_path / CONTROL_FILE, 0)
    assert [{k: v for k, v in x.items() if k != "t"} for x in lines] == [
        {"op": "stall", "learner": 1, "duration_s": 0.5, "pid": 4101},
        {"op": "kill", "learner": 0, "pid": 4100},
        {"op": "kill_node", "learner": 0, "node": "n-a"},
        {"op": "kill_syncer", "learner": None, "pid": 4200},
        {"op": "slow", "learner": 1, "factor": 2.5, "duration_s": 20.0},
        {"op": "join", "learner": None, "factor": None, "duration_s": 60.0},
        {"op": "leave", "learner": 1, "factor": None, "duration_s": None},
    ]
    assert all(abs(x["t"] - time.time()) < 60 for x in lines)
    assert read_lines_after(tmp_path / CONTROL_FILE, offset) == ([], offset)

    target.record({"fault": "kill", "phase": "injected"})
    target.record({"fault": "stall", "phase": "refused", "t": 5.0})
    recorded = [json.loads(x) for x in (tmp_path / CHAOS_FILE).read_text().splitlines()]
    assert recorded[0]["fault"] == "kill" and recorded[0]["t"] > 1e9 and recorded[1]["t"] == 5.0


def test_node_agent_signals_processes_of_its_node(spawn, stray_pids):
    # What the agent on a learner's node does for the driver: SIGKILL (several at once for a lost
    # node), SIGSTOP with the SIGCONT timer started on its node, and a gone process reported, not raised.
    from dlc.engine.supervision.agent import NodeAgentWorker

    a, b, c = spawn(["sleep", "30"]), spawn(["sleep", "30"]), spawn(["sleep", "30"])
    agent = NodeAgentWorker()
    before = time.time()
    t, errors = agent.stall(c.pid, 0.5)
    assert errors == [] and before <= t <= time.time()  # when the signal went out, on this node's clock
    assert _wait_for(lambda: _state(c.pid) == "T", 1.0)
    assert _wait_for(lambda: _state(c.pid) != "T", 3.0), "the timer did not resume it"
    assert agent.kill([a.pid, b.pid])[1] == []
    assert a.wait(timeout=5) == -signal.SIGKILL and b.wait(timeout=5) == -signal.SIGKILL
    assert agent.kill([a.pid])[1] == [f"process {a.pid} is gone"]
    assert "is gone" in agent.stall(a.pid, 1.0)[1][0]
    assert agent.kill([1])[1] == ["1 is not a process id this tool will signal"] and c.poll() is None


def test_run_dir_target_asks_the_driver_to_degrade_or_cut_a_link(tmp_path: Path):
    target = RunDirTarget(tmp_path, clock=lambda: 1234.5)
    target.degrade_link(2, 10.0, 30.0)
    target.cut_link(3, 10.0)
    lines = [json.loads(x) for x in (tmp_path / CONTROL_FILE).read_text().splitlines()]
    assert lines == [
        {"t": 1234.5, "op": "degrade_link", "learner": 2, "factor": 10.0, "duration_s": 30.0},
        {"t": 1234.5, "op": "cut_link", "learner": 3, "duration_s": 10.0},
    ]


def test_run_dir_target_tolerates_missing_stale_and_finished_status(tmp_path: Path):
    target = RunDirTarget(tmp_path)
    assert target.learners() == [] and not target.running()
    (tmp_path / "status.json").write_text(
        json.dumps(
            {"state": "running", "updated_at": time.time(), "learners": [{"id": 0, "pid": 4242, "state": "slow"}]}
        )
    )
    assert target.running() and target.learners() == [LearnerInfo(0, 4242, "slow")]
    assert target.quorum() == 1  # no syncer.quorum and no recipe.yaml: every learner, the safe answer
    (tmp_path / "recipe.yaml").write_text("syncer:\n  quorum: 3\n")
    assert target.quorum() == 3
    with pytest.raises(TargetError, match="syncer's pid"):
        target.kill_syncer()
    (tmp_path / "status.json").write_text('{"state": "runn')  # unreadable: keep the last good reading
    assert target.learners() == [LearnerInfo(0, 4242, "slow")]
    write_status(tmp_path, {0: 4242}, updated_at=time.time() - 120)
    assert not target.running()  # the driver stopped writing: treat the run as gone
    write_status(tmp_path, {0: 4242}, state="completed")
    assert not target.running()


def test_read_control_leaves_a_half_written_line_for_later(tmp_path: Path):
    path = tmp_path / CONTROL_FILE
    assert read_lines_after(path, 0) == ([], 0)
    append_jsonl(path, {"op": "slow", "learner": 1})
    with open(path, "a") as f:
        f.write('not json\n{"op": "jo')
    entries, offset = read_lines_after(path, 0)
    assert entries == [{"op": "slow", "learner": 1}] and offset == len(path.read_bytes()) - len('{"op": "jo')
    with open(path, "a") as f:
        f.write('in"}\n')
    assert read_lines_after(path, offset) == ([{"op": "join"}], len(path.read_bytes()))
    path.write_text('{"op": "leave"}\n')  # replaced by a shorter file: start over
    assert read_lines_after(path, 10_000)[0] == [{"op": "leave"}]


def test_dry_run_against_a_run_directory_touches_nothing(tmp_path: Path, spawn):
    victim = spawn(["sleep", "30"])
    write_status(tmp_path, {0: victim.pid, 1: 4242, 2: 4243})
    clock = SleepingClock()
    plan = bare_plan(dry_run=True, duration_s=10, timeline=[{"at_s": 1, "fault": "stall", "learner": 0},
                                                            {"at_s": 2, "fault": "slow", "learner": 1}])  # fmt: skip
    report = Controller(plan, RunDirTarget(tmp_path), clock=clock, sleep=clock.sleep).run()
    assert report.counts["dry_run"] == Counter({FaultKind.STALL: 1, FaultKind.SLOW: 1})
    assert _state(victim.pid) != "T" and victim.poll() is None
    assert not (tmp_path / CONTROL_FILE).exists()
    assert [json.loads(x)["phase"] for x in (tmp_path / CHAOS_FILE).read_text().splitlines()] == ["dry_run"] * 2


def test_dry_run_lists_link_faults_and_requests_nothing(tmp_path: Path):
    write_status(tmp_path, {0: 4242, 1: 4243})
    clock = SleepingClock()
    plan = bare_plan(dry_run=True, duration_s=10, timeline=[{"at_s": 1, "fault": "degrade_link", "learner": 0},
                                                            {"at_s": 2, "fault": "cut_link", "learner": 1,
                                                             "duration_s": 3}])  # fmt: skip
    report = Controller(plan, RunDirTarget(tmp_path), clock=clock, sleep=clock.sleep).run()
    assert report.counts["dry_run"] == Counter({FaultKind.DEGRADE_LINK: 1, FaultKind.CUT_LINK: 1}) and not report.fired
    assert not (tmp_path / CONTROL_FILE).exists()
    recorded = [json.loads(x) for x in (tmp_path / CHAOS_FILE).read_text().splitlines()]
    assert [(r["fault"], r["learner"], r["phase"], r["detail"]) for r in recorded] == [
        ("degrade_link", 0, "dry_run", "would link bandwidth /10, latency x10 for 30 s"),
        ("cut_link", 1, "dry_run", "would link cut for 3 s, messages held until it returns"),
    ]


def test_a_preemption_sigterms_and_sigkills_only_a_victim_still_there_at_the_end_of_its_notice(spawn, stray_pids):
    # One victim ignores SIGTERM (a learner that could not leave in time): the timer's SIGKILL ends it.
    # The other leaves on SIGTERM: the timer kills nothing (its pid, if reused, names another process).
    stubborn = spawn([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print(1, flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    stubborn.stdout.readline()  # its handler is in place
    polite = spawn(["sleep", "30"])
    started = time.monotonic()
    signals = ProcessSignals()
    stray_pids.append(signals.preempt(stubborn.pid, 0.6).pid)
    stray_pids.append(signals.preempt(polite.pid, 0.6).pid)
    assert polite.wait(timeout=5) == -signal.SIGTERM
    assert stubborn.wait(timeout=5) == -signal.SIGKILL and time.monotonic() - started >= 0.5
    with pytest.raises(TargetError, match="is gone"):
        signals.preempt(polite.pid, 1.0)
    with pytest.raises(ValueError, match="positive notice"):
        signals.preempt(os.getppid(), 0)


def test_node_agent_preempts_and_run_dir_target_asks_for_it(tmp_path: Path, spawn, stray_pids):
    from dlc.engine.supervision.agent import NodeAgentWorker

    victim = spawn(["sleep", "30"])
    assert NodeAgentWorker().preempt(victim.pid, 5.0)[1] == []
    assert victim.wait(timeout=5) == -signal.SIGTERM
    assert "is gone" in NodeAgentWorker().preempt(victim.pid, 5.0)[1][0]
    write_status(tmp_path, {1: 4321})
    RunDirTarget(tmp_path, clock=lambda: 7.0).preempt(1, 45.0)
    lines = [json.loads(x) for x in (tmp_path / CONTROL_FILE).read_text().splitlines()]
    assert lines == [{"t": 7.0, "op": "preempt", "learner": 1, "notice_s": 45.0, "pid": 4321}]
