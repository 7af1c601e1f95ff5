"""The learner actor: one Learner, its sync protocol and its training loop, in a Ray actor process.

Each learner is its own Ray actor process with its own JAX runtime. Its training loop runs in
a thread of the actor, so the actor's methods (deliveries of merged fragments, polls from the
driver, state copies for a rejoining peer) are served while it trains. The driver only talks to
actors with timeouts, because a frozen (SIGSTOPped) process never answers.

Start-up is in phases the live view shows: the process starts (the supervisor times it), the
step and the fragment functions are compiled or loaded from the persistent compilation cache (in
a thread of their own, begun at construction, so a copy from a peer overlaps it), the state is
copied from a peer, and the loop starts. A hot spare (index None) does all of that but the copy
and then idles, holding no data, until `take_slot` makes it a learner.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from multiprocessing.connection import AuthenticationError
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray

from dlc.algo.decoupled.messages import SEQ_STRIDE
from dlc.config.schema import Recipe
from dlc.core.runtime import (
    BackendError,
    CompileLog,
    compilation_cache_dir,
    enable_compilation_cache,
    freeze_heap,
    release_freed_memory,
    start_backend,
)
from dlc.engine.cluster import node_info
from dlc.engine.devices import learner_setup
from dlc.errors import UserError
from dlc.run.checkpoint import Checkpointer
from dlc.run.storage import RunStorage, describe

# Seconds a live syncer's direct channel may refuse a learner before the run fails with the reason.
_UNREACHABLE_S = 30.0


class _RayCalls:
    """syncer.channel=ray: the learner's messages to the syncer are calls of its actor's methods."""

    connected = True
    failure: str | None = None

    def __init__(self, syncer: Any) -> None:
        self.syncer = syncer

    @property
    def push(self) -> Any:
        return self.syncer.push

    def connect(self, syncer: Any, index: int | None) -> bool:
        self.syncer = syncer
        return True

    def heartbeat(self, index: int | None, step: int) -> None:
        self.syncer.heartbeat.remote(index, step)

    def barrier(self, timeout_s: float) -> None:
        ray.get(self.syncer.barrier.remote(), timeout=timeout_s)


class _Channel:
    """syncer.channel=direct: the learner's messages go on one socket to the syncer's channel
    (`dlc.net.channel`), connected when the loop starts and again whenever it breaks."""

    def __init__(self, receive: Any) -> None:
        from dlc.net.channel import Uplink

        self.uplink = Uplink(receive)
        self._unreachable: tuple[float, str] | None = None  # since when the syncer's channel refuses, and why
        self.failure: str | None = None  # why the run must fail: a live syncer refused it for too long

    @property
    def connected(self) -> bool:
        return self.uplink.connected

    @property
    def push(self) -> Any:
        return self.uplink

    def connect(self, syncer: Any, index: int | None) -> bool:
        """Connect to `syncer`'s channel, unless already connected to it; False if it cannot now.

        A syncer that is dead or restarting is waited for: the driver hands over the next one
        (`LearnerWorker.set_syncer`). A live syncer whose channel cannot be reached for
        `_UNREACHABLE_S` (a firewall between nodes) sets `failure`, which fails the run.
        """
        try:
            channel = ray.get(syncer.channel.remote(), timeout=60)
        except ray.exceptions.RayError:
            return False
        address = tuple(channel["address"])
        if self.uplink.connected and self.uplink.peer == (address, channel["authkey"]):
            return True
        try:
            self.uplink.connect(address, channel["authkey"], index)
        except (OSError, EOFError, AuthenticationError) as exc:
            since = self._unreachable[0] if self._unreachable else time.monotonic()
            self._unreachable = (since, f"{type(exc).__name__}: {exc}")
            if time.monotonic() - since > _UNREACHABLE_S:
                self.failure = (
                    f"learner {index} cannot reach the syncer at {address[0]}:{address[1]} for "
                    f"{_UNREACHABLE_S:.0f} s ({self._unreachable[1]}): with syncer.channel=direct every learner "
                    "connects to the syncer's node on a port it picks; open the nodes to each other, or set "
                    "syncer.channel=ray to send the messages as Ray calls"
                )
            return False
        self._unreachable = None
        return True

    def heartbeat(self, index: int | None, step: int) -> None:
        self.uplink.heartbeat(index, step)

    def barrier(self, timeout_s: float) -> None:
        self.uplink.barrier(timeout_s=timeout_s)


class LearnerWorker:
    """Lives in a learner actor: one Learner, its sync protocol, its loop thread."""

    def __init__(
        self,
        recipe_json: dict[str, Any],
        index: int | None,
        stream: np.ndarray | None,
        storage: dict[str, str],
        syncer: Any,
        incarnation: int = 0,
        requested_at: float | None = None,
    ) -> None:
        constructed = time.time()
        freeze_heap(collect=False)  # what the imports made; the rest once compiled (`_compile`)
        self.recipe = Recipe.model_validate(recipe_json)
        self.index = index
        self.incarnation = incarnation
        # Before anything is written: a node that cannot see the run's storage must not checkpoint
        # into a directory of the same name of its own (`ready` and `where` report it to the driver).
        self.node = node_info()
        self.storage = RunStorage(storage["location"])
        self.storage_error = self.storage.check(storage["token"], describe(self.node))
        # JAX's backend starts first: a GPU that fails (no CUDA plugin, out of memory) is reported
        # by `device_info`, `ready` and `poll` in one line, and nothing else is built.
        self.device: dict[str, str] = {}
        self.backend_error: str | None = None
        platform = learner_setup(self.recipe, index, {}).platform
        try:
            self.device = start_backend(
                platform,
                cpu_threads=self.recipe.learners.xla_threads(index),
                keep_memory=self.recipe.learners.keep_freed_memory,
            )
        except BackendError as exc:
            who = "hot spare" if index is None else f"learner {index}"
            self.backend_error = f"{who} (pid {os.getpid()}): {exc}"
            self.state, self.error = "failed", self.backend_error
            return
        if self.recipe.run.compile_cache:
            enable_compilation_cache(compilation_cache_dir(self.recipe.run.compile_cache_dir))
        self.compiles = CompileLog(cached=self.recipe.run.compile_cache)
        from dlc.algo import get_algorithm
        from dlc.core.learner import Learner
        from dlc.net.transport import Transport

        # Seconds of each start-up phase; "process_s" runs from the request to start this process.
        self.startup: dict[str, Any] = {}
        if requested_at is not None:
            self.startup["process_s"] = round(constructed - requested_at, 3)
        self.syncer = syncer
        # syncer.channel=direct: messages to and from the syncer go on one socket (`dlc.net.channel`),
        # connected when the loop starts; ray: they are calls of the syncer's and this actor's methods.
        self.link = _Channel(self._receive) if self.recipe.syncer.channel == "direct" else _RayCalls(syncer)
        self._link_lock = threading.Lock()
        self.learner = Learner(self.recipe, -1 if index is None else index, stream)
        learners = self.recipe.learners
        self.transport = Transport(lambda i: learners.resolved(i).link, seed=self.recipe.run.seed)  # the uplink
        self.algorithm = get_algorithm(self.recipe.algorithm)
        upstream = SimpleNamespace(push=self.link.push)
        self.sync = self.algorithm.learner_sync(self.recipe, self.learner, self.transport, upstream)
        self.sync.idle = self._serve_export  # a learner blocked on the others still serves state copies
        # Seqs never repeat across incarnations of one learner index, so a (learner, seq) pair
        # names one push for the whole run, also across syncer restarts.
        self.sync.seq = incarnation * SEQ_STRIDE
        self.sync.incarnation = incarnation
        self.checkpointer = None if index is None or self.storage_error else self._checkpointer(index)
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.state = "starting" if index is not None else "spare"
        self._compiled = threading.Event()
        self._copying = False
        self.loss: float | None = None
        self.rate = 0.0
        self.steady = 0.0
        self.base_tokens = 0
        self.error: str | None = None
        self._stop = threading.Event()
        # Seconds the loop stood still for something other than its own protocol: writing
        # checkpoints, and copying its state for a peer at a step boundary (the sync's own
        # waiting is its `waiting_s`). The goodput ledger files them as checkpoint and waiting.
        self.blocked_s = {"checkpoint": 0.0, "peer_copy": 0.0}
        self._export_requests: list[threading.Event] = []
        self._slow: tuple[float, float] = (1.0, 0.0)
        self._thread: threading.Thread | None = None
        self._heart: threading.Thread | None = None
        self._compiler = threading.Thread(target=self._compile, name="compile", daemon=True)
        self._compiler.start()

    def _checkpointer(self, index: int) -> Checkpointer:
        if self.storage_error:
            raise UserError(self.storage_error)
        return Checkpointer(self.storage.learner_dir(index), self.recipe.checkpoint.keep)

    def where(self) -> dict[str, Any]:
        """Its node, and why it cannot use the run's storage (None when it can)."""
        return {**self.node, "storage_error": self.storage_error}

    def _compile(self) -> None:
        """Compile (or load from the cache) every function the loop runs, before it runs."""
        started, log = time.monotonic(), self.compiles
        before = (sum(log.compiled.values()), log.cache_hits)
        try:
            self.sync.compile()
        except Exception:
            self.error = traceback.format_exc()
            self.state = "failed"
            return
        compiled, hits = sum(log.compiled.values()) - before[0], log.cache_hits - before[1]
        self.startup["compile_s"] = round(time.monotonic() - started, 3)
        self.startup["compiled_from"] = "cache" if compiled and hits == compiled else "xla" if not hits else "both"
        release_freed_memory()  # what compiling left free, which a process keeping freed memory would hold
        freeze_heap()  # start-up's objects live as long as the process: full collections skip them
        self._compiled.set()

    def current_phase(self) -> str | None:
        """What it is doing while it starts (compiling, loading compiled step, copying state, ready
        for a spare, starting); None once it trains."""
        if self.state not in ("starting", "spare"):
            return None
        if self._copying:
            return "copying state"
        if not self._compiled.is_set():
            return "compiling" if self.compiles.compiling else "loading compiled step"
        return "ready" if self.index is None else "starting"

    def device_info(self) -> dict[str, str]:
        """The device this process trains on: platform, device_kind and their label ('gpu: NVIDIA H100
        80GB HBM3', 'cpu'); raises the backend's error (a UserError) if JAX failed to start."""
        if self.backend_error:
            raise UserError(self.backend_error)
        return dict(self.device)

    def take_slot(self, index: int, stream: np.ndarray, incarnation: int) -> int:
        """A hot spare becomes learner `index` (a new incarnation) with its data stream; returns its pid."""
        if self.index is not None:
            raise RuntimeError(f"learner {self.index} is no spare")
        self.index, self.incarnation = index, incarnation
        self.learner.rebind(index, self.recipe, stream)
        self.sync.seq = incarnation * SEQ_STRIDE
        self.sync.incarnation = incarnation
        self.checkpointer = self._checkpointer(index)
        self.state = "starting"
        self.startup = {"spare": True, **self.startup}
        return os.getpid()

    def restore(self, next_seq: int = 0) -> dict[str, Any]:
        """Load this learner's checkpoint, if any; returns its step, data position and incarnation.

        `next_seq` is the lowest seq the restored syncer has not seen from this learner: after a
        hard stop its checkpoint is older than the syncer's, and a seq reused would be refused as a
        duplicate. The incarnation is the one those seqs belong to, so a later restart numbers its
        pushes above every earlier process's.
        """
        found = self.checkpointer.latest_step() is not None
        if found:
            tree, meta = self.checkpointer.restore(self.checkpoint_tree())
            self.learner.load_state(tree["learner"], meta)
            self.sync.load(tree["sync"], meta["sync"])
        self.sync.seq = max(self.sync.seq, next_seq)
        self.incarnation = self.sync.incarnation = self.sync.seq // SEQ_STRIDE
        return {
            "step": self.learner.step,
            "data_position": self.learner.position,
            "incarnation": self.incarnation,
            "checkpoint": found,
        }

    def checkpoint_tree(self) -> dict[str, Any]:
        return {"learner": self.learner.state_tree(), "sync": self.sync.state()[0]}

    def save(self) -> None:
        self.learner.flush()
        meta = {**self.learner.state_meta(), "sync": self.sync.state()[1]}
        self.checkpointer.save(self.learner.step, self.checkpoint_tree(), meta)

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
        interval = self.recipe.syncer.heartbeat_interval_s
        while not self._stop.wait(interval):
            if not self.link.connected:
                self._reconnect()
            if time.monotonic() - self.sync.beat_at >= interval:
                self.link.heartbeat(self.index, self.learner.step)

    def _try_connect(self) -> bool:
        """Connect to the syncer (channel=direct: its channel; always at once for channel=ray);
        False if it cannot now (hold _link_lock). A live syncer that refuses too long fails the run."""
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

    def _loop(self) -> None:
        recipe, learner = self.recipe, self.learner
        max_steps = recipe.run.max_steps
        window: list[tuple[float, int]] = []
        first: tuple[float, int] | None = None
        self._compiler.join()
        if self.error:
            return
        try:
            while not self._stop.is_set() and (max_steps is None or learner.step < max_steps):
                started, waited = time.monotonic(), self.sync.waiting_s
                events = self.sync.step(self._stop)
                self._apply_slow(time.monotonic() - started - (self.sync.waiting_s - waited))
                copying = time.monotonic()
                if self._serve_export():
                    self.blocked_s["peer_copy"] += time.monotonic() - copying
                if learner.step % recipe.checkpoint.every_steps == 0:
                    saving = time.monotonic()
                    self.save()
                    release_freed_memory()  # what writing the checkpoint left free
                    self.blocked_s["checkpoint"] += time.monotonic() - saving
                    events.append({"kind": "checkpoint_saved", "learner": self.index, "step": learner.step})
                now = time.monotonic()
                if first is None:  # start-up ends with the first step
                    first = (now, learner.tokens)
                    self.state = "training"
                    events.append(
                        {
                            "kind": "learner_training",
                            "learner": self.index,
                            "incarnation": self.incarnation,
                            "device": self.device["device"],
                            **self.startup,
                        }
                    )
                self.steady = (learner.tokens - first[1]) / (now - first[0]) if now > first[0] else 0.0
                window.append((now, learner.tokens))
                while len(window) > 2 and now - window[0][0] > 5.0:
                    window.pop(0)
                rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]) if len(window) > 1 else 0.0
                with self.lock:
                    self.events.extend(events)
                    self.rate = rate
                self._log_records()
            learner.flush()
            self._log_records()
            self.state = "finished"
        except Exception:  # reported to the driver, which fails the run with this text
            self.error = traceback.format_exc()
            self.state = "failed"

    def _log_records(self) -> None:
        every = self.recipe.run.log_every_steps
        with self.lock:
            for record in self.learner.take_records():
                self.loss = record.loss
                if record.step % every == 0:
                    self.metrics.append(
                        {
                            "kind": "train",
                            "learner": self.index,
                            "step": record.step,
                            "tokens": record.tokens,
                            "loss": record.loss,
                            "grad_norm": record.grad_norm,
                            "tokens_per_s": round(self.rate, 1),
                        }
                    )

    def poll(self) -> dict[str, Any]:
        if self.backend_error:
            snapshot = {"id": self.index, "state": "failed", "phase": None, "startup": {}, "pid": os.getpid()}
            return {"snapshot": snapshot, "events": [], "metrics": [], "error": self.backend_error}
        with self.lock:
            events, self.events = self.events, []
            metrics, self.metrics = self.metrics, []
            return {"snapshot": self.snapshot(), "events": events, "metrics": metrics, "error": self.error}

    def snapshot(self) -> dict[str, Any]:
        return {
            "id": self.index,
            "state": self.state,
            "step": self.learner.step,
            "tokens": self.learner.tokens - self.base_tokens,
            "tokens_per_s": round(self.rate, 1),
            "steady_tokens_per_s": round(self.steady, 1),
            "loss": self.loss,
            "data_position": self.learner.position,
            "phase": self.current_phase(),
            "startup": dict(self.startup),
            "tokens_per_step": self.learner.tokens_per_step,
            "unpushed_steps": self.sync.unpushed_steps(),
            "pushes": self.sync.pushes,
            "adopted": self.sync.adopted,
            "bytes_sent": self.transport.bytes_sent,
            "waiting_s": round(self.sync.waiting_s + self.blocked_s["peer_copy"], 3),
            "checkpoint_s": round(self.blocked_s["checkpoint"], 3),
            "link_queued": self.transport.queued(),
            "link_blocked_s": round(self.transport.blocked_s(), 3),
            "pid": os.getpid(),
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
        """The syncer was restarted: talk to the new one and re-send what it never acknowledged."""
        with self._link_lock:
            self.syncer = syncer
            if not self._try_connect():  # the heartbeat thread connects and re-sends when it can
                return 0
            return self.sync.reconnect(self.link.push)

    def impair_link(self, factor: float | None, seconds: float) -> None:
        """Degrade this learner's uplink by `factor` (None: cut it) for `seconds`."""
        self.transport.impair(self.index, factor, seconds)

    def ready(self) -> int:
        """Answers once the actor is constructed; returns its pid. UserError if its backend failed to start
        or its node cannot see the run's storage."""
        if self.backend_error:
            raise UserError(self.backend_error)
        if self.storage_error:
            raise UserError(self.storage_error)
        return os.getpid()

    # -- serving a state copy to a rejoining peer, without pausing ----------------------------

    def export_state(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Host copies of params, AdamW state, anchors, versions, step and data position.

        Called from another thread: the training loop takes the copy at its next step
        boundary (a device-to-host copy, milliseconds) and goes on training; serialising and
        sending it to the new learner happen here, off the loop.
        """
        import jax

        if self._thread is None or not self._thread.is_alive():  # not training: copy directly
            return self._copy_state(jax)
        request = threading.Event()
        with self.lock:
            self._export_requests.append(request)
        if not request.wait(timeout_s):
            raise TimeoutError(f"learner {self.index} did not reach a step boundary in {timeout_s} s")
        return request.state  # type: ignore[attr-defined]

    def _serve_export(self) -> bool:
        """Copy the state for every peer that asked since the last step; returns whether any had."""
        if not self._export_requests:
            return False
        import jax

        with self.lock:
            requests, self._export_requests = self._export_requests, []
        state = self._copy_state(jax)
        for request in requests:
            request.state = state  # type: ignore[attr-defined]
            request.set()
        return True

    def _copy_state(self, jax: Any) -> dict[str, Any]:
        self.learner.flush()
        fragments, versions = self.sync.peer_view()
        return {
            "from": self.index,
            "tree": jax.device_get(self.learner.state_tree()),
            "meta": self.learner.state_meta(),
            "fragments": fragments,
            "versions": versions,
            "copied_at": time.time(),
        }

    def import_state(self, state: dict[str, Any], data_position: int) -> dict[str, Any]:
        """Become a copy of a peer (before `start`): its params, AdamW state and step, at
        `data_position` of this learner's own stream (where its previous process had got to).

        The anchors become the copied parameters, not the peer's anchors: the peer will push
        its own unsent progress itself, so this learner's first push must carry only what it
        learns from now on. The peer's data position is a place in the peer's stream: taken on
        this learner's stream it would repeat or skip part of its shard.
        """
        self._copying = True
        try:
            self.learner.load_state(state["tree"], {**state["meta"], "data_position": data_position})
            self.base_tokens = self.learner.tokens  # the peer's tokens are the peer's, not this learner's
            self.sync.adopt_peer(state["fragments"], state["versions"])
        finally:
            self._copying = False
        copy_s = round(time.time() - state["copied_at"], 3)
        self.startup["copy_s"] = copy_s
        return {
            "peer": state["from"],
            "step": self.learner.step,
            "data_position": self.learner.position,
            "copy_s": copy_s,
        }

    def import_global(
        self, global_state: tuple[list[np.ndarray], list[int]], data_position: int, step: int = 0
    ) -> dict[str, Any]:
        """No healthy peer: start from the syncer's global fragments with fresh AdamW state, at
        `data_position` of this learner's own stream and at `step`, where its previous process had
        got to (so it does not train the run's steps all over again).

        `global_state` is what the syncer's `global_fragments` returns, (fragments, versions), so
        the supervisor can hand one actor's answer to the other without waiting for it.
        """
        fragments, versions = global_state
        self.sync.adopt_global(fragments, versions)
        self.learner.stream.position = data_position
        self.learner.step = step
        return {"peer": None, "step": self.learner.step, "data_position": self.learner.position}

    # -- slow-downs ---------------------------------------------------------------------------

    def set_slow(self, factor: float, seconds: float) -> None:
        """Stretch every step to `factor` times its natural length for `seconds`."""
        self._slow = (factor, time.monotonic() + seconds)

    def _apply_slow(self, step_s: float) -> None:
        factor, until = self._slow
        if factor > 1.0 and time.monotonic() < until:
            self.state = "slow"
            time.sleep((factor - 1.0) * step_s)
        elif self.state == "slow":
            self.state = "training"

    def stop(self) -> dict[str, Any]:
        """Stop the loop, send the progress not yet pushed, checkpoint; returns a final poll."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.state != "failed":
            pushed = self.sync.push_outstanding()
            self.transport.drain(timeout_s=120)  # pushes still held by an emulated link go out first
            # The barrier follows the pushes on their channel, or in the syncer's one ordered
            # concurrency group, so when it returns the syncer holds every push: the driver's
            # finish() cannot overtake them.
            self.link.barrier(timeout_s=120)
            with self.lock:
                self.events.extend(pushed)
                self.events.append({"kind": "final_push", "learner": self.index, "fragments": len(pushed)})
            self.save()
            self.state = "stopped"
        return self.poll()


LearnerActor = ray.remote(max_concurrency=4, concurrency_groups={"deliveries": 1})(LearnerWorker)
