"""The learner's side of Decoupled DiLoCo: answer the syncer's requests, adopt merged fragments.

The syncer owns the schedule. After every inner step the host loop calls `after_step`. For each
fragment p the syncer asked for since the last step, it sends the outer gradient
`anchor[p] - theta[p]` (compressed) with the steps and tokens done since then, and keeps
training. A merged fragment that arrives is adopted at the first step boundary at least `tau`
steps after the learner sent p (at once if it did not send), and becomes the new anchor. The
anchor moves only on adoption, so two pushes from one anchor are cumulative; the syncer's round
book relies on that. A rebase keeps the progress the adopted version does not hold: it rebases on
the newest of this learner's pushes the version merged (on the anchor when it merged none), and a
push still in flight after it is where the next push counts from, so no progress is sent twice.
Merged fragments sent as differences are resolved against the version of p this learner holds, in
version order, as they arrive (`received.ReceivedFragments`).

The step loop never waits for the device or the network (`dlc.core.fragment_ops`): a push is one
jitted extraction dispatched after the step, whose result a sender thread copies to the host and
sends; a merged fragment is decoded, padded and (on a GPU) put on the device by the thread that
receives it, and swapped in at a step boundary by one jitted, donating write. The one wait: a
boundary where a merge falls due and has not arrived waits for the step in flight before it
dispatches the next (`_last_call`), so a round gets its tau steps of time. With
`background=False` (the in-process twin, tests) the same work happens inline, in order.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from dlc.algo.decoupled.lr_feedback import LeafFactors
from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment, Push
from dlc.algo.decoupled.received import ReceivedFragments
from dlc.algo.protocol import Traffic
from dlc.config.schema import Recipe
from dlc.core.fragment_ops import FragmentOps
from dlc.core.fragments import FragmentPlan
from dlc.core.learner import Learner
from dlc.core.model import ParamView
from dlc.net.transport import RemoteMethod, Transport
from dlc.run import events


@dataclass
class SentRecord:
    """A push of a fragment not yet merged into an adopted version."""

    step: int
    theta: jax.Array  # theta[p] at send, padded, on the device: for adopt=rebase
    seq: int = -1
    base_version: int = 0
    steps: int = 0  # inner steps and tokens it carried beyond the push before it
    tokens: int = 0


@dataclass(frozen=True)
class Arrived:
    """A merged fragment made known by a delivery, ready for the write (`FragmentOps.to_device`)."""

    fragment: int
    version: int
    value: jax.Array | np.ndarray  # padded to the ops' length


@dataclass(frozen=True)
class Outgoing:
    """A push whose payload is still on the device (or on its way to the host)."""

    fragment: int
    base_version: int
    steps: int
    tokens: int
    seq: int
    payload: Any
    scales: Any
    step: int  # the learner's inner step at dispatch


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
        self.ops = FragmentOps(
            plan, learner.params, traffic.up_codec, cfg.codec_block_values, placement=learner.placement
        )
        self.transport = transport
        self._push = push
        self.tau = cfg.overlap_steps
        self.adopt_mode, self.mix_alpha = cfg.adopt, cfg.mix_alpha
        P = plan.num_fragments
        self.anchors = [self.ops.to_device(p, self.gather(p)) for p in range(P)]  # padded (`to_device`)
        self.versions = [0] * P
        self.steps_since = [0] * P
        self.tokens_since = [0] * P
        # Inner steps of local progress on each fragment still in the parameters and not yet pushed:
        # `steps_since` less what adoptions took away (a `mix` keeps mix_alpha of it, a replace none).
        self.unsent_steps = [0.0] * P
        self.seq = 0
        self.incarnation = 0
        # Each fragment's pushes in flight, oldest first, and where its next push counts from while
        # one is still in flight after an adoption (the newest one's theta; otherwise the anchor).
        self.sent: dict[int, list[SentRecord]] = {}
        self.counts_from: dict[int, jax.Array] = {}
        # (fragment, version) -> the newest of this learner's seqs that version merged. Under _lock.
        self.merged_mine: dict[tuple[int, int], int] = {}
        self.inbox: queue.SimpleQueue[Arrived | FragmentRequest] = queue.SimpleQueue()
        # fragment -> (version, value) to adopt
        self.waiting: dict[int, tuple[int, jax.Array | np.ndarray]] = {}
        # The newest global value of each fragment received, whatever was adopted: the base of a
        # difference sent down. Guarded by _lock, with `unacked`: deliveries come from another thread.
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.received = ReceivedFragments([self.gather(p) for p in range(P)], self.versions)
        self.requests = 0
        self.pushes = 0
        self.adopted = 0
        # Inner steps from each push to the adoption of the first version that merged it, summed over
        # the adoptions of such a version, and their count: the merge lag, at least tau.
        self.lag_steps = 0
        self.lagged = 0
        # Inner steps of progress adoptions threw away, in whole-model steps: a fragment's unsent
        # progress counts by the fragment's share of the model, and by the share of it the adopt
        # mode drops (replace all, mix 1 - mix_alpha, rebase none).
        self.discarded_steps = 0.0
        self.max_staleness = cfg.max_staleness
        # Pushes the syncer has not acknowledged (by listing them in a merged fragment), kept to
        # re-send to a restarted syncer.
        self.unacked: dict[int, Push] = {}
        self.background = False
        self._outbox: queue.Queue[Outgoing] = queue.Queue()
        self._sender: threading.Thread | None = None
        self.failure: str | None = None  # what broke the sender thread, raised in the loop
        self.beat_at = float("-inf")  # when a push last doubled as a heartbeat (time.monotonic)
        self.factors = LeafFactors.for_learner(plan, learner, recipe.lr_feedback())

    # -- parameter access (host copies: for state copies and checkpoints, never per step) -----

    def _names(self, p: int) -> list[str]:
        return list(dict.fromkeys(piece.name for piece in self.plan.pieces(p)))

    def gather(self, p: int) -> np.ndarray:
        return self.plan.gather(self.view.read(self.learner.params, self._names(p)), p)

    def scatter(self, p: int, vector: np.ndarray) -> None:
        self.learner.params = self.ops.write(self.learner.params, p, self.ops.to_device(p, vector))

    def compile(self) -> None:
        """Compile the step and both fragment functions now (or load them from the cache)."""
        self.learner.compile()
        self.ops.compile(self.learner.params)

    # -- threads ------------------------------------------------------------------------------

    def start_background(self) -> None:
        """From now on pushes are sent, and deliveries decoded, off the step loop's thread."""
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, name="sender", daemon=True)
            self._sender.start()
        self.background = True

    def _send_loop(self) -> None:  # a daemon thread: it ends with the process
        while True:
            item = self._outbox.get()
            try:
                self._send(item)
            except Exception:  # the loop raises it at its next step
                self.failure = traceback.format_exc()
            finally:
                self._outbox.task_done()

    def _send(self, item: Outgoing) -> None:
        payload = self.ops.encoded(item.fragment, item.payload, item.scales)  # waits for the device
        index = self.learner.index
        beat = self.transport.immediate(index)  # arrives now: it tells the syncer the learner lives
        push = Push(
            learner=index,
            fragment=item.fragment,
            base_version=item.base_version,
            steps=item.steps,
            tokens=item.tokens,
            seq=item.seq,
            payload=payload,
            sent_at=time.time(),
            incarnation=self.incarnation,
            step=item.step if beat else None,
        )
        # One ordered stream of sends, also against a reconnect re-sending; deliveries (only `_lock`) never wait.
        with self._send_lock:
            with self._lock:
                self.unacked[push.seq] = replace(push, step=None)  # a re-send is no heartbeat
            self.transport.send(self._push, push, link=index)
            if beat:
                self.beat_at = time.monotonic()

    def flush_sends(self) -> None:
        """Wait until every push dispatched so far has been handed to the transport."""
        if self._sender is not None:
            self._outbox.join()
        if self.failure:
            raise RuntimeError(f"learner {self.learner.index} could not send a push:\n{self.failure}")

    # -- the protocol -------------------------------------------------------------------------

    # The protocol never blocks the loop: sends and deliveries run on threads of their own (the module
    # doc). What does (checkpoints, state copies for a peer) the engine measures (`LearnerWorker.blocked_s`).
    waiting_s = 0.0
    idle: Callable[[], object] | None = None

    def step(self, stop: threading.Event) -> list[events.Event]:
        happened = self._last_call() if self.background else []
        self.learner.train_step()
        return happened + self.after_step()

    def _last_call(self) -> list[events.Event]:
        """Before the next step is dispatched: when a merge due at this boundary has not arrived,
        wait for the step in flight and look again.

        The host dispatches a step before the device has finished the one before it, so the boundary
        where a merge falls due comes about a step before the write it decides: the round would get
        tau - 1 steps of time, not the tau the grace window plans for. Waiting for the step in flight
        (the write cannot come before it anyway) moves the decision to the last moment that still
        puts the merge in the same place in the step sequence. Only a boundary where a merge falls
        due and is missing pays for it: the device waits for one dispatch.
        """
        step = self.learner.step
        if self.tau == 0 or not any(r.step + self.tau == step for sent in self.sent.values() for r in sent):
            return []
        self.learner.flush()
        return self._take_inbox()

    def receive(self, msg: MergedFragment | FragmentRequest) -> None:
        """Called from another thread when the syncer asks for a fragment or delivers a merged one.

        A merged fragment is acknowledged, resolved against what is held, decoded and staged for
        the write here (`FragmentOps.to_device`), so the loop only swaps it in.
        """
        if isinstance(msg, FragmentRequest):
            self.inbox.put(msg)
            return
        self.factors.offer(msg.fragment, msg.lr_factors)
        with self._lock:
            self._acknowledge(msg)
            mine = [seq for learner, seq in msg.merged if learner == self.learner.index]
            if mine:
                self.merged_mine[(msg.fragment, msg.version)] = max(mine)
            resolved = self.received.resolve(msg)
        for version, value in resolved:
            self.inbox.put(Arrived(msg.fragment, version, self.ops.to_device(msg.fragment, value)))

    def after_step(self) -> list[events.Event]:
        """Push what the syncer asked for, adopt what is due; returns events for the run log."""
        if self.failure:
            raise RuntimeError(f"learner {self.learner.index} could not send a push:\n{self.failure}")
        for p in range(self.plan.num_fragments):
            self.steps_since[p] += 1
            self.unsent_steps[p] += 1
            self.tokens_since[p] += self.learner.tokens_per_step
        return self._take_inbox()

    def _take_inbox(self) -> list[events.Event]:
        """Push the fragments asked for, adopt the merges that are due; returns the pushes' events."""
        requested: list[int] = []
        while not self.inbox.empty():
            msg = self.inbox.get()
            if isinstance(msg, FragmentRequest):
                self.requests += 1
                if msg.fragment not in requested:
                    requested.append(msg.fragment)
                continue
            newest = self.waiting.get(msg.fragment)
            if msg.version > self.versions[msg.fragment] and (newest is None or msg.version > newest[0]):
                self.waiting[msg.fragment] = (msg.version, msg.value)
        # Push before adopting: a fragment asked for now sends its progress since the old anchor,
        # instead of having it replaced by a merge that does not contain it.
        pushed: list[events.Event] = [self.push(p) for p in requested if self.steps_since[p] > 0]
        for p, (version, value) in list(self.waiting.items()):
            sent = self.sent.get(p)
            if not sent or self.learner.step >= sent[-1].step + self.tau:
                self.adopt(p, version, value)
                del self.waiting[p]
        if (factors := self.factors.take()) is not None:
            self.learner.set_leaf_scales(factors)
        return pushed

    def adopt(self, p: int, version: int, global_p: jax.Array | np.ndarray) -> None:
        """Take `global_p`, fragment p's global value at `version` (as `FragmentOps.to_device` gives
        it, or a host vector), as parameters (by the adopt mode) and as the new anchor."""
        global_p = self.ops.staged(p, global_p)
        sent = self.sent.pop(p, [])
        self.counts_from.pop(p, None)
        merged = self._merged_mine(p, version)
        if (record := next((r for r in sent if r.seq == merged), None)) is not None:
            self.lag_steps += self.learner.step - record.step
            self.lagged += 1
        params = self.learner.params
        replaces = self.adopt_mode == "replace" or (self.adopt_mode == "rebase" and not sent)
        dropped = 1.0 if replaces else 1.0 - self.mix_alpha if self.adopt_mode == "mix" else 0.0
        self.discarded_steps += dropped * self.unsent_steps[p] * self.plan.size(p) / self.plan.total_size
        self.unsent_steps[p] *= 1.0 - dropped
        if replaces:
            params = self.ops.write(params, p, global_p)
        elif self.adopt_mode == "mix":  # alpha * theta + (1 - alpha) * global
            params = self.ops.write(params, p, global_p, global_p, a=self.mix_alpha, b=self.mix_alpha)
        else:  # rebase: keep the local progress the version does not hold
            params = self._rebased(params, p, version, global_p, sent, merged)
        self.learner.params = params
        if replaces:
            # The local progress on p is gone: the next push counts from here.
            self.steps_since[p] = self.tokens_since[p] = 0
        self.anchors[p] = global_p
        self.versions[p] = version
        self.adopted += 1

    def _merged_mine(self, p: int, version: int) -> int | None:
        """The newest of this learner's pushes of p merged into `version` or a version before it."""
        with self._lock:
            keys = [key for key in self.merged_mine if key[0] == p and key[1] <= version]
            seqs = [self.merged_mine.pop(key) for key in keys]
        return max(seqs) if seqs else None

    def _rebased(self, theta: Any, p: int, version: int, value: Any, sent: list[SentRecord], merged: int | None) -> Any:
        """Parameters `theta` rebased on fragment p's global `value`: moved, with every push still in
        flight, by the value less the point it stands for here (the newest push it merged, or the anchor)."""
        held = [r for r in sent if merged is not None and r.seq <= merged]
        base = held[-1].theta if held else self.anchors[p]
        theta = self.ops.write(theta, p, value, base, a=1.0, b=1.0)
        flying, since = [], base  # `since`: where the pushes still in flight count from
        for record in sent[len(held) :]:
            if version - record.base_version > self.max_staleness:
                # The syncer refuses a push this stale: its progress goes with the next push, and
                # those after it in flight are moved as if it had not been sent.
                self.steps_since[p] += record.steps
                self.tokens_since[p] += record.tokens
                self.unsent_steps[p] += record.steps
                since = record.theta
                continue
            flying.append(replace(record, theta=record.theta + (value - since)))
        if flying:
            self.sent[p] = flying
            self.counts_from[p] = flying[-1].theta
        return theta

    def push(self, p: int) -> events.PushSent:
        """Dispatch fragment p's outer gradient for sending; returns the event for the run log."""
        payload, scales, theta = self.ops.push(self.learner.params, p, self.counts_from.get(p, self.anchors[p]))
        item = Outgoing(
            p, self.versions[p], self.steps_since[p], self.tokens_since[p], self.seq, payload, scales, self.learner.step
        )
        if self.background:
            self._outbox.put(item)
        else:
            self._send(item)
        self.seq += 1
        self.pushes += 1
        self.sent.setdefault(p, []).append(
            SentRecord(self.learner.step, theta, item.seq, item.base_version, item.steps, item.tokens)
        )
        self.steps_since[p] = self.tokens_since[p] = 0
        self.unsent_steps[p] = 0.0
        return events.PushSent(
            learner=self.learner.index,
            fragment=p,
            base_version=item.base_version,
            seq=item.seq,
            bytes=self.ops.nbytes(p),
            step=self.learner.step,
        )

    def adopt_lag_steps(self) -> float | None:
        """Mean inner steps from a push to the adoption of the merge that holds it (None before one).

        tau when every merge arrives in time; each step more is a step the learner trained on a
        model that had already moved on, which costs the most when H is short."""
        return self.lag_steps / self.lagged if self.lagged else None

    def unpushed_steps(self) -> float:
        """Steps of progress not yet sent, averaged over fragments (what a crash now would lose)."""
        return sum(self.steps_since) / len(self.steps_since)

    def _acknowledge(self, msg: MergedFragment) -> None:
        """Drop pushes of this fragment the round merged (a merged push holds this learner's earlier
        pushes of the fragment), and ones too stale to be accepted any more. Under the lock."""
        mine = [seq for learner, seq in msg.merged if learner == self.learner.index]
        for seq, push in list(self.unacked.items()):
            if push.fragment != msg.fragment:
                continue
            if (mine and seq <= max(mine)) or msg.version - push.base_version > self.max_staleness:
                del self.unacked[seq]

    def reconnect(self, push: RemoteMethod) -> int:
        """Send future pushes to `push`, and re-send every unacknowledged one there, in order."""
        with self._send_lock:
            self._push = push
            with self._lock:
                pending = [self.unacked[seq] for seq in sorted(self.unacked)]
            for item in pending:
                self.transport.send(push, item, link=self.learner.index)
        return len(pending)

    def push_outstanding(self) -> list[events.Event]:
        """At the end of a run: push every fragment with progress not yet sent, and wait until
        every push is handed to the transport; returns the events of the pushes made here."""
        pushed: list[events.Event] = [self.push(p) for p in range(self.plan.num_fragments) if self.steps_since[p] > 0]
        self.flush_sends()
        return pushed

    # -- state --------------------------------------------------------------------------------

    def host_anchors(self) -> list[np.ndarray]:
        return [self.ops.to_host(p, a) for p, a in enumerate(self.anchors)]

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tree = {"anchors": {str(p): a for p, a in enumerate(self.host_anchors())}}
        meta = dict(versions=self.versions, steps_since=self.steps_since, tokens_since=self.tokens_since, seq=self.seq)
        return tree, meta

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        anchors = [np.asarray(tree["anchors"][str(p)], dtype=np.float32) for p in range(self.plan.num_fragments)]
        self.anchors = [self.ops.to_device(p, a) for p, a in enumerate(anchors)]
        self.versions = list(meta["versions"])
        self.steps_since = list(meta["steps_since"])
        self.tokens_since = list(meta["tokens_since"])
        self.unsent_steps = [float(n) for n in self.steps_since]
        self.seq = int(meta["seq"])
        with self._lock:
            self.received.start_from(anchors, self.versions)

    def peer_view(self) -> tuple[list[np.ndarray], list[int]]:
        """This learner's current fragments and versions, for a peer that copies it."""
        return [self.gather(p) for p in range(self.plan.num_fragments)], list(self.versions)

    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        """Take the global fragments as parameters and anchors: a learner with no peer to copy, or
        one resumed from its checkpoint.

        A resumed learner's own parameters are behind the global model: every push it made before
        the run stopped was merged into it (a clean stop pushes everything first), and whatever it
        had not pushed is gone with the run. Keeping them, with the global fragments as anchors,
        would make its first push `global - own`: a push that undoes every merge since its
        checkpoint. It keeps its AdamW state, step and data position.
        """
        anchors = [np.asarray(f, dtype=np.float32).copy() for f in fragments]
        for p, fragment in enumerate(anchors):
            self.scatter(p, fragment)
        self._start_from(anchors, versions)
        with self._lock:
            self.received.start_from(anchors, self.versions)

    resume_from_global = adopt_global

    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None:
        """After copying a peer's parameters: anchors are those parameters, at the peer's versions."""
        self._start_from(fragments, versions)
        with self._lock:
            self.received.forget()  # a peer's parameters are no global version

    def _start_from(self, anchors: list[np.ndarray], versions: list[int]) -> None:
        """Anchors and versions from here on, nothing sent or waiting, no progress counted yet."""
        self.anchors = [self.ops.to_device(p, a) for p, a in enumerate(anchors)]
        self.versions = list(versions)
        self.steps_since = [0] * self.plan.num_fragments
        self.tokens_since = [0] * self.plan.num_fragments
        self.unsent_steps = [0.0] * self.plan.num_fragments
        self.sent.clear()
        self.counts_from.clear()
        self.waiting.clear()
        with self._lock:
            self.merged_mine.clear()
