"""The learner's side of Decoupled DiLoCo: answer the syncer's requests, adopt merged fragments.

The syncer owns the schedule. After every inner step the host loop calls `after_step`. For each
fragment p the syncer asked for since the last step, it sends the outer gradient
`anchor[p] - theta[p]` (compressed) with the steps and tokens done since then, and keeps
training. A merged fragment that arrives is adopted at the first step boundary at least `tau`
steps after the learner sent p (at once if it did not send), and becomes the new anchor. The
anchor moves only on adoption, so two pushes from one anchor are cumulative; the syncer's round
book relies on that. Merged fragments sent as differences are resolved against the version of
p this learner holds, in version order, as they arrive.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment, Push
from dlc.algo.protocol import Traffic
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.core.fragments import FragmentPlan
from dlc.core.learner import Learner
from dlc.core.model import ParamView
from dlc.net.transport import RemoteMethod, Transport


@dataclass
class SentRecord:
    step: int
    theta: np.ndarray  # theta[p] at send, for adopt=rebase


class DecoupledLearnerSync:
    """Per-learner protocol state: anchors, versions, counters since the last push."""

    def __init__(
        self,
        recipe: Recipe,
        learner: Learner,
        plan: FragmentPlan,
        transport: Transport,
        push: RemoteMethod,
        traffic: Traffic,
    ) -> None:
        cfg = recipe.syncer
        self.learner = learner
        self.plan = plan
        self.view = ParamView(learner.params)
        self.codec = get_codec(traffic.up_codec, cfg.codec_block_values)
        self.transport = transport
        self._push = push
        self.tau = cfg.overlap_steps
        self.adopt_mode, self.mix_alpha = cfg.adopt, cfg.mix_alpha
        P = plan.num_fragments
        self.anchors = [self.gather(p) for p in range(P)]
        self.versions = [0] * P
        self.steps_since = [0] * P
        self.tokens_since = [0] * P
        self.seq = 0
        self.sent: dict[int, SentRecord] = {}
        self.inbox: queue.SimpleQueue[MergedFragment | FragmentRequest] = queue.SimpleQueue()
        self.waiting: dict[int, tuple[int, np.ndarray]] = {}  # fragment -> (version, value) to adopt
        # The newest global value of each fragment received (version, value), whatever was adopted:
        # the base of a difference sent down. None: not known (after a copy from a peer).
        self.held: list[tuple[int, np.ndarray] | None] = []
        self.parked: dict[int, dict[int, MergedFragment]] = {}  # differences waiting for their base
        self._hold_known()
        self.requests = 0
        self.pushes = 0
        self.adopted = 0
        self.max_staleness = cfg.max_staleness
        # Pushes the syncer has not acknowledged (by listing them in a merged fragment), kept to
        # re-send to a restarted syncer. Guarded: pushes come from the loop thread, acks too
        # (they are processed in after_step), reconnect from an actor thread.
        self.unacked: dict[int, Push] = {}
        self._unacked_lock = threading.Lock()

    # -- parameter access ---------------------------------------------------------------------

    def _names(self, p: int) -> list[str]:
        return list(dict.fromkeys(piece.name for piece in self.plan.pieces(p)))

    def gather(self, p: int) -> np.ndarray:
        return self.plan.gather(self.view.read(self.learner.params, self._names(p)), p)

    def scatter(self, p: int, vector: np.ndarray) -> None:
        tensors = self.view.read(self.learner.params, self._names(p))
        self.plan.scatter(tensors, p, vector)
        self.learner.params = self.view.write(self.learner.params, tensors)

    # -- the protocol -------------------------------------------------------------------------

    waiting_s = 0.0  # never blocks: pushes go out and merged fragments come in while it trains
    idle = None

    def step(self, stop: threading.Event) -> list[dict[str, Any]]:
        self.learner.train_step()
        return self.after_step()

    def receive(self, msg: MergedFragment | FragmentRequest) -> None:
        """Called from another thread when the syncer asks for a fragment or delivers a merged one."""
        self.inbox.put(msg)

    def after_step(self) -> list[dict[str, Any]]:
        """Push what the syncer asked for, adopt what is due; returns events for the run log."""
        for p in range(self.plan.num_fragments):
            self.steps_since[p] += 1
            self.tokens_since[p] += self.learner.tokens_per_step
        requested: list[int] = []
        while not self.inbox.empty():
            msg = self.inbox.get()
            if isinstance(msg, FragmentRequest):
                self.requests += 1
                if msg.fragment not in requested:
                    requested.append(msg.fragment)
                continue
            self._acknowledge(msg)
            for version, value in self._resolve(msg):
                newest = self.waiting.get(msg.fragment)
                if version > self.versions[msg.fragment] and (newest is None or version > newest[0]):
                    self.waiting[msg.fragment] = (version, value)
        # Push before adopting: a fragment asked for now sends its progress since the old anchor,
        # instead of having it replaced by a merge that does not contain it.
        events = [self.push(p) for p in requested if self.steps_since[p] > 0]
        for p, (version, value) in list(self.waiting.items()):
            sent = self.sent.get(p)
            if sent is None or self.learner.step >= sent.step + self.tau:
                self.adopt(p, version, value)
                del self.waiting[p]
        return events

    def _resolve(self, msg: MergedFragment) -> list[tuple[int, np.ndarray]]:
        """The global values (version, value) this message makes known, in version order: none
        when it is a difference whose base has not arrived yet (it waits for it), and more than
        one when it was the base differences parked here were waiting for."""
        p = msg.fragment
        out = []
        while msg is not None:
            codec = get_codec(msg.payload.codec, msg.payload.block_size or 64)
            if msg.base_version is None:
                if self.held[p] is not None and msg.version <= self.held[p][0]:
                    break  # an older value overtaken by a newer one: keep the newer
                value = codec.decode(msg.payload)
            else:
                held = self.held[p]
                if held is None or held[0] != msg.base_version:
                    if held is None or msg.base_version > held[0]:  # its base is still on the way
                        self.parked.setdefault(p, {})[msg.base_version] = msg
                    break
                value = held[1] + codec.decode(msg.payload)
            self.held[p] = (msg.version, value)
            out.append((msg.version, value))
            parked = self.parked.get(p, {})
            for base in [b for b in parked if b < msg.version]:  # bases this value superseded
                del parked[base]
            msg = parked.pop(msg.version, None)
        return out

    def adopt(self, p: int, version: int, global_p: np.ndarray) -> None:
        """Take `global_p`, fragment p's global value at `version`, as parameters (by the adopt
        mode) and as the new anchor."""
        sent = self.sent.get(p)
        if self.adopt_mode == "replace":
            new = global_p
        elif self.adopt_mode == "mix":
            new = self.mix_alpha * self.gather(p) + (1.0 - self.mix_alpha) * global_p
        else:  # rebase: keep the local progress made since p was sent
            new = global_p if sent is None else global_p + (self.gather(p) - sent.theta)
        self.scatter(p, new.astype(np.float32))
        if self.adopt_mode == "replace" or (self.adopt_mode == "rebase" and sent is None):
            # The local progress on p is gone: the next push counts from here.
            self.steps_since[p] = self.tokens_since[p] = 0
        self.anchors[p] = global_p
        self.versions[p] = version
        self.sent.pop(p, None)
        self.adopted += 1

    def push(self, p: int) -> dict[str, Any]:
        """Send fragment p's outer gradient; returns the event for the run log."""
        theta = self.gather(p)
        payload = self.codec.encode(self.anchors[p] - theta)
        push = Push(
            learner=self.learner.index,
            fragment=p,
            base_version=self.versions[p],
            steps=self.steps_since[p],
            tokens=self.tokens_since[p],
            seq=self.seq,
            payload=payload,
            sent_at=time.time(),
        )
        with self._unacked_lock:
            self.unacked[push.seq] = push
        nbytes = self.transport.send(self._push, push, link=self.learner.index)
        self.seq += 1
        self.pushes += 1
        self.sent[p] = SentRecord(self.learner.step, theta)
        self.steps_since[p] = self.tokens_since[p] = 0
        return {
            "kind": "push_sent",
            "learner": push.learner,
            "fragment": p,
            "base_version": push.base_version,
            "seq": push.seq,
            "bytes": nbytes,
            "step": self.learner.step,
        }

    def unpushed_steps(self) -> float:
        """Steps of progress not yet sent, averaged over fragments (what a crash now would lose)."""
        return sum(self.steps_since) / len(self.steps_since)

    def _acknowledge(self, msg: MergedFragment) -> None:
        """Drop pushes of this fragment the round merged (a merged push holds this learner's earlier
        pushes of the fragment), and ones too stale to be accepted any more."""
        mine = [seq for learner, seq in msg.merged if learner == self.learner.index]
        with self._unacked_lock:
            for seq, push in list(self.unacked.items()):
                if push.fragment != msg.fragment:
                    continue
                if (mine and seq <= max(mine)) or msg.version - push.base_version > self.max_staleness:
                    del self.unacked[seq]

    def reconnect(self, push: RemoteMethod) -> int:
        """Send future pushes to `push`, and re-send every unacknowledged one there, in order."""
        self._push = push
        with self._unacked_lock:
            pending = [self.unacked[seq] for seq in sorted(self.unacked)]
        for item in pending:
            self.transport.send(push, item, link=self.learner.index)
        return len(pending)

    def push_outstanding(self) -> int:
        """At the end of a run: push every fragment with progress not yet sent; returns how many."""
        due = [p for p in range(self.plan.num_fragments) if self.steps_since[p] > 0]
        for p in due:
            self.push(p)
        return len(due)

    # -- state --------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tree = {"anchors": {str(p): a for p, a in enumerate(self.anchors)}}
        meta = {
            "versions": self.versions,
            "steps_since": self.steps_since,
            "tokens_since": self.tokens_since,
            "seq": self.seq,
        }
        return tree, meta

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        self.anchors = [np.asarray(tree["anchors"][str(p)], dtype=np.float32) for p in range(self.plan.num_fragments)]
        self.versions = list(meta["versions"])
        self.steps_since = list(meta["steps_since"])
        self.tokens_since = list(meta["tokens_since"])
        self.seq = int(meta["seq"])
        self._hold_known()

    def _hold_known(self) -> None:
        """Forget what was received: only version 0, the initial parameters, is sure to be what a
        downlink by difference starts from; other versions arrive whole first."""
        self.held = [(0, a) if v == 0 else None for a, v in zip(self.anchors, self.versions, strict=True)]
        self.parked.clear()

    def peer_view(self) -> tuple[list[np.ndarray], list[int]]:
        """This learner's current fragments and versions, for a peer that copies it."""
        return [self.gather(p) for p in range(self.plan.num_fragments)], list(self.versions)

    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        """Take the global fragments as parameters and anchors (a learner with no peer to copy)."""
        for p, fragment in enumerate(fragments):
            self.scatter(p, np.asarray(fragment, dtype=np.float32))
        self.rebase_on_global(fragments, versions)

    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        """After copying a peer's parameters: anchors are those parameters, at the peer's versions."""
        self.anchors = [np.asarray(f, dtype=np.float32).copy() for f in fragments]
        self.versions = list(versions)
        self.steps_since = [0] * self.plan.num_fragments
        self.tokens_since = [0] * self.plan.num_fragments
        self.sent.clear()
        self.waiting.clear()
        self.held = [None] * self.plan.num_fragments  # a peer's parameters are no global version
        self.parked.clear()

    def rebase_on_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        """After a resume: anchors become the syncer's current global fragments.

        The learner keeps its own parameters; its next deltas measure how far it is from the
        global model, which is exactly the progress the syncer has not seen.
        """
        self.anchors = [np.asarray(f, dtype=np.float32).copy() for f in fragments]
        self.versions = list(versions)
        self.sent.clear()
        self.waiting.clear()
        self._hold_known()
