"""The learner actor: one Learner, its sync protocol and its training loop, in a Ray actor process.

Each learner is its own Ray actor process with its own JAX runtime. Its training loop runs in
a thread of the actor, so the actor's methods (deliveries of merged fragments, polls from the
driver, state copies for a rejoining peer) are served while it trains. The driver only talks to
actors with timeouts, because a frozen (SIGSTOPped) process never answers. A hot spare (index None)
starts up, then idles, holding no data, until `take_slot` makes it a learner.

Beside it: its start-up phases (`startup`), its uplink to the syncer (`uplinks`), what it
queues for the driver's polls (`reports`), its checkpoints (`checkpoints`), the copies
of its state for and from a peer (`state_copy`), and its measured and chaos-slowed pace (`pace`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray

from dlc.algo.protocol import SEQ_STRIDE
from dlc.config.schema import Recipe
from dlc.core.allocator import freeze_heap, release_freed_memory
from dlc.core.profiler import StepProfiler
from dlc.engine.cluster import node_info
from dlc.engine.learner.checkpoints import LearnerCheckpoints
from dlc.engine.learner.notice import Preemptible
from dlc.engine.learner.pace import Slowdown, Throughput
from dlc.engine.learner.reports import Reports
from dlc.engine.learner.startup import Startup
from dlc.engine.learner.state_copy import StateCopy
from dlc.engine.learner.uplinks import uplink_for
from dlc.errors import UserError
from dlc.run import events
from dlc.run.files import PROFILE_DIR
from dlc.run.storage import RunStorage, describe, local_dir_of


class LearnerWorker(Preemptible):
    """Lives in a learner actor: one Learner, its sync protocol, its loop thread."""

    def __init__(
        self,
        recipe_json: dict[str, Any],
        index: int | None,
        stream: Any,  # its bytes, or where its tokens are (dlc.data.plan.StreamSource); None for a spare
        storage: dict[str, str],
        syncer: Any,
        incarnation: int = 0,
        requested_at: float | None = None,
    ) -> None:
        constructed = time.time()
        freeze_heap(collect=False)  # what the imports made; the rest once compiled (`startup`)
        self.recipe = Recipe.model_validate(recipe_json)
        self.index = index
        self.incarnation = incarnation
        # Before anything is written: a node that cannot see the run's storage must not checkpoint
        # into a directory of the same name of its own (`ready` and `where` report it to the driver).
        self.node = node_info()
        self.storage = RunStorage(storage["location"])
        self.storage_error = self.storage.check(storage["token"], describe(self.node))
        # A backend that failed to start is reported by `device_info`, `ready` and `poll` in one line.
        self.startup = Startup(self.recipe, index, requested_at, constructed)
        self.device, self.backend_error = self.startup.device, self.startup.backend_error
        if self.backend_error:
            self.state = "failed"
            self.error: str | None = self.backend_error
            return
        from dlc.algo import get_algorithm
        from dlc.core.learner import Learner
        from dlc.net.transport import Transport

        self.syncer = syncer
        # syncer.channel=direct: messages to and from the syncer go on one socket (`dlc.net.channel`),
        # connected when the loop starts; ray: they are calls of the syncer's and this actor's methods.
        self.link = uplink_for(self.recipe, syncer, self._receive)
        self._link_lock = threading.Lock()
        self.learner = Learner(self.recipe, -1 if index is None else index, stream)
        learners = self.recipe.learners
        self.transport = Transport(lambda i: learners.resolved(i).link, seed=self.recipe.run.seed)  # the uplink
        self.algorithm = get_algorithm(self.recipe.algorithm)
        upstream = SimpleNamespace(push=self.link.push)
        self.sync = self.algorithm.learner_sync(self.recipe, self.learner, self.transport, upstream)
        self.copies = StateCopy(self.learner, self.sync)
        self.sync.idle = self._serve_copies  # a learner blocked on the others still serves state copies
        # Seqs never repeat across incarnations of one learner index, so a (learner, seq) pair
        # names one push for the whole run, also across syncer restarts.
        self.sync.seq = incarnation * SEQ_STRIDE
        self.sync.incarnation = incarnation
        self.checkpointer = None if index is None or self.storage_error else self._checkpointer(index)
        self.reports = Reports(self.recipe.run.log_every_steps)
        self.state = "starting" if index is not None else "spare"
        self.meter = Throughput()  # its tokens per second, measured by the loop
        self.error = None
        self._stop = threading.Event()
        # A preemption notice (SIGTERM, or its node draining): the loop stops, hands its progress over
        # and the process leaves (`_leave`). `_reported` is set once a poll has carried that out.
        self.notice: dict[str, Any] | None = None
        self._reported = threading.Event()
        self._ending = threading.Lock()  # the loop's end and a notice: one of them decides who leaves
        self._handed_over = False  # its progress is with the syncer and it trains no more (`_hand_over`)
        self._default_sigterm = signal.getsignal(signal.SIGTERM)
        if _in_actor() and threading.current_thread() is threading.main_thread():  # where Ray builds one
            signal.signal(signal.SIGTERM, self._on_sigterm)
        # Seconds the loop stood still for something other than its own protocol: writing
        # checkpoints, and copying its state for a peer at a step boundary (the sync's own
        # waiting is its `waiting_s`). The goodput ledger files them as checkpoint and waiting.
        self.blocked_s = {"checkpoint": 0.0, "peer_copy": 0.0}
        self.slowdown = Slowdown()
        self._thread: threading.Thread | None = None
        self._heart: threading.Thread | None = None
        self.startup.compile(self.sync, self._fail)

    def _checkpointer(self, index: int) -> LearnerCheckpoints:
        if self.storage_error:
            raise UserError(self.storage_error)
        return LearnerCheckpoints(self.storage.learner_dir(index), self.recipe.checkpoint.keep, self.learner, self.sync)

    def where(self) -> dict[str, Any]:
        """Its node, and why it cannot use the run's storage (None when it can)."""
        return {**self.node, "storage_error": self.storage_error}

    def _fail(self, error: str) -> None:
        """The loop or the compile thread failed: the driver's next poll fails the run with `error`."""
        self.error = error
        self.state = "failed"

    def current_phase(self) -> str | None:
        """What it is doing while it starts (compiling, loading compiled step, copying state, ready
        for a spare, starting); None once it trains."""
        if self.state not in ("starting", "spare"):
            return None
        if self.copies.copying:
            return "copying state"
        if not self.startup.compiled.is_set():
            return self.startup.phase()
        return "ready" if self.index is None else "starting"

    def device_info(self) -> dict[str, str]:
        """The device this process trains on: platform, device_kind and their label ('gpu: NVIDIA H100
        80GB HBM3', 'cpu'); raises the backend's error (a UserError) if JAX failed to start."""
        if self.backend_error:
            raise UserError(self.backend_error)
        return dict(self.device)

    def take_slot(self, index: int, stream: Any, incarnation: int) -> int:
        """A hot spare becomes learner `index` (a new incarnation) with its data stream; returns its pid."""
        if self.index is not None:
            raise RuntimeError(f"learner {self.index} is no spare")
        self.index, self.incarnation = index, incarnation
        self.learner.rebind(index, self.recipe, stream)
        self.sync.seq = incarnation * SEQ_STRIDE
        self.sync.incarnation = incarnation
        self.checkpointer = self._checkpointer(index)
        self.state = "starting"
        self.startup.became_spare_learner()
        return os.getpid()

    def restore(self, next_seq: int = 0) -> dict[str, Any]:
        """Load this learner's checkpoint, if any, numbering its pushes from `next_seq` on (the lowest seq
        the restored syncer has not seen from it); returns its step, data position and incarnation."""
        assert self.checkpointer is not None, "restored before it became a learner, or its storage unusable"
        where = self.checkpointer.restore(next_seq)
        self.incarnation = where["incarnation"]
        return where

    def save(self, wait: bool = True) -> None:
        """Checkpoint; with `wait=False` (the loop's interval saves) the write goes on while it trains."""
        assert self.checkpointer is not None, "saved before it became a learner, or its storage unusable"
        self.checkpointer.save(wait=wait)

    def start(self, global_fragments: list[np.ndarray] | None, versions: list[int] | None) -> int:
        if global_fragments is not None and versions is not None:
            self.sync.resume_from_global(global_fragments, versions)
        with self._link_lock:
            self._try_connect()  # if it cannot yet, the heartbeat thread goes on trying
        self.sync.start_background()
        self._thread = threading.Thread(target=self._loop, name=f"learner-{self.index}", daemon=True)
        self._heart = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        self._thread.start()
        self._heart.start()
        return os.getpid()

    def _heartbeats(self) -> None:
        """Tell the syncer this learner lives, and its step, every interval in which no push did."""
        interval, index = self.recipe.syncer.heartbeat_interval_s, self.index
        assert index is not None, "a spare starts its loop once it takes a slot"
        while not self._stop.wait(interval):
            if not self.link.connected:
                self._reconnect()
            if time.monotonic() - self.sync.beat_at >= interval:
                self.link.heartbeat(index, self.learner.step)

    def _try_connect(self) -> bool:
        """Connect to the syncer (channel=direct: its channel; always at once for channel=ray);
        False if it cannot now (hold _link_lock). A live syncer that refuses too long fails the run."""
        assert self.index is not None, "a spare connects once it takes a slot"
        connected = self.link.connect(self.syncer, self.index)
        if self.link.failure is not None and self.error is None:
            self.error = self.link.failure
        return connected

    def _reconnect(self) -> None:
        """The connection to the syncer broke (or was never made): connect and re-send what it never
        acknowledged. The heartbeat thread tries again every interval until it can."""
        with self._link_lock:
            if self.link.connected:  # set_syncer connected it meanwhile
                return
            if self._try_connect():
                self.sync.reconnect(self.link.push)

    def _profiler(self) -> StepProfiler | None:
        """This learner's profiler, if the recipe's profile section lists it: it writes into the run
        directory (on a node where run.dir is a URL, into the run's local directory there)."""
        profile = self.recipe.profile
        if self.index not in profile.learners:
            return None
        if self.storage.is_url:
            root = local_dir_of(self.storage.location, self.recipe.run.local_dir).resolve()
        else:
            root = Path(str(self.storage.root))
        return StepProfiler(root / PROFILE_DIR / f"learner-{self.index}", *profile.steps)

    def _traced(self, profiler: StepProfiler) -> events.ProfileWritten:
        assert self.index is not None, "a spare traces nothing"
        steps = [profiler.first, min(profiler.last, self.learner.step)]
        return events.ProfileWritten(learner=self.index, steps=steps, dir=str(profiler.directory))

    def _loop(self) -> None:
        recipe, learner = self.recipe, self.learner
        max_steps = recipe.run.max_steps
        meter = self.meter
        self.startup.join()
        if self.error:
            return
        assert self.index is not None, "a spare trains once it takes a slot"
        profiler = self._profiler()
        try:
            while not self._stop.is_set() and (max_steps is None or learner.step < max_steps):
                traced = profiler is not None and profiler.tick(learner.step)
                started, waited = time.monotonic(), self.sync.waiting_s
                happened = self.sync.step(self._stop)
                if traced and profiler is not None:  # `traced` implies a profiler
                    happened.append(self._traced(profiler))
                self._apply_slow(time.monotonic() - started - (self.sync.waiting_s - waited))
                copying = time.monotonic()
                if self._serve_copies():
                    self.blocked_s["peer_copy"] += time.monotonic() - copying
                if learner.step % recipe.checkpoint.every_steps == 0:
                    saving = time.monotonic()
                    self.save(wait=False)
                    release_freed_memory()  # what writing the checkpoint left free
                    self.blocked_s["checkpoint"] += time.monotonic() - saving
                    happened.append(events.CheckpointSaved(learner=self.index, step=learner.step))
                now = time.monotonic()
                if not meter.started:  # start-up ends with the first step
                    self.state = "training"
                    happened.append(
                        events.LearnerTraining(
                            learner=self.index,
                            incarnation=self.incarnation,
                            device=self.device["device"],
                            **self.startup.seconds,
                        )
                    )
                meter.measure(now, learner.tokens)
                self.reports.add(happened)
                self.reports.log(self.index, learner.take_records, meter.rate)
            learner.flush()
            if profiler is not None and (profiler.tick(learner.step) or profiler.close()):
                self.reports.add([self._traced(profiler)])  # the run ended at or inside the traced steps
            self.reports.log(self.index, learner.take_records, meter.rate)
            if max_steps is not None and learner.step >= max_steps and self.notice is None:
                # Its last steps go to the syncer now, while its peers still train and their rounds
                # merge them. Held until the run's end (the driver stops every learner once all have
                # finished), they met a global model some rounds newer, merged stale or refused.
                self._hand_over(timeout_s=120)
                self._retire()
            with self._ending:  # a notice now finds it finished, and makes it leave itself
                leave = self.notice is not None
                if not leave:
                    self.state = "finished"
            if leave:
                self._leave()
        except Exception:  # reported to the driver, which fails the run with this text
            error = traceback.format_exc()
            if profiler is not None:
                with contextlib.suppress(Exception):  # the learner's own error is what the driver must see
                    profiler.close()
            self._fail(error)

    def poll(self) -> dict[str, Any]:
        if self.backend_error:
            snapshot: dict[str, Any] = {
                "id": self.index,
                "state": "failed",
                "phase": None,
                "startup": {},
                "pid": os.getpid(),
            }
            return {"snapshot": snapshot, "events": [], "metrics": [], "error": self.backend_error}
        with self.reports.lock:
            events, metrics = self.reports.take()
            snapshot = self.snapshot()
            result = {"snapshot": snapshot, "events": events, "metrics": metrics, "error": self.error}
        if snapshot["state"] == "preempted":
            self._reported.set()
        return result

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.index,
            "state": self.state,
            "step": self.learner.step,
            "tokens": self.learner.tokens - self.copies.base_tokens,
            "tokens_per_s": round(self.meter.rate, 1),
            "steady_tokens_per_s": round(self.meter.steady, 1),
            "loss": self.reports.loss,
            "data_position": self.learner.position,
            "phase": self.current_phase(),
            "startup": dict(self.startup.seconds),
            "tokens_per_step": self.learner.tokens_per_step,
            "unpushed_steps": self.sync.unpushed_steps(),
            "pushes": self.sync.pushes,
            "adopted": self.sync.adopted,
            "discarded_steps": round(self.sync.discarded_steps, 3),
            "adopt_lag_steps": None if (lag := self.sync.adopt_lag_steps()) is None else round(lag, 3),
            "bytes_sent": self.transport.bytes_sent,
            "waiting_s": round(self.sync.waiting_s + self.blocked_s["peer_copy"], 3),
            "checkpoint_s": round(self.blocked_s["checkpoint"], 3),
            "link_queued": self.transport.queued(),
            "link_blocked_s": round(self.transport.blocked_s(), 3),
            "pid": os.getpid(),
            "notice": self.notice,
            "device": self.device["device"],
            "node_id": self.node["node_id"],
            "node": self.node["ip"],
            "host": self.node["host"],
        }

    # channel=ray. One thread: messages from the syncer stay in order. No return value: the syncer
    # never waits for one, and an object to track costs both ends CPU on every delivery.
    @ray.method(concurrency_group="deliveries", num_returns=0)
    def deliver(self, message: Any) -> None:
        self._receive(message)

    def _receive(self, message: Any) -> None:
        """A message from the syncer, in the order it sent them (the channel's reader thread, or `deliver`)."""
        try:
            self.sync.receive(message)
        except Exception:  # nobody waits for this call: the driver fails the run with it
            self.error = self.error or traceback.format_exc()

    def set_syncer(self, syncer: Any) -> int:
        """The syncer was restarted: talk to the new one and re-send what it never acknowledged (a learner that
        finished its steps is retired from the new one's rounds too; what it re-sends is merged all the same)."""
        with self._link_lock:
            self.syncer = syncer
            # Not connected: the heartbeat thread connects and re-sends when it can.
            resent = self.sync.reconnect(self.link.push) if self._try_connect() else 0
        if self.state == "finished":
            self._retire()
        return resent

    def impair_link(self, factor: float | None, seconds: float) -> None:
        """Degrade this learner's uplink by `factor` (None: cut it) for `seconds`."""
        assert self.index is not None, "a spare has no link to impair"  # the driver impairs live learners only
        self.transport.impair(self.index, factor, seconds)

    def ready(self) -> int:
        """Answers once the actor is constructed; returns its pid. UserError if its backend failed to start
        or its node cannot see the run's storage."""
        if self.backend_error:
            raise UserError(self.backend_error)
        if self.storage_error:
            raise UserError(self.storage_error)
        return os.getpid()

    # -- state copies, for a rejoining peer and from one (`dlc.engine.learner.state_copy`) ----------------

    def export_state(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Host copies of params, AdamW state, anchors, versions, step and data position, for a peer;
        a training loop takes them at its next step boundary and goes on."""
        training = self._thread is not None and self._thread.is_alive()
        return self.copies.give(self.index, training, timeout_s)

    def _serve_copies(self) -> bool:
        return self.copies.serve(self.index)

    def import_state(self, state: dict[str, Any], data_position: int) -> dict[str, Any]:
        """Become a copy of a peer (before `start`), at `data_position` of this learner's own stream."""
        where = self.copies.take_peer(state, data_position)
        self.startup.seconds["copy_s"] = where["copy_s"]
        return where

    def import_global(
        self, global_state: tuple[list[np.ndarray], list[int]], data_position: int, step: int = 0
    ) -> dict[str, Any]:
        """No healthy peer: start from the syncer's global fragments at `data_position` and `step`.

        `global_state` is what the syncer's `global_fragments` returns, (fragments, versions), so
        the supervisor can hand one actor's answer to the other without waiting for it.
        """
        return self.copies.take_global(global_state, data_position, step)

    # -- slow-downs ---------------------------------------------------------------------------

    def set_slow(self, factor: float, seconds: float) -> None:
        """Stretch every step to `factor` times its natural length for `seconds`."""
        self.slowdown.set(factor, seconds)

    def _apply_slow(self, step_s: float) -> None:
        pause_s = self.slowdown.pause_s(step_s)
        if pause_s is not None:
            self.state = "slow"
            time.sleep(pause_s)
        elif self.state == "slow":
            self.state = "training"

    def stop(self) -> dict[str, Any]:
        """Stop the loop, send the progress not yet pushed, checkpoint; returns a final poll."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # a preempted learner's loop hands its progress over before it ends
        if self.state not in ("failed", "preempted"):
            self._hand_over(timeout_s=120)
            self.state = "stopped"
        return self.poll()

    def _hand_over(self, timeout_s: float) -> int:
        """Send the progress not yet pushed, wait until the syncer holds it, checkpoint; returns the pushes.

        Once only: nothing trains after a hand-over (the learner finished, leaves or stops), so a later
        call (a finished learner stopped at the run's end, or given a notice) has nothing to add."""
        assert self.index is not None, "a spare has nothing to hand over"
        if self._handed_over:
            return 0
        self._handed_over = True
        pushed = self.sync.push_outstanding()
        self.transport.drain(timeout_s=timeout_s)  # pushes still held by an emulated link go out first
        # The barrier follows the pushes on their channel, or in the syncer's one ordered concurrency
        # group, so when it returns the syncer holds every push: the driver's finish() cannot overtake them.
        self.link.barrier(timeout_s=timeout_s)
        self.reports.add([*pushed, events.FinalPush(learner=self.index, fragments=len(pushed))])
        self.save()
        return len(pushed)

    def _retire(self) -> None:
        """Tell the syncer, which holds every push of this learner's (its barrier returned), that it trained
        all its steps: the rounds stop asking it, and count its model as one that no longer moves."""
        # A syncer that died meanwhile: its successor retires this learner when it is handed over (`set_syncer`).
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(self.syncer.retire.remote(self.index), timeout=30)


def _in_actor() -> bool:
    """Whether this process is a Ray actor's (a worker driven in-process by a test leaves SIGTERM alone)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


# Ray's stubs type `remote` with task options only: its actor options (max_concurrency, concurrency_groups) are missing.
LearnerActor = ray.remote(max_concurrency=4, concurrency_groups={"deliveries": 1})(LearnerWorker)  # type: ignore[call-overload]
