"""Stand-ins for what a test must not wait for or start: a clock that moves when told, a Ray actor
method called in-process, and a run of learners for chaos to act on."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chaos.target import LearnerInfo, TargetError


@dataclass
class Direct:
    """A fake Ray actor method: `.remote(x)` calls the function now and returns its result (no ref)."""

    fn: Callable[..., Any]

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeClock:
    """Seconds that move only when a test sets `now`; starts at 0."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SleepingClock(FakeClock):
    """A FakeClock with `sleep`: time moves only when the controller sleeps."""

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, "the controller must never spin without sleeping"
        self.now += seconds
        assert self.now < 10_000, "the controller did not stop"


class FakeTarget:
    """A run of learners whose states follow a script of (at_s, learner, state); records every call."""

    def __init__(self, clock: SleepingClock, learners: int = 4, quorum: int = 1) -> None:
        self.clock = clock
        self.states = {i: "training" for i in range(learners)}
        self.script: list[tuple[float, int, str]] = []
        self.pids = {i: 1000 + i for i in range(learners)}
        self.nodes: dict[int, str | None] = {i: None for i in range(learners)}  # Ray node ids, when a test sets them
        self.pid_script: list[tuple[float, int, int]] = []  # (at_s, learner, its new process id)
        self.quorum_value = quorum
        self.running_until = math.inf
        self.calls: list[tuple[Any, ...]] = []
        self.records: list[dict[str, Any]] = []
        self.fail_kill = False

    def learners(self) -> list[LearnerInfo]:
        for at, learner, state in self.script:
            if at <= self.clock.now:
                self.states[learner] = state
        self.script = [s for s in self.script if s[0] > self.clock.now]
        for at, learner, pid in self.pid_script:
            if at <= self.clock.now:
                self.pids[learner] = pid
        return [LearnerInfo(i, self.pids[i], s, self.nodes.get(i)) for i, s in sorted(self.states.items())]

    def quorum(self) -> int:
        return self.quorum_value

    def running(self) -> bool:
        return self.clock.now < self.running_until

    def kill(self, learner: int) -> None:
        if self.fail_kill:
            raise TargetError(f"process {1000 + learner} is gone")
        self.calls.append(("kill", learner))

    def stall(self, learner: int, seconds: float) -> None:
        self.calls.append(("stall", learner, seconds))

    def slow(self, learner: int, factor: float, seconds: float | None) -> None:
        self.calls.append(("slow", learner, factor, seconds))

    def join(self, seconds: float | None = None) -> None:
        self.calls.append(("join", seconds))

    def leave(self, learner: int) -> None:
        self.calls.append(("leave", learner))

    def kill_syncer(self) -> None:
        self.calls.append(("kill_syncer",))

    def kill_node(self, learner: int) -> None:
        self.calls.append(("kill_node", learner))

    def degrade_link(self, learner: int, factor: float, seconds: float) -> None:
        self.calls.append(("degrade_link", learner, factor, seconds))

    def cut_link(self, learner: int, seconds: float) -> None:
        self.calls.append(("cut_link", learner, seconds))

    def preempt(self, learner: int, notice_s: float) -> None:
        self.calls.append(("preempt", learner, notice_s))

    def record(self, entry: dict[str, Any]) -> None:
        self.records.append(entry)
