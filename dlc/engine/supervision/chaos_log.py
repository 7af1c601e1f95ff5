"""What chaos did to the run, as the driver sees it: injections and requests read, outcomes written.

`dlc chaos` appends its injections to chaos.jsonl and its requests to control.jsonl; the supervisor
reads both each tick through `ChaosLog` (from the end: a previous run's lines are not for this one),
copies the injections to events.jsonl, and records each fault's observed outcome (detected,
restarted, recovered, ...) back in chaos.jsonl.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dlc.run import events
from dlc.run.files import CHAOS_FILE, CONTROL_FILE, JsonlTail, append_jsonl
from dlc.run.rundir import RunDir


class ChaosLog:
    """Reads fault injections from chaos.jsonl and control requests from control.jsonl; writes outcomes."""

    def __init__(self, rundir: RunDir) -> None:
        self.rundir = rundir
        self.chaos_path = rundir.path / CHAOS_FILE
        # From the end: lines a previous run of this directory wrote (before a resume) are not for
        # this driver, and a kill or a stall carried out twice would be a fault nobody asked for.
        self._chaos = JsonlTail(self.chaos_path, _size(self.chaos_path))
        self._control = JsonlTail(rundir.path / CONTROL_FILE, _size(rundir.path / CONTROL_FILE))
        self.injected: dict[tuple[str, int | None], float] = {}

    def requests(self) -> list[dict[str, Any]]:
        """New injections are copied to events.jsonl; new control requests are returned."""
        for entry in self._chaos.read() or []:
            if entry.get("phase") in ("injected", "refused", "dry_run"):
                self.rundir.event(events.Chaos.of(entry))
                if entry.get("phase") == "injected":
                    self.injected[(str(entry.get("fault")), entry.get("learner"))] = float(entry.get("t", time.time()))
        return self._control.read() or []

    def note_victims(self, fault: str, learners: list[int], t: float) -> None:
        """A fault the driver carried out on several learners (kill_node): outcomes are recorded for each."""
        for learner in learners:
            self.injected[(fault, learner)] = t

    def death_fault(self, learner: int) -> str:
        """The fault that ended `learner`'s process, as chaos named it: the latest of kill, kill_node (its node
        was killed) and preempt (its notice ran out) injected on it; kill when chaos injected none."""
        # On a tie the first of this order wins: a learner killed with its node was lost with the node.
        times = {fault: self.injected.get((fault, learner)) for fault in ("kill_node", "preempt", "kill")}
        known = {fault: t for fault, t in times.items() if t is not None}
        return max(known, key=lambda fault: known[fault]) if known else "kill"

    def since(self, fault: str, learner: int | None) -> float | None:
        t = self.injected.get((fault, learner))
        return None if t is None else round(time.time() - t, 3)

    def outcome(self, fault: str, learner: int | None, phase: str, at: float | None = None, **extra: Any) -> None:
        """Record what was observed after a fault (only for faults that chaos injected). `at`: when it
        happened, if not now; its line then says `after_s`, the seconds since the injection."""
        if (fault, learner) not in self.injected:
            return
        if at is not None:
            extra = {"after_s": round(at - self.injected[(fault, learner)], 3), **extra}
        entry = {
            "t": round(time.time() if at is None else at, 3),
            "fault": fault,
            "target": f"learner {learner}",
            "learner": learner,
            "phase": phase,
            **extra,
        }
        append_jsonl(self.chaos_path, entry)
        self.rundir.event(events.Chaos.of(entry))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
