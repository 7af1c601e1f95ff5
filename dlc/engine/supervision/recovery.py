"""Bringing a dead process back: a learner from a peer's state, the syncer from its checkpoint and journal.

A learner: a new process (or a hot spare), a copy of a peer's state, a rejoin. The syncer: a new
process from its checkpoint and journal, to which learners re-send.

Ray notices a killed process (the actor's next call fails). The dead learner is replaced by a new
actor of the same index, or by a ready hot spare (`dlc.engine.supervision.spares`), which copies parameters,
AdamW state, step and data position from a healthy peer (the peer keeps training; it copies its
state at a step boundary), or starts from the syncer's global fragments when no peer is healthy,
and then rejoins the syncer as a new incarnation. A learner that no live node can hold is retired
and the run goes on without it. Every step of that is an event, and the observed outcome of each
chaos fault goes to chaos.jsonl.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from dlc.engine.supervision.chaos_log import ChaosLog
from dlc.engine.supervision.slots import LearnerSlot, Recovery
from dlc.engine.supervision.spares import SparePool
from dlc.errors import UserError
from dlc.observe.goodput import Ledger
from dlc.run import events
from dlc.run.files import HEALTHY_STATES
from dlc.run.rundir import RunDir

if TYPE_CHECKING:
    from dlc.engine.syncer.reports import SyncerReports

PEER_HEARD_S = 2.0  # a peer whose last answer is older is not copied from (yet): it may be frozen
MAX_RESTART_ATTEMPTS = 3  # new processes for one death, each lost before it was ready, before the run fails


class Recoveries:
    """The supervisor's part that brings dead learners back (`Supervisor` is one); what it uses of the
    supervisor is declared here."""

    rundir: RunDir
    syncer: Any
    slots: dict[int, LearnerSlot]
    make_learner: Any  # (index, stream_ref, incarnation) -> actor handle
    spares: SparePool
    restarts: Counter[int]
    dead_tokens: Counter[int]
    ledger: Ledger
    chaos: ChaosLog
    feasible: Callable[[int], str | None] | None
    failure: str | None
    clock: Callable[[], float]  # seconds for intervals
    wall: Callable[[], float]  # Unix seconds, as events record them

    if TYPE_CHECKING:  # the supervisor's own

        def _event(self, event: events.Event) -> None: ...
        def state_of(self, index: int) -> str: ...
        def live(self) -> dict[int, Any]: ...
        def forgive_silence(self) -> None: ...
        @staticmethod
        def _step_s(slot: LearnerSlot) -> float: ...

    def _on_death(self, i: int) -> None:
        slot = self.slots[i]
        slot.override = "dead"
        # Progress not yet pushed died with the process: mean steps since each fragment's push.
        self.ledger.waste(i, slot.view.get("unpushed_steps", 0.0) * self._step_s(slot))
        # Its position in its own stream as last reported (every poll): what it read after that
        # died unpushed with it, so the new process reads it again rather than skipping it.
        self._event(
            events.LearnerDied(
                learner=i,
                step=slot.view.get("step"),
                pid=slot.view.get("pid"),
                data_position=int(slot.view.get("data_position") or 0),
            )
        )
        fault = slot.death_fault = self.chaos.death_fault(i)
        self.chaos.outcome(fault, i, "detected", after_s=self.chaos.since(fault, i))
        self._replace(i)

    def _on_preempted(self, i: int) -> None:
        """Learner `i` left on a preemption notice, its progress pushed and its data position final: not a
        fault. Its process is ended and replaced, as after a death,
        by a hot spare or a new process where the cluster has room (Ray places none on a draining node)."""
        slot = self.slots[i]
        notice = slot.view.get("notice") or {}
        ray.kill(slot.handle, no_restart=True)
        self._event(
            events.LearnerPreempted(
                learner=i,
                step=slot.view.get("step"),
                pid=slot.view.get("pid"),
                reason=notice.get("reason"),
                fragments=notice.get("fragments"),
                leave_s=notice.get("leave_s"),
                unpushed_steps=slot.view.get("unpushed_steps", 0.0),
                data_position=int(slot.view.get("data_position") or 0),
            )
        )
        self.ledger.waste(i, slot.view.get("unpushed_steps", 0.0) * self._step_s(slot))  # none, when it pushed
        slot.death_fault = "preempt"
        self.chaos.outcome("preempt", i, "left", after_s=self.chaos.since("preempt", i), leave_s=notice.get("leave_s"))
        self._replace(i)

    def _replace(self, i: int) -> None:
        """A new process for learner `i`, whose own one is gone: a ready hot spare, else a new actor; or
        retire it when no live node can hold it. It goes on from its last reported data position and step."""
        slot = self.slots[i]
        position = int(slot.view.get("data_position") or 0)
        step = int(slot.view.get("step") or 0)
        self.dead_tokens[i] += slot.view.get("tokens", 0)
        slot.view = {**slot.view, "tokens": 0, "tokens_per_s": 0.0, "phase": "starting process"}
        fault = slot.death_fault
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
                "restarting", spare.actor, ref, died_at=self.wall(), spare=True, data_position=position, step=step
            )
            slot.view["phase"] = f"spare {spare.name} taking over"
            self.rundir.event(events.SpareTaken(spare=spare.name, learner=i, ready=spare.ready))
            self.spares.keep()
        else:
            actor = self.make_learner(i, slot.stream, incarnation)
            slot.recovery = Recovery(
                "restarting", actor, actor.ready.remote(), died_at=self.wall(), data_position=position, step=step
            )
        slot.override = "restarting"
        self.restarts[i] += 1

    def _retire(self, i: int, reason: str, fault: str) -> None:
        """Learner `i` died and no live node can hold it (pinned by resources or labels to a node that is
        gone): a restart would wait forever for resources that never come. The run goes on without it."""
        slot = self.slots[i]
        slot.override, slot.recovery, slot.view["phase"] = "left", None, None
        self._event(events.LearnerLost(learner=i, reason=reason))
        self.chaos.outcome(fault, i, "not_restarted", detail=reason)

    def _advance_recoveries(self) -> None:
        for i, slot in self.slots.items():
            rec = slot.recovery
            if rec is None:
                continue
            if rec.phase == "awaiting peer":
                self._copy_state(i, slot, rec)
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
                rec.restarted_at = self.wall()
                self.rundir.event(
                    events.LearnerRestarted(
                        learner=i, pid=result, after_s=round(rec.restarted_at - rec.died_at, 3), spare=rec.spare
                    )
                )
                fault = slot.death_fault
                self.chaos.outcome(fault, i, "restarted", after_s=self.chaos.since(fault, i), pid=result)
                slot.view = {**slot.view, "pid": result}
                self._copy_state(i, slot, rec)
            elif rec.phase == "rejoining":
                self.rundir.event(events.LearnerRejoined(learner=i, **result))
                fault = slot.death_fault
                self.chaos.outcome(fault, i, "state_copied", after_s=self.chaos.since(fault, i), **result)
                rec.phase, rec.ref = "registering", self.syncer.rejoin.remote(i, rec.actor)
            elif rec.phase == "registering":
                rec.actor.set_syncer.remote(self.syncer)  # the syncer may have restarted meanwhile
                rec.actor.start.remote(None, None)
                slot.handle, slot.recovery, slot.override = rec.actor, None, None
                slot.blocked_filed = {}  # the new process counts from zero
                slot.last_seen = self.clock()
                slot.awaiting_first_push = rec.died_at

    def _copy_state(self, i: int, slot: LearnerSlot, rec: Recovery) -> None:
        """The new process copies a healthy peer's state, or the global model when none is healthy.

        A peer that trains but has not answered a poll for a moment (cores busy with the new processes
        starting) is waited for, tick by tick: it answers, or its silence reaches the heartbeat timeout
        and it is stalled. The global model, with fresh AdamW state, is for when no peer trains."""
        peer, unheard = self._peers(exclude=i)
        slot.override = "rejoining"
        if unheard is not None:
            rec.phase, rec.ref = "awaiting peer", None
            slot.view["phase"] = f"waiting for learner {unheard} to answer"
            return
        slot.view["phase"] = "copying state" + (f" from {peer}" if peer is not None else " from the syncer")
        rec.peer = peer
        if peer is not None:
            state = self.slots[peer].handle.export_state.remote()
            rec.ref = rec.actor.import_state.remote(state, rec.data_position)
        else:
            rec.ref = rec.actor.import_global.remote(self.syncer.global_fragments.remote(), rec.data_position, rec.step)
        rec.phase = "rejoining"

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
            self.rundir.event(events.StateCopyRetried(learner=i, peer=rec.peer, error=str(exc).splitlines()[0]))
            self._copy_state(i, slot, rec)
            return
        ray.kill(rec.actor)  # whatever is left of it must not hold its resources
        if rec.spare and rec.phase == "restarting":  # the spare died (or refused) before it took over
            self.rundir.event(events.SpareDied(learner=i, error=str(exc).splitlines()[0]))
            self._start_again(i, slot, rec, attempts=rec.attempts)
            return
        # Its new process died before it was ready: its node died under it (Ray marks a lost node
        # dead seconds after its processes die). Try again where there is room, or retire.
        lost = self.feasible(i) if self.feasible is not None else None
        if lost is not None:
            self._retire(i, lost, slot.death_fault)
        elif rec.attempts < MAX_RESTART_ATTEMPTS:
            self._start_again(i, slot, rec, attempts=rec.attempts + 1)
            self.rundir.event(events.RestartRetried(learner=i, error=str(exc).splitlines()[0]))
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

    def _peers(self, exclude: int) -> tuple[int | None, int | None]:
        """(the training peer furthest ahead that answered a poll in the last PEER_HEARD_S, a copy from one
        frozen since would wait on it; else one that still counts as training, not yet stalled, but has not
        answered lately), each None when there is none."""
        now = self.clock()
        training = [i for i in self.slots if i != exclude and self.state_of(i) in HEALTHY_STATES]
        slots = self.slots
        heard = [(slots[i].view.get("step", 0), i) for i in training if now - slots[i].last_seen < PEER_HEARD_S]
        if heard:
            return max(heard)[1], None
        return None, (training[0] if training else None)

    def restart_syncer(self, make_syncer: Callable[[], Any], reports: SyncerReports) -> tuple[Any, str]:
        """The syncer died: start a new one (`make_syncer`) from the checkpoint and journal, and hand it to
        the live learners, which re-send what it never merged. Returns it, and the line to say.

        The pushes it had accepted into rounds still open died with it (a journal keeps closed rounds):
        `reports` logs each as lost before the learners re-send them, so a reader counts each once."""
        died = self.wall()
        chaos = self.chaos
        self.rundir.event(events.SyncerDied())
        chaos.outcome("kill_syncer", None, "detected", after_s=chaos.since("kill_syncer", None))
        syncer = make_syncer()
        restored = ray.get(syncer.restore.remote(), timeout=300) or {}
        reports.restored(restored.get("versions"), reason="syncer_died")
        live = self.live()
        ray.get([syncer.register.remote(i, h, False) for i, h in live.items()], timeout=60)
        ray.get(syncer.start.remote(), timeout=60)
        self.syncer = syncer
        refs = [h.set_syncer.remote(syncer) for h in live.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=30)  # a frozen learner re-sends when it thaws
        resent = 0
        for ref in ready:
            # One that died meanwhile re-sends nothing: the supervisor's next poll finds it dead.
            with contextlib.suppress(ray.exceptions.RayActorError):
                resent += ray.get(ref)
        after = round(self.wall() - died, 3)
        self.forgive_silence()  # the driver was busy here, not the learners silent
        self.rundir.event(events.SyncerRestarted(after_s=after, resent_pushes=resent, **restored))
        chaos.outcome(
            "kill_syncer",
            None,
            "restarted",
            after_s=chaos.since("kill_syncer", None),
            resent_pushes=resent,
            versions=restored.get("versions"),
        )
        return syncer, f"syncer restarted in {after:.1f} s; learners re-sent {resent} unacknowledged pushes"
