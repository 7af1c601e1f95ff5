"""The syncer of the blocking baselines: one global model, one barrier per version, elastic pauses.

Version v of the global model closes when every member of the job has sent its contribution
for v; the contributions are combined into version v + 1 (dp: one AdamW step on the weighted
mean gradient; diloco: one outer Nesterov step on the weighted mean outer gradient), which
goes to every member. Nobody moves on before that: a slow member slows everyone.

Membership is elastic, as in torchft-style elastic data-parallel training:
- a member that leaves, dies (the driver reports it) or misses heartbeats for
  `heartbeat_timeout_s` is dropped; the job pauses for `blocking.reconfigure_s` and then goes
  on with the survivors;
- a learner that joins, returns or thaws is admitted when the current version closes: the job
  pauses again, and then the new version goes to everyone, the newcomer included;
- a change during a pause is folded into that pause, as `dlc simulate` models it.
Not thread-safe and free of Ray, like `dlc.algo.decoupled.syncer.DecoupledSyncer`; tests drive it with a fake clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from dlc.algo.blocking.messages import Contribution, GlobalModel
from dlc.algo.counters import SyncCounters
from dlc.algo.global_model import GlobalFragments
from dlc.algo.liveness import HeardFrom
from dlc.algo.merge import merge_weights
from dlc.algo.outer import make_outer
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.core.fragments import FragmentPlan, shapes_of
from dlc.run import events

Deliver = Callable[[int, GlobalModel], int]


class Combiner(Protocol):
    """Turns the weighted mean of the contributions into the next global model."""

    def step(self, theta: np.ndarray, mean: np.ndarray) -> np.ndarray: ...
    def state(self) -> dict[str, np.ndarray]: ...
    def load(self, state: dict[str, np.ndarray]) -> None: ...


class OuterStep:
    """diloco: the recipe's outer step (`syncer.outer`) with the mean outer gradient."""

    def __init__(self, recipe: Recipe, plan: FragmentPlan, initial: dict[str, np.ndarray]) -> None:
        self.outer = make_outer(recipe.syncer.outer, plan.size(0))

    def step(self, theta: np.ndarray, mean: np.ndarray) -> np.ndarray:
        return self.outer.step(theta, mean)

    def state(self) -> dict[str, np.ndarray]:
        return self.outer.state()

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.outer.load(state)


class AdamWStep:
    """dp: the one AdamW state of the job, stepped with the mean gradient (the inner recipe's optimizer).

    It steps the flat {name: array} dict: AdamW is elementwise, clipping takes the global norm and
    weight decay is masked by rank, so the nesting of the model's tree changes nothing.
    """

    def __init__(self, recipe: Recipe, plan: FragmentPlan, initial: dict[str, np.ndarray]) -> None:
        import jax
        import optax

        from dlc.core.steps import make_optimizer

        self.plan = plan
        self.like = initial
        self.optimizer = make_optimizer(recipe.inner, recipe.schedule_steps())
        self.opt_state = self.optimizer.init(self._tree(plan.gather(initial, 0)))
        self._leaves, self._treedef = jax.tree_util.tree_flatten(self.opt_state)

        def update(params: Any, grads: Any, opt_state: Any) -> tuple[Any, Any]:
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self._update = jax.jit(update)

    def _tree(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        return self.plan.assemble([vector], self.like)

    def step(self, theta: np.ndarray, mean: np.ndarray) -> np.ndarray:
        import jax

        params, self.opt_state = self._update(self._tree(theta), self._tree(mean), self.opt_state)
        return self.plan.gather(jax.device_get(params), 0)

    def state(self) -> dict[str, np.ndarray]:
        import jax

        leaves = jax.tree_util.tree_leaves(self.opt_state)
        return {str(k): np.asarray(leaf) for k, leaf in enumerate(leaves)}

    def load(self, state: dict[str, np.ndarray]) -> None:
        import jax
        import jax.numpy as jnp

        leaves = [jnp.asarray(state[str(k)]) for k in range(len(self._leaves))]
        self.opt_state = jax.tree_util.tree_unflatten(self._treedef, leaves)


class BarrierSyncer(GlobalFragments, HeardFrom):
    def __init__(
        self,
        recipe: Recipe,
        initial: dict[str, np.ndarray],
        deliver: Deliver,
        clock: Callable[[], float],
        combiner: Callable[[Recipe, FragmentPlan, dict[str, np.ndarray]], Combiner],
        codec: str,
        down_codec: str,
        weighting: str,
    ) -> None:
        self.cfg = recipe.syncer
        self.reconfigure_s = recipe.blocking.reconfigure_s
        self.plan = FragmentPlan.build(shapes_of(initial), 1)
        self.theta = [self.plan.gather(initial, 0)]
        self.combiner = combiner(recipe, self.plan, initial)
        self.weighting = weighting
        self.codec = get_codec(codec, self.cfg.codec_block_values)
        self.down_codec = get_codec(down_codec)
        self.deliver = deliver
        self.clock = clock
        self.version = 0
        self.known: set[int] = set()  # registered and not left: members, joiners, and dropped ones
        self.members: set[int] = set()
        self.joining: set[int] = set()
        self.heartbeats: dict[int, float] = {}
        self.received: dict[int, Contribution] = {}
        self.paused_until = float("-inf")
        self.broadcast_due = False  # the current version still has to go out when the pause ends
        self.pauses = 0
        self.paused_s = 0.0
        self.counters = SyncCounters()
        self.rejections: Counter[str] = Counter()
        self.events: list[events.Event] = []
        self.journal: Callable[[dict[str, Any]], None] | None = None  # unused: a restart resumes from the checkpoint

    # -- membership ----------------------------------------------------------------------------

    def join(self, learner: int, holds_initial: bool = True) -> None:
        self.known.add(learner)
        self.heartbeats[learner] = self.clock()
        if learner not in self.members:
            self.joining.add(learner)

    def rejoin(self, learner: int) -> None:
        """A restarted learner: admitted like a joiner (the driver dropped the dead one already)."""
        self.members.discard(learner)
        self.received.pop(learner, None)
        self.join(learner)

    def leave(self, learner: int) -> None:
        self.known.discard(learner)
        self.joining.discard(learner)
        if learner in self.members:
            self._drop({learner}, "left")

    def retire(self, learner: int) -> None:
        """Nothing: the barrier keeps the learners in step, so they finish in the same round and the
        driver's end of the run flushes it."""

    def heartbeat(self, learner: int, step: int | None = None) -> None:
        self.heartbeats[learner] = self.clock()

    def healthy(self) -> set[int]:
        now = self.clock()
        timeout = self.cfg.heartbeat_timeout_s
        return {m for m in self.known if now - self.heartbeats.get(m, -1e18) <= timeout}

    def _drop(self, learners: set[int], reason: str) -> None:
        self.members -= learners
        for learner in learners:
            self.received.pop(learner, None)
        self.events.append(events.MemberLost(learners=sorted(learners), reason=reason))
        self._pause(f"lost {sorted(learners)} ({reason})")

    def _pause(self, why: str) -> None:
        now = self.clock()
        if now < self.paused_until:
            self.events.append(events.ReconfigureFolded(why=why))
            return
        self.paused_until = now + self.reconfigure_s
        self.pauses += 1
        self.paused_s += self.reconfigure_s
        self.events.append(events.Reconfigure(why=why, pause_s=self.reconfigure_s, members=sorted(self.members)))

    # -- the barrier ---------------------------------------------------------------------------

    def push(self, c: Contribution) -> None:
        self.counters.pushed(c.learner, c.payload.nbytes, self.clock())
        reason = None
        if c.learner not in self.members:
            reason = "not_member"
        elif c.version != self.version:
            reason = "stale"
        elif c.learner in self.received:
            reason = "duplicate"
        else:
            delta = self.codec.decode(c.payload)
            if delta.shape != self.theta[0].shape:
                reason = "shape"
            elif not np.isfinite(delta).all():
                reason = "nonfinite"
        # Fragment 0, the whole model, as in its rounds: the driver finds the round a push is merged in.
        push = {"learner": c.learner, "fragment": 0, "seq": c.seq, "steps": c.steps, "base_version": c.version}
        if reason is not None:
            self.rejections[reason] += 1
            self.events.append(events.PushRejected(**push, version=self.version, reason=reason, detail=None, share=1.0))
            return
        self.received[c.learner] = c
        self.counters.accepted += 1
        self.events.append(
            events.PushAccepted(
                **push, version=self.version, bytes=c.payload.nbytes, part=None, superseded=None, share=1.0
            )
        )

    def next_tick_in(self) -> float:
        """Seconds until the next tick: often, since a pause ends and members fall silent by the clock."""
        return 0.005

    def tick(self) -> int:
        """Drop silent members, admit newcomers, close the version when everyone has sent; returns 1 if it closed."""
        healthy = self.healthy()
        silent = self.members - healthy
        if silent:
            self._drop(silent, "heartbeat_timeout")
        # A known learner that is neither member nor joiner was dropped; back in health, it rejoins.
        self.joining |= (self.known & healthy) - self.members
        if not self.members and self.joining:
            self._admit()  # the job (re)starts: nobody to pause, nothing to wait for
        if self.clock() < self.paused_until:
            return 0
        closed = 0
        if self.members and self.members <= set(self.received):
            self._close()
            closed = 1
            if self.joining:
                self._admit()
                self._pause(f"admitted {sorted(self.members)}")
        if self.broadcast_due and self.clock() >= self.paused_until:
            self._broadcast()
        return closed

    def _admit(self) -> None:
        self.events.append(events.MembersAdmitted(learners=sorted(self.joining), version=self.version))
        # A member's silence counts from its admission at the earliest: a joiner registered while the
        # job was starting, and not yet beating, is given the whole timeout to be heard from.
        now = self.clock()
        for learner in self.joining:
            self.heartbeats[learner] = max(self.heartbeats.get(learner, now), now)
        self.members |= self.joining
        self.joining.clear()
        self.broadcast_due = True

    def flush(self) -> int:
        """End of run: close the current version with whatever arrived."""
        if not self.received:
            return 0
        self._close()
        return 1

    def _close(self) -> None:
        contributions = [self.received[m] for m in sorted(self.received)]
        tokens = [c.tokens for c in contributions]
        weights = merge_weights(tokens, [max(c.steps, 1) for c in contributions], self.weighting)
        mean = np.zeros_like(self.theta[0])
        for weight, c in zip(weights, contributions, strict=True):
            mean += np.float32(weight) * self.codec.decode(c.payload)
        self.theta[0] = self.combiner.step(self.theta[0], mean).astype(np.float32)
        self.version += 1
        self.counters.round_closed(c.learner for c in contributions)
        self.received.clear()
        self.broadcast_due = True
        self.events.append(
            events.RoundClosed(
                fragment=0,
                version=self.version,
                contributors=[c.learner for c in contributions],
                weights=[round(float(w), 4) for w in weights],
                tokens=tokens,
                seqs=[c.seq for c in contributions],
            )
        )

    def _broadcast(self) -> None:
        message = GlobalModel(self.version, self.down_codec.encode(self.theta[0]), self.clock())
        for learner in sorted(self.members):
            self.counters.bytes_down += self.deliver(learner, message)
        self.broadcast_due = False

    # -- the interface the syncer actor uses -------------------------------------------------

    def versions(self) -> list[int]:
        return [self.version]

    def next_seqs(self) -> dict[int, int]:
        return {}  # rounds are barriers: a resumed learner's seqs are never compared with earlier ones

    def status(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "versions": [self.version],
            "quorum": 1,  # elastic: the job goes on while one member is left
            "members": sorted(self.members),
            "joining": sorted(self.joining),
            "healthy": sorted(self.healthy()),
            "paused_for_s": round(max(self.paused_until - now, 0.0), 3),
            "pauses": self.pauses,
            "paused_s": round(self.paused_s, 3),
            "grace_window_s": 0.0,
            "rejections": dict(self.rejections),
            **self.counters.status(now),
        }

    def drain_events(self) -> list[events.Event]:
        drained, self.events = self.events, []
        return drained

    def journal_snapshot(self) -> dict[str, Any]:
        return {}  # nothing is journaled

    def replay(self, record: dict[str, Any]) -> bool:
        return False  # nothing is journaled: a restarted barrier syncer resumes from its checkpoint

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tree = {"theta": {"0": self.theta[0]}, "combiner": self.combiner.state()}
        meta = {
            "versions": [self.version],
            **self.counters.state(),
            # Those a restored syncer holds: the contributions of the round under way are not saved, and
            # are accepted again when their learners re-send them.
            "accepted": self.counters.accepted - len(self.received),
            "pauses": self.pauses,
            "paused_s": self.paused_s,
            "rejections": dict(self.rejections),
            "plan": self.plan.fingerprint(),
        }
        return tree, meta

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        self.theta = [np.asarray(tree["theta"]["0"], dtype=np.float32)]
        self.combiner.load(tree["combiner"])
        self.version = int(meta["versions"][0])
        self.counters.load(meta)
        self.pauses, self.paused_s = meta["pauses"], meta["paused_s"]
        self.rejections = Counter(dict(meta["rejections"]))
