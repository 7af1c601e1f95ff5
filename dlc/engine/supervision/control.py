"""The driver's side of chaos: what `dlc chaos` injected and asked for, and what came of it.

`dlc chaos` (in-process or from another terminal) appends injections to chaos.jsonl and requests
(kill, stall, preempt, kill_node, kill_syncer, slow, join, leave, links) to control.jsonl. Each supervisor
tick carries the new requests out (`carry_out`: signals through the agent on the target's node,
`dlc.engine.supervision.agent`; calls of the learners and the syncer for the rest), and the supervisor records
each fault's observed outcome (detected, restarted, recovered, ...) back in chaos.jsonl
(`dlc.engine.supervision.chaos_log`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from chaos.faults import lacking
from dlc.engine.supervision.agent import Signals
from dlc.run import events
from dlc.run.rundir import RunDir


class Controlled(Protocol):
    """What carrying out a request uses of the supervisor."""

    slots: dict[int, Any]  # index -> its slot: `.view` (the learner's last snapshot), `.handle` (its actor)
    signals: Signals
    syncer: Any  # the syncer's actor handle
    syncer_pid: int | None
    syncer_node: str | None
    rundir: RunDir
    join_streams: list[Any]  # streams no learner has read: one for each joiner

    def live(self) -> dict[int, Any]: ...
    def leave(self, index: int) -> None: ...
    def join(self, duration_s: float | None) -> None: ...


def carry_out(request: dict[str, Any], supervisor: Controlled) -> None:
    """Carry out one request of control.jsonl on the run's learners; one it cannot is a `control_ignored` event."""
    op, i = request.get("op"), request.get("learner")
    slot = supervisor.slots.get(i) if i is not None else None
    live = supervisor.live()
    if op in ("kill", "stall", "preempt", "kill_node", "kill_syncer"):
        views = {j: supervisor.slots[j].view for j in live}
        supervisor.signals.carry_out(request, views, supervisor.syncer_pid, supervisor.syncer_node)
    # A request without a setting its fault needs (`lacking`) is ignored, never given a default of the engine's own.
    elif op == "slow" and slot is not None and i in live and lacking(request) is None:
        duration = request.get("duration_s")
        seconds = float("inf") if duration is None else float(duration)  # None: until the run ends
        slot.handle.set_slow.remote(float(request["factor"]), seconds)
        supervisor.rundir.event(
            events.LearnerSlowed(learner=i, factor=float(request["factor"]), duration_s=request.get("duration_s"))
        )
    elif op in ("degrade_link", "cut_link") and slot is not None and i in live and lacking(request) is None:
        factor = float(request["factor"]) if op == "degrade_link" else None
        seconds = float(request["duration_s"])
        slot.handle.impair_link.remote(factor, seconds)  # the uplink
        supervisor.syncer.impair_link.remote(i, factor, seconds)  # the downlink
        supervisor.rundir.event(
            events.LinkCut(learner=i, duration_s=seconds)
            if factor is None
            else events.LinkDegraded(learner=i, factor=factor, duration_s=seconds)
        )
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
        supervisor.rundir.event(events.ControlIgnored(request=request, reason=reason))


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
    rundir.event(events.ChaosStarted(plan=plan.summary()))
    return controller, stop
