"""The learner's side of the blocking baselines: data-parallel (dp) and blocking DiLoCo.

Both send a whole-model vector and then wait, doing nothing, for the global model of the next
version:
- dp: every step, the gradient of the loss on this learner's batch (the syncer averages the
  gradients and takes one AdamW step on the global model);
- diloco: every H inner steps, the outer gradient `anchor - theta` (the syncer averages them
  and takes an outer Nesterov step).
Adopting the global model of version v sets the learner's step to v * H, so every member of
the job stands at the same step. A learner that (re)starts waits for the syncer to admit it
and send the model before it computes anything. Time spent waiting is counted in `waiting_s`,
which the goodput ledger files as `waiting`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dlc.algo.blocking.messages import Contribution, GlobalModel
from dlc.algo.protocol import Traffic
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.core.fragments import FragmentPlan, shapes_of
from dlc.core.learner import Learner
from dlc.core.model import flatten_params, unflatten_params
from dlc.net.transport import RemoteMethod, Transport
from dlc.run import events


class BlockingLearnerSync:
    """Send every `every` steps, then wait for the next global model."""

    gradient = False  # dp sends gradients; diloco sends outer gradients

    def __init__(self, recipe: Recipe, learner: Learner, transport: Transport, syncer: Any, traffic: Traffic) -> None:
        self.learner = learner
        self.transport = transport
        self._push: RemoteMethod = syncer.push
        self.every = traffic.interval_steps
        self.host = flatten_params(learner.params)  # host copies: shapes for scatter, structure for unflatten
        self.like = unflatten_params(self.host, learner.params)
        self.plan = FragmentPlan.build(shapes_of(self.host), 1)
        self.codec = get_codec(traffic.up_codec, recipe.syncer.codec_block_values)
        self.down_codec = get_codec(traffic.down_codec)
        self.inbox: queue.SimpleQueue[GlobalModel] = queue.SimpleQueue()
        self.version: int | None = None  # None: not admitted yet, the next model is the first
        self.anchor: np.ndarray | None = None
        self.steps_since = 0
        self.tokens_since = 0
        self.seq = 0
        self.incarnation = 0
        self.pushes = 0
        self.adopted = 0
        self.discarded_steps = 0.0  # a barrier merges every learner's progress before it is adopted
        self._waited_s = 0.0
        self._waiting_since: float | None = None
        self.outstanding: Contribution | None = None  # sent, its version's model not yet received
        self.idle: Callable[[], object] | None = None  # called while waiting (serves peers' state copies)
        self.beat_at = float("-inf")  # its contributions are no heartbeats
        self._lock = threading.Lock()

    # -- the loop's step ---------------------------------------------------------------------

    def step(self, stop: threading.Event) -> list[events.Event]:
        """One step of the job: wait to be admitted if need be, compute, and send and wait when due."""
        happened: list[events.Event] = []
        if self.version is None:
            if not self._await_model(stop):
                return happened
            assert self.version is not None  # the model awaited came with its version
            happened.append(events.LearnerAdmitted(learner=self.learner.index, version=self.version))
        vector = self.local_step()
        self.steps_since += 1
        self.tokens_since += self.learner.tokens_per_step
        if vector is not None:
            happened.append(self._send(vector))
            self._await_model(stop)
        return happened

    def local_step(self) -> np.ndarray | None:
        """Train; return the vector to send when one is due."""
        raise NotImplementedError

    def flat(self, tree: Any) -> np.ndarray:
        return self.plan.gather(flatten_params(tree), 0)

    def _send(self, vector: np.ndarray) -> events.PushSent:
        """Send `vector` for the version held; returns the event for the run log."""
        assert self.version is not None
        contribution = Contribution(
            learner=self.learner.index,
            version=self.version,
            seq=self.seq,
            steps=self.steps_since,
            tokens=self.tokens_since,
            payload=self.codec.encode(vector),
            sent_at=time.time(),
        )
        with self._lock:
            self.outstanding = contribution
        self.transport.send(self._push, contribution, link=self.learner.index)
        self.seq += 1
        self.pushes += 1
        self.steps_since = self.tokens_since = 0
        return events.PushSent(
            learner=contribution.learner,
            fragment=0,  # the whole model, as the syncer's rounds and acceptances say
            version=contribution.version,
            seq=contribution.seq,
            steps=contribution.steps,
            bytes=contribution.payload.nbytes,
        )

    def _await_model(self, stop: threading.Event) -> bool:
        """Block until a global model newer than the one held arrives (or any, when not admitted)."""
        self._waiting_since = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    message = self.inbox.get(timeout=0.05)
                except queue.Empty:
                    if self.idle is not None:
                        self.idle()
                    continue
                if self.version is not None and message.version < self.version:
                    continue  # older than the model this learner holds
                # Newer: the step is done. The same version again: the syncer (re)admitted this
                # learner (a syncer restart, a thaw), so the step starts over from that model.
                self.adopt(message)
                return True
            return False
        finally:
            self._waited_s += time.monotonic() - self._waiting_since
            self._waiting_since = None

    @property
    def waiting_s(self) -> float:
        """Seconds spent waiting for the global model so far, the wait in progress included."""
        since = self._waiting_since
        return self._waited_s + (time.monotonic() - since if since is not None else 0.0)

    def adopt(self, message: GlobalModel) -> None:
        vector = self.down_codec.decode(message.payload)
        self.learner.set_params(unflatten_params(self.plan.assemble([vector], self.host), self.like))
        self.anchor = vector
        self.version = message.version
        self.learner.step = message.version * self.every
        self.steps_since = self.tokens_since = 0
        with self._lock:
            self.outstanding = None
        self.adopted += 1

    # -- the LearnerSync protocol ------------------------------------------------------------

    def receive(self, message: GlobalModel) -> None:
        self.inbox.put(message)

    def compile(self) -> None:
        self.learner.compile()

    def start_background(self) -> None:
        """Nothing runs off the loop's thread here."""

    def push_outstanding(self) -> list[events.Event]:
        """At the end of a run: send the steps not yet sent (diloco's last partial interval)."""
        if self.gradient or self.steps_since == 0 or self.version is None or self.outstanding is not None:
            return []
        return [self._send(self.outer_gradient())]

    def outer_gradient(self) -> np.ndarray:
        assert self.anchor is not None
        return self.anchor - self.flat(self.learner.params)

    def adopt_lag_steps(self) -> float | None:
        return 0.0 if self.adopted else None  # it waits for the merge of what it sent, at that step

    def unpushed_steps(self) -> float:
        return float(self.steps_since)

    def reconnect(self, push: RemoteMethod) -> int:
        """A new syncer: send to it from now on, and re-send the contribution it never answered."""
        self._push = push
        with self._lock:
            pending = self.outstanding
        if pending is None:
            return 0
        self.transport.send(push, pending, link=self.learner.index)
        return 1

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"version": self.version, "seq": self.seq}

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        self.seq = int(meta.get("seq", 0))  # the model itself comes from the syncer on admission

    def resume_from_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        pass  # a resumed learner is admitted by the syncer and sent the model

    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        self.version = None  # the peer's parameters are replaced by the model on admission

    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        self.version = None

    def peer_view(self) -> tuple[list[np.ndarray], list[int]]:
        return [self.flat(self.learner.params)], [self.version or 0]


class DataParallelSync(BlockingLearnerSync):
    gradient = True

    def compile(self) -> None:
        self.learner.compile_gradient()

    def local_step(self) -> np.ndarray:
        return self.flat(self.learner.compute_gradient())


class BlockingDiLoCoSync(BlockingLearnerSync):
    def local_step(self) -> np.ndarray | None:
        self.learner.train_step()
        if self.learner.step % self.every:
            return None
        self.learner.flush()
        return self.outer_gradient()
