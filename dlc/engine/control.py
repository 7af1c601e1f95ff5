"""The driver's side of chaos: what `dlc chaos` injected and asked for, and what came of it.

`dlc chaos` (in-process or from another terminal) appends injections to chaos.jsonl and requests
(kill, stall, preempt, kill_node, kill_syncer, slow, join, leave, links) to control.jsonl. Each supervisor
tick carries the new requests out (`carry_out`: signals through the agent on the target's node,
`dlc.engine.agent`; calls of the learners and the syncer for the rest), and the supervisor records
each fault's observed outcome (detected, restarted, recovered, ...) back in chaos.jsonl (`ChaosLog`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlc.run.files import CHAOS_FILE, CONTROL_FILE, JsonlTail, append_jsonl
from dlc.run.rundir import RunDir

if TYPE_CHECKING:
    from dlc.engine.supervisor import Supervisor


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
                self.rundir.event("chaos", **{k: v for k, v in entry.items() if k != "t"})
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

    def outcome(self, fault: str, learner: int | None, phase: str, **extra: Any) -> None:
        """Record what was observed after a fault (only for faults that chaos injected)."""
        if (fault, learner) not in self.injected:
            return
        entry = {
            "t": round(time.time(), 3),
            "fault": fault,
            "target": f"learner {learner}",
            "learner": learner,
            "phase": phase,
            **extra,
        }
        append_jsonl(self.chaos_path, entry)
        self.rundir.event("chaos", **{k: v for k, v in entry.items() if k != "t"})


def carry_out(request: dict[str, Any], supervisor: Supervisor) -> None:
    """Carry out one request of control.jsonl on the run's learners; one it cannot is a `control_ignored` event."""
    op, i = request.get("op"), request.get("learner")
    slot = supervisor.slots.get(i) if i is not None else None
    live = supervisor.live()
    if op in ("kill", "stall", "preempt", "kill_node", "kill_syncer"):
        views = {j: supervisor.slots[j].view for j in live}
        supervisor.signals.carry_out(request, views, supervisor.syncer_pid, supervisor.syncer_node)
    # The chaos plan resolves every factor and duration (its defaults are the only ones): a request
    # without what its fault needs is ignored, never given a default of the engine's own.
    elif op == "slow" and slot is not None and i in live and request.get("factor"):
        duration = request.get("duration_s")
        seconds = float("inf") if duration is None else float(duration)  # None: until the run ends
        slot.handle.set_slow.remote(float(request["factor"]), seconds)
        supervisor.rundir.event(
            "learner_slowed", learner=i, factor=request.get("factor"), duration_s=request.get("duration_s")
        )
    elif op in ("degrade_link", "cut_link") and slot is not None and i in live and _link_fault_given(request):
        factor = float(request["factor"]) if op == "degrade_link" else None
        seconds = float(request["duration_s"])
        slot.handle.impair_link.remote(factor, seconds)  # the uplink
        supervisor.syncer.impair_link.remote(i, factor, seconds)  # the downlink
        supervisor.rundir.event("link_degraded" if factor else "link_cut", learner=i, factor=factor, duration_s=seconds)
    elif op == "leave" and slot is not None and i in live:
        supervisor.leave(i)
    elif op == "join" and supervisor.join_streams:
        supervisor.join(request.get("duration_s"))
    else:
        reason = (
            "no data stream left for a joiner"
            if op == "join"
            else "unknown op, learner not live, or the fault's factor or duration missing"
        )
        supervisor.rundir.event("control_ignored", request=request, reason=reason)


def _link_fault_given(request: dict[str, Any]) -> bool:
    """A link fault's request names its duration, and a degrade_link its factor too."""
    return bool(request.get("duration_s")) and (request["op"] == "cut_link" or bool(request.get("factor")))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def start_chaos(plan: Any, rundir: RunDir, message: Callable[[str], None]) -> tuple[Any, threading.Event]:
    """Run a chaos plan in a thread, acting on this run through its run directory as `dlc chaos` would.

    Returns the controller and the event that stops it.
    """
    from chaos import Controller, RunDirTarget

    stop = threading.Event()
    controller = Controller(
        plan,
        RunDirTarget(rundir.path),
        stop=stop,
        on_record=lambda e: message(
            f"chaos: {e.get('phase')} {e.get('fault')} {e.get('target', '')} {e.get('detail', '')}".rstrip()
        ),
    )
    thread = threading.Thread(target=controller.run, name="chaos", daemon=True)
    thread.start()
    rundir.event("chaos_started", plan=plan.summary())
    return controller, stop
