"""The controller: fires a plan's schedule at a Target, behind guardrails, and records every decision.

Guardrails are applied when a fault is due, in this order: warm-up, minimum gap since the last
fault, faults in flight, the target learner (exists, healthy, nothing else in flight on it), quorum.
A refused fault is recorded with its reason and dropped. Clock, sleep and randomness are injected,
so tests drive it with a fake clock; `stop()` (or the `stop` Event) ends it early from another thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.faults import Fault, FaultKind
from chaos.plan import Plan
from chaos.schedule import schedule
from chaos.target import LearnerInfo, Target, TargetError
from dlc.run.files import GONE_STATES

INJECTED, REFUSED, DRY_RUN, FAILED = "injected", "refused", "dry_run", "failed"


@dataclass
class Report:
    """What the controller did: counts per phase and kind, every record it wrote, and why it stopped."""

    counts: dict[str, Counter[FaultKind]] = field(
        default_factory=lambda: {p: Counter() for p in (INJECTED, REFUSED, DRY_RUN, FAILED)}
    )
    entries: list[dict[str, Any]] = field(default_factory=list)
    stopped_because: str = ""

    @property
    def fired(self) -> Counter[FaultKind]:
        return self.counts[INJECTED]

    @property
    def refused(self) -> Counter[FaultKind]:
        return self.counts[REFUSED]

    def table(self) -> list[list[str]]:
        """Rows (kind, injected, refused, dry run, failed) for the kinds that came up, then a total."""
        phases = (INJECTED, REFUSED, DRY_RUN, FAILED)
        rows = [
            [kind.value, *(str(self.counts[p][kind]) for p in phases)]
            for kind in FaultKind
            if any(self.counts[p][kind] for p in phases)
        ]
        return [*rows, ["total", *(str(sum(self.counts[p].values())) for p in phases)]]


@dataclass
class _InFlight:
    fault: Fault
    learner: int | None
    ends_at_s: float | None  # None: until the controller stops
    victims: dict[int, int | None] = field(default_factory=dict)  # a kill: learner -> the process it killed
    down: set[int] = field(default_factory=set)  # a kill: victims seen unhealthy since
    back: set[int] = field(default_factory=set)  # a kill: victims training again since

    def learners(self) -> set[int]:
        """The learners this fault occupies: its victims (a lost node's are several), or its one learner."""
        return set(self.victims) or ({self.learner} if self.learner is not None else set())


class Controller:
    """Runs one plan against one target. Call `run()` (in any thread); `stop()` ends it early."""

    def __init__(
        self,
        plan: Plan,
        target: Target,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        rng: random.Random | None = None,
        stop: threading.Event | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 0.5,
        start_wait_s: float = 60.0,
    ) -> None:
        self.plan = plan
        self.target = target
        self.clock = clock
        self.stop_event = stop or threading.Event()
        self.sleep = sleep or self.stop_event.wait  # wakes at once when stopped
        self.rng = rng or random.Random(plan.seed)
        self.on_record = on_record
        self.poll_s = poll_s
        self.start_wait_s = start_wait_s
        self.report = Report()
        self._origin = 0.0
        self._in_flight: list[_InFlight] = []
        self._last_fired_s: float | None = None

    def stop(self) -> None:
        self.stop_event.set()

    def elapsed_s(self) -> float:
        return self.clock() - self._origin

    def run(self) -> Report:
        """Inject until the plan's duration ends, the schedule runs out, the run finishes, or stop()."""
        learners = self._wait_for_learners()
        if learners is None:
            return self.report
        self._origin = self.clock()
        ids = [info.id for info in learners if info.state not in GONE_STATES]
        for fault in schedule(self.plan, ids, self.rng):
            if not self._wait_until(fault.at_s):
                return self.report
            self._fire(fault)
        self.report.stopped_because = "no faults left in the plan"
        return self.report

    # -- waiting -----------------------------------------------------------------------------

    def _should_stop(self) -> str | None:
        if self.stop_event.is_set():
            return "stopped"
        if not self.target.running():
            return "the run is not running"
        return None

    def _wait_for_learners(self) -> list[LearnerInfo] | None:
        """The chaos clock starts once every listed learner trains, or start_wait_s after one is listed."""
        first_seen: float | None = None
        while True:
            if reason := self._should_stop():
                self.report.stopped_because = reason
                return None
            learners = self.target.learners()
            if learners:
                first_seen = self.clock() if first_seen is None else first_seen
                if all(info.healthy for info in learners) or self.clock() - first_seen >= self.start_wait_s:
                    return learners
            self.sleep(self.poll_s)

    def _wait_until(self, at_s: float) -> bool:
        """Sleep until ``at_s`` on the chaos clock, watching the run; False when it is time to stop."""
        while True:
            if reason := self._should_stop():
                self.report.stopped_because = reason
                return False
            now = self.elapsed_s()
            if self.plan.duration_s is not None and now >= self.plan.duration_s:
                self.report.stopped_because = f"duration_s={self.plan.duration_s:g} ended"
                return False
            self._settle(self.target.learners(), now)
            if now >= at_s:
                return True
            self.sleep(min(self.poll_s, at_s - now))

    def _settle(self, learners: list[LearnerInfo], now: float) -> None:
        """Drop the faults that are no longer in flight."""
        states = {info.id: info.state for info in learners}
        pids = {info.id: info.pid for info in learners}
        keep = []
        for f in self._in_flight:
            if f.ends_at_s is not None and now >= f.ends_at_s:
                continue
            state = states.get(f.learner) if f.learner is not None else None
            if f.fault.kind.is_kill:
                for j, pid in f.victims.items():
                    now_state = states.get(j)
                    if now_state is not None and now_state not in ("training", "slow"):
                        f.down.add(j)
                    elif j in f.down or (now_state is not None and pid is not None and pids.get(j) != pid):
                        # Trains again after having been down, or in a new process: recovered (a hot
                        # spare can be back between two polls, never seen down).
                        f.back.add(j)
                if f.victims and f.back >= set(f.victims):
                    continue
            if f.fault.kind is FaultKind.LEAVE and (state is None or state in GONE_STATES):
                continue
            keep.append(f)
        self._in_flight = keep

    # -- firing ------------------------------------------------------------------------------

    def _fire(self, fault: Fault) -> None:
        now = self.elapsed_s()
        learners = self.target.learners()
        reason = self._refusal(fault, now, learners)
        pid = next((info.pid for info in learners if info.id == fault.learner), None)
        if reason is not None:
            self._record(fault, now, REFUSED, reason)
            return
        victims = {x.id: x.pid for x in _victims(fault, learners)} if fault.kind.is_kill else {}
        signalled = (FaultKind.KILL, FaultKind.STALL, FaultKind.PREEMPT)
        detail = fault.describe() + (f" (pid {pid})" if fault.kind in signalled else "")
        if fault.kind is FaultKind.KILL_NODE:
            detail += ": learners " + ", ".join(f"{j} (pid {p})" for j, p in sorted(victims.items()))
        if self.plan.dry_run:
            self._record(fault, now, DRY_RUN, f"would {detail}")
        else:
            try:
                fault.inject(self.target)
            except (TargetError, OSError) as exc:
                self._record(fault, now, FAILED, str(exc))
                return
            self._record(fault, now, INJECTED, detail)
        self._last_fired_s = now
        self._in_flight.append(_InFlight(fault, fault.learner, self._ends_at(fault, now), victims=victims))

    def _ends_at(self, fault: Fault, now: float) -> float | None:
        if fault.kind.has_duration:
            return None if fault.duration_s is None else now + fault.duration_s
        return now + self.plan.in_flight_max_s

    def _refusal(self, fault: Fault, now: float, learners: list[LearnerInfo]) -> str | None:
        """Why the fault may not fire now, or None."""
        plan = self.plan
        if now < plan.warmup_s:
            return f"in the warm-up ({now:.1f} s < warmup_s={plan.warmup_s:g})"
        if self._last_fired_s is not None and now - self._last_fired_s < plan.min_gap_s:
            return f"{now - self._last_fired_s:.1f} s since the last fault < min_gap_s={plan.min_gap_s:g}"
        if len(self._in_flight) >= plan.max_concurrent:
            busy = ", ".join(f"{f.fault.kind.value} on {f.fault.target_name}" for f in self._in_flight)
            return f"{len(self._in_flight)} fault(s) in flight ({busy}), max_concurrent={plan.max_concurrent}"
        if not fault.kind.needs_learner:
            return None
        info = next((x for x in learners if x.id == fault.learner), None)
        if info is None:
            have = ", ".join(str(x.id) for x in learners) or "none"
            return f"the run has no learner {fault.learner} (learners: {have})"
        hit = {x.id for x in _victims(fault, learners)}
        for j in sorted(hit, key=lambda j: (j != fault.learner, j)):  # its own learner first
            busy_here = next((f for f in self._in_flight if j in f.learners()), None)
            if busy_here is not None:
                return f"learner {j} already has a {busy_here.fault.kind.value} in flight"
        if not info.healthy:
            return f"learner {fault.learner} is {info.state}, not training"
        if fault.kind.takes_learner_out and not plan.allow_below_quorum:
            out = set().union(*(f.learners() for f in self._in_flight if f.fault.kind.takes_learner_out))
            healthy = [x.id for x in learners if x.healthy and x.id not in out]
            left = len([j for j in healthy if j not in hit])
            quorum = self.target.quorum()
            if left < quorum:
                return (
                    f"would leave {left} healthy learner(s), below quorum {quorum} "
                    "(set allow_below_quorum: true to allow it)"
                )
        return None

    def _record(self, fault: Fault, now: float, phase: str, detail: str) -> None:
        entry: dict[str, Any] = {
            "fault": fault.kind.value,
            "target": "syncer" if fault.kind is FaultKind.KILL_SYNCER else fault.target_name,
            "learner": fault.learner,
            "phase": phase,
            "detail": detail,
            "at_s": round(now, 3),
            "origin": fault.origin,
        }
        if fault.kind.has_duration:
            entry["duration_s"] = fault.duration_s
        if fault.factor is not None:
            entry["factor"] = fault.factor
        if fault.notice_s is not None:
            entry["notice_s"] = fault.notice_s
        self.report.counts[phase][fault.kind] += 1
        self.report.entries.append(entry)
        self.target.record(entry)
        if self.on_record is not None:
            self.on_record(entry)


def _victims(fault: Fault, learners: list[LearnerInfo]) -> list[LearnerInfo]:
    """The learners a fault takes out: its own, or for kill_node every live learner on that learner's node."""
    own = next((x for x in learners if x.id == fault.learner), None)
    if own is None:
        return []
    if fault.kind is not FaultKind.KILL_NODE or own.node is None:
        return [own]
    return [x for x in learners if x.node == own.node and x.state not in GONE_STATES]


def run(plan: Plan, target: Target, **options: Any) -> Report:
    """Run ``plan`` against ``target`` until it is done; options as for `Controller`."""
    return Controller(plan, target, **options).run()
