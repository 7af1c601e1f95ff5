"""A learner's state copied between processes: out to a rejoining peer, in from a peer or the global model.

A dead learner's new process copies a healthy peer's parameters, AdamW state, step and fragment
versions (`take_peer`), or, when no peer is healthy, the syncer's global fragments with fresh
AdamW state (`take_global`). The peer does not pause for it: its training loop takes the copy at
its next step boundary (`serve`, a device-to-host copy of milliseconds) and goes on, while the
actor call that asked (`give`) serialises and sends it from another thread.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dlc.algo.protocol import LearnerSync
    from dlc.core.learner import Learner


class _Request:
    """A peer's request for a copy, answered by the training loop at its next step boundary."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.state: dict[str, Any] = {}


class StateCopy:
    """Copies of one learner's state, for its peers and from them."""

    def __init__(self, learner: Learner, sync: LearnerSync) -> None:
        self.learner = learner
        self.sync = sync
        self.copying = False  # a peer's copy is being loaded: the live view says "copying state"
        # Tokens the copied state had trained: the peer's, not this learner's (its counters start here).
        self.base_tokens = 0
        self._lock = threading.Lock()
        self._requests: list[_Request] = []

    def give(self, index: int | None, training: bool, timeout_s: float) -> dict[str, Any]:
        """Host copies of learner `index`'s params, AdamW state, anchors, versions, step and data position.

        Called from another thread than the loop's: a loop that trains copies at its next step boundary;
        one that does not (not started, or over) is copied at once.
        """
        if not training:
            return self._copy(index)
        request = _Request()
        with self._lock:
            self._requests.append(request)
        if not request.done.wait(timeout_s):
            raise TimeoutError(f"learner {index} did not reach a step boundary in {timeout_s} s")
        return request.state

    def serve(self, index: int | None) -> bool:
        """Copy the state for every peer that asked since the last step; returns whether any had."""
        if not self._requests:
            return False
        with self._lock:
            requests, self._requests = self._requests, []
        state = self._copy(index)
        for request in requests:
            request.state = state
            request.done.set()
        return True

    def _copy(self, index: int | None) -> dict[str, Any]:
        import jax

        self.learner.flush()
        fragments, versions = self.sync.peer_view()
        return {
            "from": index,
            "tree": jax.device_get(self.learner.state_tree()),
            "meta": self.learner.state_meta(),
            "fragments": fragments,
            "versions": versions,
            "copied_at": time.time(),
        }

    def take_peer(self, state: dict[str, Any], data_position: int) -> dict[str, Any]:
        """Become a copy of a peer (before the loop starts): its params, AdamW state and step, at
        `data_position` of this learner's own stream (where its previous process had got to).

        The anchors become the copied parameters, not the peer's anchors: the peer will push
        its own unsent progress itself, so this learner's first push must carry only what it
        learns from now on. The peer's data position is a place in the peer's stream: taken on
        this learner's stream it would repeat or skip part of its shard.
        """
        self.copying = True
        try:
            self.learner.load_state(state["tree"], {**state["meta"], "data_position": data_position})
            self.base_tokens = self.learner.tokens
            self.sync.adopt_peer(state["fragments"], state["versions"])
        finally:
            self.copying = False
        return {
            "peer": state["from"],
            "step": self.learner.step,
            "data_position": self.learner.position,
            "copy_s": round(time.time() - state["copied_at"], 3),
        }

    def take_global(
        self, global_state: tuple[list[np.ndarray], list[int]], data_position: int, step: int
    ) -> dict[str, Any]:
        """No healthy peer: the syncer's global fragments with fresh AdamW state, at `data_position`
        of this learner's own stream and at `step`, where its previous process had got to (so it
        does not train the run's steps all over again)."""
        fragments, versions = global_state
        self.sync.adopt_global(fragments, versions)
        self.learner.stream.position = data_position
        self.learner.step = step
        return {"peer": None, "step": self.learner.step, "data_position": self.learner.position}
