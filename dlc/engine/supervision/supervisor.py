"""Keeps the learners alive: polls them, notices deaths and stalls, and files each one's time.

Every tick polls each learner without waiting: Ray notices a killed process (the actor's next call
fails) but never a frozen one, so a learner that has not answered a poll for `heartbeat_timeout_s`
is shown `stalled` until it answers again. A death starts a recovery (`dlc.engine.supervision.recovery`); chaos's
requests of control.jsonl are carried out first (`dlc.engine.supervision.control`). The time of each learner is
filed in the goodput ledger under its state: training, waiting, checkpointing, restarting, ...

With `learners.spares: N`, N hot spares (`dlc.engine.supervision.spares`) wait beside the learners: a dead
learner's slot is taken over by a ready spare, which skips the process start and the compilation.
"""

from __future__ import annotations

import contextlib
import string
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray

from dlc.config.schema import Recipe
from dlc.engine.cluster import draining_nodes
from dlc.engine.supervision.agent import Agents, Signals
from dlc.engine.supervision.chaos_log import ChaosLog
from dlc.engine.supervision.control import carry_out
from dlc.engine.supervision.recovery import Recoveries
from dlc.engine.supervision.slots import LearnerSlot, Recovery
from dlc.engine.supervision.spares import SparePool
from dlc.observe.goodput import STATE_BUCKET, Ledger
from dlc.run import events
from dlc.run.rundir import RunDir

DRAIN_CHECK_S = 2.0  # how often the GCS is asked which nodes are draining

# Events said on the console as they happen: a death, a stall, a preemption, and the recovery of each
# (a kind/fault key, where there is one, for the event of that fault).
TOLD: dict[type[events.Event], str] = {
    events.LearnerDied: "learner {learner} died at step {step}",
    events.LearnerStalled: "learner {learner} silent for {silent_s:.1f} s: stalled; the rounds go on without it",
    events.LearnerThawed: "learner {learner} answers again, after {silent_s:.1f} s of silence",
    events.LearnerRecovered: "learner {learner} back: pushing again {after_s:.1f} s after it died",
    events.LearnerLost: "learner {learner} lost: {reason}",
    events.LearnerPreempted: "learner {learner} preempted ({reason}): pushed {fragments} fragments and left "
    "{leave_s:.1f} s after its notice; a new process takes its place",
    events.NodeDraining: "node {node} is draining: learners {learners} leave with their progress",
}
BACK_AFTER_NOTICE = "learner {learner} back: pushing again {after_s:.1f} s after it left on its notice"


class _Told(string.Formatter):
    """The console's lines: a field the event does not know (None) reads "?", whatever its format."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        return "?" if value is None else super().format_field(value, format_spec)


_TOLD_FORMAT = _Told()


class Supervisor(Recoveries):
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
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.recipe = recipe
        self.clock = clock  # seconds for intervals (the ledger, silences, deadlines)
        self.wall = wall  # Unix seconds, as events and chaos.jsonl record them
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
        self.drain_checked_at = 0.0
        self.draining: set[str] = set()  # nodes already seen draining

    def _event(self, event: events.Event) -> None:
        """Record the event; say the ones a person watching the console wants to see at once."""
        self.rundir.event(event)
        line = TOLD.get(type(event))
        if isinstance(event, events.LearnerRecovered) and event.fault == "preempt":
            line = BACK_AFTER_NOTICE
        if line is not None and self.say is not None:
            self.say(_TOLD_FORMAT.format(line, **event.fields()))

    # -- membership ------------------------------------------------------------------------

    def add(self, index: int, handle: Any, stream: Any, pid: int, since: float) -> None:
        """A learner of the run; its allocation (and start-up time) began at monotonic time `since`."""
        now = self.clock()
        self.slots[index] = LearnerSlot(
            handle, stream, view={"id": index, "state": "starting", "pid": pid}, last_seen=now, ticked_at=now
        )
        self.ledger.tick(index, "starting", now - since)

    def join(self, duration_s: float | None) -> None:
        """A temporary learner with its own data stream, brought in by a peer copy like a restart."""
        index = max(self.slots) + 1
        stream = self.join_streams.pop(0)
        actor = self.make_learner(index, stream, 0)
        now = self.clock()
        self.slots[index] = LearnerSlot(
            actor,
            stream,
            view={"id": index, "state": "restarting"},
            override="restarting",
            last_seen=now,
            ticked_at=now,
        )
        self.slots[index].recovery = Recovery("restarting", actor, actor.ready.remote(), died_at=self.wall())
        if duration_s is not None:
            self.slots[index].leave_at = self.clock() + float(duration_s)
        self.rundir.event(events.LearnerJoining(learner=index, duration_s=duration_s))

    def leave(self, index: int) -> None:
        """Live learner `index` stops for good (a joiner's time is up, or chaos asked)."""
        slot = self.slots[index]
        slot.handle.stop.remote()
        slot.override = "left"
        self.syncer.leave.remote(index)
        self.rundir.event(events.LearnerLeft(learner=index))

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
        now = self.clock()
        # Chaos lines first: a kill injected and detected within one tick must already be known
        # as injected when its outcome is recorded. Requests are carried out before the polls, so
        # a signal is on its way while this tick works (the driver's next tick comes early then).
        for request in self.chaos.requests():
            carry_out(request, self)
        self._poll(absorb, now)
        self.spares.poll()
        self.failure = self.failure or self.spares.failure
        self._advance_recoveries()
        self.signals.check()
        if now - self.drain_checked_at >= DRAIN_CHECK_S:
            self.drain_checked_at = now
            self.notice_draining(draining_nodes())
        for i, slot in self.slots.items():
            if slot.leave_at is not None and now >= slot.leave_at and i in self.live():
                self.leave(i)
        self.file_time()

    def notice_draining(self, nodes: dict[str, float | None]) -> None:
        """Give the live learners on each draining node (id -> deadline) a preemption notice: they push their
        progress and leave, and their replacements start where Ray has room (never on a draining node)."""
        for node, deadline in nodes.items():
            if node in self.draining:
                continue
            on_node = sorted(i for i in self.live() if self.slots[i].view.get("node_id") == node)
            if not on_node:
                continue
            self.draining.add(node)
            for i in on_node:
                self.slots[i].handle.give_notice.remote("node draining", deadline)
            left = None if deadline is None else round(deadline - self.wall(), 1)
            name = self.slots[on_node[0]].view.get("node") or node[:8]
            self._event(events.NodeDraining(node_id=node, node=name, learners=on_node, deadline_in_s=left))

    def catch_up(self, absorb: Any, wait_s: float = 2.0) -> None:
        """After the driver was busy (a syncer restart), refresh every learner's view before the next
        tick carries out a chaos request: a poll answered meanwhile is as old as the wait, and a
        learner killed now would come back at that old data position, reading again what it had read.
        A frozen learner does not answer; `wait_s` bounds the wait for it."""
        self._poll(absorb, self.clock())
        pending = [slot.poll for slot in self.slots.values() if slot.poll is not None]
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=wait_s)
        self._poll(absorb, self.clock())

    def forgive_silence(self) -> None:
        """After the driver itself was busy (a syncer restart), no learner has been silent."""
        now = self.clock()
        for slot in self.slots.values():
            slot.last_seen = max(slot.last_seen, now)

    def file_time(self) -> None:
        """File each learner's time since the last call under its current state's bucket."""
        now = self.clock()
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
            # A preempted learner's replacement starting is what the preemption costs, not a death's.
            self.ledger.tick(i, "preempted" if state == "restarting" and slot.death_fault == "preempt" else state, dt)
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
                    self._event(events.LearnerStalled(learner=i, silent_s=round(now - slot.last_seen, 2)))
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
                self._event(events.LearnerThawed(learner=i, silent_s=round(now - slot.last_seen, 2)))
                self.chaos.outcome("stall", i, "recovered", after_s=self.chaos.since("stall", i))
            slot.last_seen = now
            slot.view = result["snapshot"]
            # Progress an adoption threw away was trained, but never reached the global model.
            discarded = slot.view.get("discarded_steps", 0.0) - slot.blocked_filed.get("discarded_steps", 0.0)
            if discarded > 0:
                slot.blocked_filed["discarded_steps"] = slot.view["discarded_steps"]
                self.ledger.waste(i, discarded * self._step_s(slot))
            if slot.view.get("state") == "finished" and not slot.finished:
                slot.finished = True
                self.rundir.event(events.LearnerFinished(learner=i, step=slot.view.get("step")))
            absorb(i, result)
            if slot.view.get("state") == "preempted":  # it left on a notice, its progress pushed
                self._on_preempted(i)
            if result["error"]:
                self.failure = f"learner {i} failed:\n{result['error']}"

    def note_syncer_events(self, reported: list[events.Event]) -> None:
        """First accepted push after a rejoin; wasted time for rejected pushes."""
        fragments = max(self.recipe.syncer.fragments, 1)
        for event in reported:
            if not isinstance(event, events.PushAccepted | events.PushRejected):
                continue
            slot = self.slots.get(event.learner)
            if slot is None:
                continue
            if isinstance(event, events.PushAccepted) and slot.awaiting_first_push is not None:
                after = self.wall() - slot.awaiting_first_push
                fault = slot.death_fault
                self._event(events.LearnerRecovered(learner=event.learner, after_s=round(after, 3), fault=fault))
                self.chaos.outcome(fault, event.learner, "first_push", after_s=self.chaos.since(fault, event.learner))
                slot.awaiting_first_push = None
            elif isinstance(event, events.PushRejected):
                # A push carries its share of the model (1/P for a fragment) of the progress of its steps.
                share = 1.0 / fragments if event.share is None else event.share
                self.ledger.waste(event.learner, event.steps * self._step_s(slot) * share)

    @staticmethod
    def _step_s(slot: LearnerSlot) -> float:
        rate = slot.view.get("tokens_per_s") or 0.0
        per_step = slot.view.get("tokens_per_step") or 0
        return per_step / rate if rate > 0 else 0.0

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
