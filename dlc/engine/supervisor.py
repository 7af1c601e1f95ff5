"""Keeps the learners alive: polls them, notices deaths and stalls, restarts and rejoins them.

Ray notices a killed process (the actor's next call fails) but never a frozen one, so a learner
that has not answered a poll for `heartbeat_timeout_s` is shown `stalled` until it answers
again. A dead learner is replaced by a new actor of the same index, which copies parameters,
AdamW state, step and data position from a healthy peer (the peer keeps training; it copies
its state at a step boundary), or starts from the syncer's global fragments when no peer is
healthy, and then rejoins the syncer as a new incarnation. Every step of that is an event,
and the observed outcome of each chaos fault goes to chaos.jsonl.

Chaos's kills, stalls and lost nodes arrive as requests (control.jsonl) and are carried out by the
agent on the target's node (`dlc.engine.agent`), which signals the process there.

With `learners.spares: N`, N hot spares (`dlc.engine.spares`) wait beside the learners: a dead
learner's slot is taken over by a ready spare, which skips the process start and the compilation.
"""

from __future__ import annotations

import contextlib
import string
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from dlc.config.schema import Recipe
from dlc.engine.agent import Agents, Signals
from dlc.engine.control import ChaosLog
from dlc.engine.spares import SparePool
from dlc.errors import UserError
from dlc.observe.goodput import STATE_BUCKET, Ledger
from dlc.run.files import HEALTHY_STATES
from dlc.run.rundir import RunDir

MAX_RESTART_ATTEMPTS = 3  # new processes for one death, each lost before it was ready, before the run fails


# Events said on the console as they happen: a death, a stall, and the recovery of each.
TOLD = {
    "learner_died": "learner {learner} died at step {step}",
    "learner_stalled": "learner {learner} silent for {silent_s:.1f} s: stalled; the rounds go on without it",
    "learner_thawed": "learner {learner} answers again, after {silent_s:.1f} s of silence",
    "learner_recovered": "learner {learner} back: pushing again {after_s:.1f} s after it died",
    "learner_lost": "learner {learner} lost: {reason}",
}


class _Told(string.Formatter):
    """The console's lines: a field the event does not know (None) reads "?", whatever its format."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        return "?" if value is None else super().format_field(value, format_spec)


_TOLD_FORMAT = _Told()


@dataclass
class Recovery:
    """A learner being brought back: restarting -> rejoining (copying state) -> registering (with
    the syncer) -> awaiting its first push."""

    phase: str
    actor: Any
    ref: Any
    died_at: float
    restarted_at: float | None = None
    peer: int | None = None
    spare: bool = False  # a hot spare took the slot over
    data_position: int = 0  # where the learner had got to in its own stream: the new process goes on from there
    attempts: int = 1  # processes started for this recovery (one died with its node: another is tried)
    step: int = 0  # the dead process's last reported step: where a start from the global model goes on


@dataclass
class LearnerSlot:
    handle: Any
    stream: Any  # ObjectRef of the learner's byte stream
    view: dict[str, Any] = field(default_factory=dict)
    override: str | None = None  # dead / restarting / rejoining / stalled / left, over the learner's own state
    last_seen: float = field(default_factory=time.monotonic)
    poll: Any = None
    recovery: Recovery | None = None
    awaiting_first_push: float | None = None  # wall time of the death, until a push is accepted
    death_fault: str = "kill"  # what chaos called the fault that killed it last: kill or kill_node
    leave_at: float | None = None  # a joined learner retires at this monotonic time
    ticked_at: float = field(default_factory=time.monotonic)  # the ledger has filed time up to here
    # Of the learner's own counters of time its loop was blocked (waiting_s, checkpoint_s), what the
    # ledger has filed; a new process counts from zero.
    blocked_filed: dict[str, float] = field(default_factory=dict)
    finished: bool = False


class Supervisor:
    def __init__(
        self,
        recipe: Recipe,
        rundir: RunDir,
        syncer: Any,
        make_learner: Any,
        join_streams: list[Any],
        make_spare: Any = None,
        agents: Agents | None = None,
        syncer_node: str | None = None,
        feasible: Callable[[int], str | None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.recipe = recipe
        self.rundir = rundir
        self.say = say  # a line on the console (above the live view, or in the log)
        self.syncer = syncer
        self.make_learner = make_learner  # (index, stream_ref, incarnation) -> actor handle
        self.slots: dict[int, LearnerSlot] = {}
        self.join_streams = list(join_streams)  # ObjectRefs of streams no learner has read
        self.spares = SparePool(recipe, rundir, make_spare)
        self.restarts: Counter[int] = Counter()
        self.dead_tokens: Counter[int] = Counter()  # tokens trained by incarnations that died
        self.ledger = Ledger()
        self.failure: str | None = None
        self.chaos = ChaosLog(rundir)
        self.signals = Signals(rundir, self.chaos, agents or Agents())
        self.syncer_node = syncer_node  # where the syncer runs: the driver's node
        self.feasible = feasible  # (index) -> None, or why no live node can hold that learner now
        self.syncer_pid: int | None = None  # the driver keeps it current

    def _event(self, kind: str, **fields: Any) -> None:
        """Record the event; say the ones a person watching the console wants to see at once."""
        self.rundir.event(kind, **fields)
        line = TOLD.get(kind)
        if line is not None and self.say is not None:
            self.say(_TOLD_FORMAT.format(line, **fields))

    # -- membership ------------------------------------------------------------------------

    def add(self, index: int, handle: Any, stream: Any, pid: int, since: float) -> None:
        """A learner of the run; its allocation (and start-up time) began at monotonic time `since`."""
        self.slots[index] = LearnerSlot(handle, stream, view={"id": index, "state": "starting", "pid": pid})
        self.ledger.tick(index, "starting", time.monotonic() - since)

    def live(self) -> dict[int, Any]:
        """Handles of learners that are neither dead, recovering nor gone."""
        return {
            i: s.handle for i, s in self.slots.items() if s.override not in ("dead", "restarting", "rejoining", "left")
        }

    def state_of(self, index: int) -> str:
        slot = self.slots[index]
        return slot.override or slot.view.get("state", "starting")

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i, slot in sorted(self.slots.items()):
            goodput = self.ledger.goodput(i)
            out.append(
                {
                    **slot.view,
                    "id": i,
                    "state": self.state_of(i),
                    "restarts": self.restarts[i],
                    "tokens": slot.view.get("tokens", 0) + self.dead_tokens[i],
                    "goodput": None if goodput is None else round(goodput, 4),
                }
            )
        return out

    # -- the tick ----------------------------------------------------------------------------

    def tick(self, absorb: Any) -> None:
        """Poll, detect, advance recoveries, fill the ledger. `absorb(i, result)` logs a poll."""
        now = time.monotonic()
        # Chaos lines first: a kill injected and detected within one tick must already be known
        # as injected when its outcome is recorded. Requests are carried out before the polls, so
        # a signal is on its way while this tick works (the driver's next tick comes early then).
        for request in self.chaos.requests():
            self._carry_out(request)
        self._poll(absorb, now)
        self.spares.poll()
        self.failure = self.failure or self.spares.failure
        self._advance_recoveries()
        self.signals.check()
        for i, slot in self.slots.items():
            if slot.leave_at is not None and now >= slot.leave_at and i in self.live():
                self._carry_out({"op": "leave", "learner": i})
        self.file_time()

    def forgive_silence(self) -> None:
        """After the driver itself was busy (a syncer restart), no learner has been silent."""
        now = time.monotonic()
        for slot in self.slots.values():
            slot.last_seen = max(slot.last_seen, now)

    def file_time(self) -> None:
        """File each learner's time since the last call under its current state's bucket."""
        now = time.monotonic()
        for i, slot in self.slots.items():
            state, dt = self.state_of(i), now - slot.ticked_at
            if STATE_BUCKET.get(state) == "productive":
                # A training learner whose loop was blocked: on the network or on others (dp, diloco;
                # any learner copying its state for a peer), or writing a checkpoint.
                for counter, blocked_state in (("waiting_s", "waiting"), ("checkpoint_s", "checkpointing")):
                    blocked = slot.view.get(counter, 0.0) - slot.blocked_filed.get(counter, 0.0)
                    blocked = min(max(blocked, 0.0), dt)
                    slot.blocked_filed[counter] = slot.blocked_filed.get(counter, 0.0) + blocked
                    self.ledger.tick(i, blocked_state, blocked)
                    dt -= blocked
            self.ledger.tick(i, state, dt)
            slot.ticked_at = now
        self.spares.file_time(self.ledger, now)

    def _poll(self, absorb: Any, now: float) -> None:
        timeout = self.recipe.syncer.heartbeat_timeout_s
        for i, slot in self.slots.items():
            if slot.override in ("dead", "restarting", "rejoining", "left"):
                continue
            if slot.poll is None:
                slot.poll = slot.handle.poll.remote()
            ready, _ = ray.wait([slot.poll], timeout=0)
            if not ready:
                if now - slot.last_seen > timeout and slot.override != "stalled":
                    slot.override = "stalled"
                    self._event("learner_stalled", learner=i, silent_s=round(now - slot.last_seen, 2))
                    self.chaos.outcome("stall", i, "detected", after_s=self.chaos.since("stall", i))
                continue
            ref, slot.poll = slot.poll, None
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError:
                self._on_death(i)
                continue
            if slot.override == "stalled":
                slot.override = None
                self._event("learner_thawed", learner=i, silent_s=round(now - slot.last_seen, 2))
                self.chaos.outcome("stall", i, "recovered", after_s=self.chaos.since("stall", i))
            slot.last_seen = now
            slot.view = result["snapshot"]
            if slot.view.get("state") == "finished" and not slot.finished:
                slot.finished = True
                self.rundir.event("learner_finished", learner=i, step=slot.view.get("step"))
            absorb(i, result)
            if result["error"]:
                self.failure = f"learner {i} failed:\n{result['error']}"

    def note_syncer_events(self, events: list[dict[str, Any]]) -> None:
        """First accepted push after a rejoin; wasted time for rejected pushes."""
        fragments = max(self.recipe.syncer.fragments, 1)
        for event in events:
            slot = self.slots.get(event.get("learner", -1))
            if slot is None:
                continue
            if event["kind"] == "push_accepted" and slot.awaiting_first_push is not None:
                after = time.time() - slot.awaiting_first_push
                self._event("learner_recovered", learner=event["learner"], after_s=round(after, 3))
                fault = slot.death_fault
                self.chaos.outcome(
                    fault, event["learner"], "first_push", after_s=self.chaos.since(fault, event["learner"])
                )
                slot.awaiting_first_push = None
            elif event["kind"] == "push_rejected":
                # A push carries its share of the model (1/P for a fragment) of the progress of its steps.
                share = event.get("share", 1.0 / fragments)
                self.ledger.waste(event["learner"], event.get("steps", 0) * self._step_s(slot) * share)

    @staticmethod
    def _step_s(slot: LearnerSlot) -> float:
        rate = slot.view.get("tokens_per_s") or 0.0
        per_step = slot.view.get("tokens_per_step") or 0
        return per_step / rate if rate > 0 else 0.0

    # -- death and rejoin --------------------------------------------------------------------

    def _on_death(self, i: int) -> None:
        slot = self.slots[i]
        slot.override = "dead"
        # Progress not yet pushed died with the process: mean steps since each fragment's push.
        self.ledger.waste(i, slot.view.get("unpushed_steps", 0.0) * self._step_s(slot))
        # Its position in its own stream as last reported (every poll): what it read after that
        # died unpushed with it, so the new process reads it again rather than skipping it.
        position = int(slot.view.get("data_position") or 0)
        step = int(slot.view.get("step") or 0)
        self._event(
            "learner_died", learner=i, step=slot.view.get("step"), pid=slot.view.get("pid"), data_position=position
        )
        self.dead_tokens[i] += slot.view.get("tokens", 0)
        slot.view = {**slot.view, "tokens": 0, "tokens_per_s": 0.0, "phase": "starting process"}
        fault = slot.death_fault = self.chaos.death_fault(i)
        self.chaos.outcome(fault, i, "detected", after_s=self.chaos.since(fault, i))
        self.syncer.leave.remote(i)
        incarnation = self.restarts[i] + 1
        spare = self.spares.take(i)
        lost = self.feasible(i) if spare is None and self.feasible is not None else None
        if lost is not None:
            self._retire(i, lost, fault)
            return
        if spare is not None:
            ref = spare.actor.take_slot.remote(i, slot.stream, incarnation)
            slot.recovery = Recovery(
                "restarting", spare.actor, ref, died_at=time.time(), spare=True, data_position=position, step=step
            )
            slot.view["phase"] = f"spare {spare.name} taking over"
            self.rundir.event("spare_taken", spare=spare.name, learner=i, ready=spare.ready)
            self.spares.keep()
        else:
            actor = self.make_learner(i, slot.stream, incarnation)
            slot.recovery = Recovery(
                "restarting", actor, actor.ready.remote(), died_at=time.time(), data_position=position, step=step
            )
        slot.override = "restarting"
        self.restarts[i] += 1

    def _retire(self, i: int, reason: str, fault: str) -> None:
        """Learner `i` died and no live node can hold it (pinned by resources or labels to a node that is
        gone): a restart would wait forever for resources that never come. The run goes on without it."""
        slot = self.slots[i]
        slot.override, slot.recovery, slot.view["phase"] = "left", None, None
        self._event("learner_lost", learner=i, reason=reason)
        self.chaos.outcome(fault, i, "not_restarted", detail=reason)

    def _advance_recoveries(self) -> None:
        for i, slot in self.slots.items():
            rec = slot.recovery
            if rec is None:
                continue
            ready, _ = ray.wait([rec.ref], timeout=0)
            if not ready:
                continue
            try:
                result = ray.get(rec.ref)
            except ray.exceptions.RayError as exc:
                self._recovery_failed(i, slot, rec, exc)
                continue
            if rec.phase == "restarting":
                rec.restarted_at = time.time()
                self.rundir.event(
                    "learner_restarted",
                    learner=i,
                    pid=result,
                    after_s=round(rec.restarted_at - rec.died_at, 3),
                    spare=rec.spare,
                )
                fault = slot.death_fault
                self.chaos.outcome(fault, i, "restarted", after_s=self.chaos.since(fault, i), pid=result)
                slot.view = {**slot.view, "pid": result}
                self._copy_state(i, slot, rec)
            elif rec.phase == "rejoining":
                self.rundir.event("learner_rejoined", learner=i, **result)
                fault = slot.death_fault
                self.chaos.outcome(fault, i, "state_copied", after_s=self.chaos.since(fault, i), **result)
                rec.phase, rec.ref = "registering", self.syncer.rejoin.remote(i, rec.actor)
            elif rec.phase == "registering":
                rec.actor.set_syncer.remote(self.syncer)  # the syncer may have restarted meanwhile
                rec.actor.start.remote(None, None)
                slot.handle, slot.recovery, slot.override = rec.actor, None, None
                slot.blocked_filed = {}  # the new process counts from zero
                slot.last_seen = time.monotonic()
                slot.awaiting_first_push = rec.died_at

    def _copy_state(self, i: int, slot: LearnerSlot, rec: Recovery) -> None:
        """The new process copies a healthy peer's state, or the global model when none is healthy."""
        peer = self._healthy_peer(exclude=i)
        slot.view["phase"] = "copying state" + (f" from {peer}" if peer is not None else " from the syncer")
        rec.peer = peer
        if peer is not None:
            state = self.slots[peer].handle.export_state.remote()
            rec.ref = rec.actor.import_state.remote(state, rec.data_position)
        else:
            rec.ref = rec.actor.import_global.remote(self.syncer.global_fragments.remote(), rec.data_position, rec.step)
        rec.phase = "rejoining"
        slot.override = "rejoining"

    def _recovery_failed(self, i: int, slot: LearnerSlot, rec: Recovery, exc: Exception) -> None:
        """A step of a recovery failed: the syncer, the peer or the new process died under it."""
        if rec.phase == "registering" and isinstance(exc, ray.exceptions.RayActorError):
            # The syncer died: the driver restarts it; register with the new one (this one until then).
            rec.ref = self.syncer.rejoin.remote(i, rec.actor)
            return
        cause = getattr(exc, "cause", None)  # a backend or storage that failed: its one line
        if isinstance(cause, UserError) and not rec.spare:
            self.failure, slot.recovery = f"learner {i} could not be restarted: {cause}", None
            return
        if rec.phase == "rejoining" and self._alive(rec.actor):
            # The peer (or the syncer) it copied from died mid-copy: copy from another.
            self.rundir.event("state_copy_retried", learner=i, peer=rec.peer, error=str(exc).splitlines()[0])
            self._copy_state(i, slot, rec)
            return
        ray.kill(rec.actor)  # whatever is left of it must not hold its resources
        if rec.spare and rec.phase == "restarting":  # the spare died (or refused) before it took over
            self.rundir.event("spare_died", learner=i, error=str(exc).splitlines()[0])
            self._start_again(i, slot, rec, attempts=rec.attempts)
            return
        # Its new process died before it was ready: its node died under it (Ray marks a lost node
        # dead seconds after its processes die). Try again where there is room, or retire.
        lost = self.feasible(i) if self.feasible is not None else None
        if lost is not None:
            self._retire(i, lost, slot.death_fault)
        elif rec.attempts < MAX_RESTART_ATTEMPTS:
            self._start_again(i, slot, rec, attempts=rec.attempts + 1)
            self.rundir.event("restart_retried", learner=i, error=str(exc).splitlines()[0])
        else:
            self.failure, slot.recovery = f"learner {i} could not be restarted: {exc}", None

    def _start_again(self, i: int, slot: LearnerSlot, rec: Recovery, attempts: int) -> None:
        actor = self.make_learner(i, slot.stream, self.restarts[i])
        slot.recovery = Recovery(
            "restarting",
            actor,
            actor.ready.remote(),
            died_at=rec.died_at,
            attempts=attempts,
            data_position=rec.data_position,
            step=rec.step,
        )
        slot.override, slot.view["phase"] = "restarting", "starting process"

    @staticmethod
    def _alive(actor: Any) -> bool:
        """Whether a learner process answers (waits up to 5 s: only on a failed recovery)."""
        try:
            ray.get(actor.ready.remote(), timeout=5)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            return False
        return True

    def _healthy_peer(self, exclude: int) -> int | None:
        now = time.monotonic()
        candidates = [
            (slot.view.get("step", 0), i)
            for i, slot in self.slots.items()
            if i != exclude and self.state_of(i) in HEALTHY_STATES and now - slot.last_seen < 2.0
        ]
        return max(candidates)[1] if candidates else None

    # -- requests from chaos (control.jsonl) ---------------------------------------------------

    def _carry_out(self, request: dict[str, Any]) -> None:
        op, i = request.get("op"), request.get("learner")
        slot = self.slots.get(i) if i is not None else None
        if op in ("kill", "stall", "kill_node", "kill_syncer"):
            live = {j: self.slots[j].view for j in self.live()}
            self.signals.carry_out(request, live, self.syncer_pid, self.syncer_node)
        elif op == "slow" and slot is not None and i in self.live():
            duration = request.get("duration_s")
            seconds = float("inf") if duration is None else float(duration)  # None: until the run ends
            slot.handle.set_slow.remote(float(request.get("factor") or 2.0), seconds)
            self.rundir.event(
                "learner_slowed", learner=i, factor=request.get("factor"), duration_s=request.get("duration_s")
            )
        elif op in ("degrade_link", "cut_link") and slot is not None and i in self.live():
            factor = float(request.get("factor") or 10.0) if op == "degrade_link" else None
            seconds = float(request.get("duration_s") or 10.0)
            slot.handle.impair_link.remote(factor, seconds)  # the uplink
            self.syncer.impair_link.remote(i, factor, seconds)  # the downlink
            self.rundir.event("link_degraded" if factor else "link_cut", learner=i, factor=factor, duration_s=seconds)
        elif op == "leave" and slot is not None and i in self.live():
            slot.handle.stop.remote()
            slot.override = "left"
            self.syncer.leave.remote(i)
            self.rundir.event("learner_left", learner=i)
        elif op == "join" and self.join_streams:
            self._join(request.get("duration_s"))
        else:
            reason = "no data stream left for a joiner" if op == "join" else "unknown op or learner not live"
            self.rundir.event("control_ignored", request=request, reason=reason)

    def _join(self, duration_s: float | None) -> None:
        """A temporary learner with its own data stream, brought in by a peer copy like a restart."""
        index = max(self.slots) + 1
        stream = self.join_streams.pop(0)
        actor = self.make_learner(index, stream, 0)
        self.slots[index] = LearnerSlot(actor, stream, view={"id": index, "state": "restarting"}, override="restarting")
        self.slots[index].recovery = Recovery("restarting", actor, actor.ready.remote(), died_at=time.time())
        if duration_s is not None:
            self.slots[index].leave_at = time.monotonic() + float(duration_s)
        self.rundir.event("learner_joining", learner=index, duration_s=duration_s)

    def stop_all(self, timeout_s: float, absorb: Any) -> list[tuple[int, dict[str, Any] | None]]:
        """Stop every live learner; frozen or dying ones are killed after `timeout_s`.

        A poll still in flight has already drained its learner's events and metrics: those are
        absorbed first, or they would be lost.
        """
        live = self.live()
        pending = {i: self.slots[i].poll for i in live if self.slots[i].poll is not None}
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=min(timeout_s, 10.0))
        for i, ref in pending.items():
            self.slots[i].poll = None
            if ref in ready:
                with contextlib.suppress(ray.exceptions.RayError):
                    absorb(i, ray.get(ref))
        refs = {i: h.stop.remote() for i, h in live.items() if self.slots[i].override != "stalled"}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        out = []
        for i, ref in refs.items():
            try:
                out.append((i, ray.get(ref) if ref in ready else None))
            except ray.exceptions.RayError:
                out.append((i, None))
        for i, slot in self.slots.items():
            if i not in refs or dict(out).get(i) is None:
                for actor in (slot.handle, slot.recovery.actor if slot.recovery else None):
                    if actor is not None:
                        ray.kill(actor)
        self.spares.stop()
        return out
