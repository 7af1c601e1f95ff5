"""The driver's side of chaos's signals: each request reaches the agent on the right node, for the
process chaos saw, and a lost node takes every live learner on it. No Ray: the agents are fakes that
record what they were asked (the agent itself is tested on real processes in tests/unit/chaos/test_target.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dlc.engine.supervision.agent import Signals
from dlc.engine.supervision.chaos_log import ChaosLog
from dlc.engine.supervision.control import carry_out
from dlc.run import events
from dlc.run.files import CHAOS_FILE


class FakeAgents:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def on(self, node: str) -> Any:
        def method(name: str) -> Any:
            def remote(*args: Any) -> tuple[str, str]:
                self.calls.append((node, name, args))
                return node, name  # the "object ref" of the answer

            return SimpleNamespace(remote=remote)

        return SimpleNamespace(kill=method("kill"), stall=method("stall"))


def _written(said: list[events.Event]) -> Any:
    """A run directory's `event`, appending to `said`: each record checked as the real one checks it in tests."""

    def event(record: events.Event) -> None:
        assert events.wrong(record) is None, events.wrong(record)
        said.append(record)

    return event


def _signals(tmp_path: Path) -> tuple[Signals, FakeAgents, list[events.Event]]:
    said: list[events.Event] = []
    rundir = SimpleNamespace(path=tmp_path, event=_written(said))
    agents = FakeAgents()
    return Signals(rundir, ChaosLog(rundir), agents), agents, said  # type: ignore[arg-type]


LIVE = {
    0: {"pid": 100, "node_id": "a", "node": "10.0.0.1"},
    1: {"pid": 101, "node_id": "b", "node": "10.0.0.2"},
    2: {"pid": 102, "node_id": "a", "node": "10.0.0.1"},
}


def test_each_signal_goes_to_the_agent_on_its_targets_node(tmp_path: Path):
    signals, agents, said = _signals(tmp_path)
    signals.carry_out({"op": "kill", "learner": 1, "pid": 101}, LIVE, 900, "a")
    signals.carry_out({"op": "stall", "learner": 2, "pid": 102, "duration_s": 8.0}, LIVE, 900, "a")
    signals.carry_out({"op": "kill_node", "learner": 2, "node": "a", "t": 5.0}, LIVE, 900, "a")
    signals.carry_out({"op": "kill_syncer", "learner": None, "pid": 900}, LIVE, 900, "a")
    assert agents.calls == [
        ("b", "kill", ([101],)),
        ("a", "stall", (102, 8.0)),
        ("a", "kill", ([100, 102],)),  # every live learner on node a, at once
        ("a", "kill", ([900],)),  # the syncer, on the driver's node
    ]
    assert said == [events.NodeKilled(node_id="a", node="10.0.0.1", learners=[0, 2], pids=[100, 102])]
    # Their deaths are the lost node's in chaos.jsonl's outcomes, unless a later kill named them.
    assert [signals.chaos.death_fault(i) for i in (0, 1, 2)] == ["kill_node", "kill", "kill_node"]


def test_a_request_for_a_process_that_is_gone_or_replaced_is_not_carried_out(tmp_path: Path):
    signals, agents, said = _signals(tmp_path)
    signals.carry_out({"op": "kill", "learner": 1, "pid": 77}, LIVE, 900, "a")  # restarted since chaos looked
    signals.carry_out({"op": "stall", "learner": 5, "pid": 105, "duration_s": 1.0}, LIVE, 900, "a")
    signals.carry_out({"op": "kill_syncer", "learner": None, "pid": 899}, LIVE, 900, "a")
    assert agents.calls == []
    assert all(isinstance(e, events.ControlIgnored) for e in said)
    assert [e.reason for e in said] == [  # type: ignore[attr-defined]
        "learner 1 is not the process chaos saw (pid 101 now)",
        "learner 5 is not live",
        "the syncer is not the process chaos saw (pid 900 now)",
    ]


def test_each_answer_says_when_its_signal_went_out_or_why_it_could_not(tmp_path: Path, monkeypatch):
    signals, agents, said = _signals(tmp_path)
    signals.chaos.injected.update({("stall", 2): 100.0, ("kill", 1): 100.0})  # chaos asked at t = 100
    answers = {("a", "stall"): (103.25, []), ("b", "kill"): (100.5, ["process 101 is gone"])}
    monkeypatch.setattr("dlc.engine.supervision.agent.ray.wait", lambda refs, timeout: (refs, []))
    monkeypatch.setattr("dlc.engine.supervision.agent.ray.get", lambda ref: answers[ref])
    signals.carry_out({"op": "stall", "learner": 2, "pid": 102, "duration_s": 8.0}, LIVE, 900, "a")
    signals.carry_out({"op": "kill", "learner": 1, "pid": 101}, LIVE, 900, "a")
    signals.check()
    lines = [json.loads(x) for x in (tmp_path / CHAOS_FILE).read_text().splitlines()]
    # The stall went out 3.25 s after chaos asked (an agent still starting): its line has the agent's time.
    assert [(x["fault"], x["phase"], x["t"], x.get("after_s")) for x in lines] == [
        ("stall", "signalled", 103.25, 3.25),
        ("kill", "not_carried_out", lines[1]["t"], None),
    ]
    assert lines[1]["detail"] == "process 101 is gone" and signals._calls == []
    assert [type(e) for e in said] == [events.Chaos, events.ControlIgnored, events.Chaos]


class _Recorder:
    """An actor handle that records each `.method.remote(...)` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=lambda *args: self.calls.append((name, *args)))


def test_a_slow_or_link_request_is_carried_out_with_its_own_factor_and_one_without_is_ignored():
    learner, syncer, said = _Recorder(), _Recorder(), []
    supervisor = SimpleNamespace(
        slots={1: SimpleNamespace(handle=learner, view={})},
        live=lambda: [1],
        syncer=syncer,
        join_streams=0,
        rundir=SimpleNamespace(event=_written(said)),
    )
    carry_out({"op": "slow", "learner": 1, "factor": 3.0, "duration_s": None}, supervisor)
    carry_out({"op": "degrade_link", "learner": 1, "factor": 30.0, "duration_s": 12.0}, supervisor)
    carry_out({"op": "cut_link", "learner": 1, "duration_s": 5.0}, supervisor)
    assert learner.calls == [("set_slow", 3.0, float("inf")), ("impair_link", 30.0, 12.0), ("impair_link", None, 5.0)]
    assert syncer.calls == [("impair_link", 1, 30.0, 12.0), ("impair_link", 1, None, 5.0)]
    # The plan resolves every factor and duration: the engine has no defaults of its own to disagree with.
    for partial in (
        {"op": "slow", "learner": 1, "duration_s": 5.0},
        {"op": "degrade_link", "learner": 1, "duration_s": 5.0},
        {"op": "degrade_link", "learner": 1, "factor": 10.0},
        {"op": "cut_link", "learner": 1},
    ):
        carry_out(partial, supervisor)
    ignored = [e for e in said if isinstance(e, events.ControlIgnored)]
    assert len(ignored) == 4 and all("factor or duration missing" in e.reason for e in ignored)
    assert len(learner.calls) == 3
