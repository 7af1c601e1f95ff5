"""The syncer: owns the schedule, holds the global fragments, runs rounds, merges, steps, sends back.

Every tick the global step advances at the pace of the healthy learners (`schedule.Schedule`);
when fragment p's round comes up the syncer asks every healthy learner for p (a
`FragmentRequest`), and each answers at its next step boundary with its progress on p since it
last adopted p. Quorum and the grace window decide when the round closes; the merged fragment
then goes down once to every member, fp32, bf16, or as a compressed difference from the version
the learners hold (`downlink.Downlink`). A schedule that never opens a round (`schedule.NoRounds`)
makes it the syncer of `algorithm: none`.

Not thread-safe and free of Ray: the engine's actor wraps it with a lock and a ticking thread,
tests drive it with a fake clock. Every decision is reported as an event for the run log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlc.algo.counters import SyncCounters
from dlc.algo.decoupled.downlink import Downlink
from dlc.algo.decoupled.guards import GraceWindow
from dlc.algo.decoupled.lr_feedback import SpreadBook
from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment, Push
from dlc.algo.decoupled.rounds import RoundBook, RoundResult
from dlc.algo.decoupled.schedule import Schedule
from dlc.algo.global_model import GlobalFragments
from dlc.algo.liveness import HeardFrom
from dlc.algo.merge import merge_deltas, merge_weights
from dlc.algo.outer import make_outer
from dlc.algo.protocol import Reject
from dlc.config.schema import Recipe
from dlc.core.fragments import FragmentPlan
from dlc.run import events

# Tensors merged with the plain weighted mean under merge=rda: each step touches few rows.
EMBEDDINGS = frozenset({"embed/embedding", "pos_embed/embedding"})

Deliver = Callable[[int, MergedFragment | FragmentRequest], int]  # (learner, message) -> bytes sent

# Longest a syncer waits between two ticks when no deadline is nearer (`next_tick_in`): what it
# notices only then (a learner's heartbeats or steps stopping, after seconds) waits at most this
# much more. Every wake costs the cores the learners train on.
IDLE_TICK_S = 0.1

# A round due within this share of the rounds' spacing when another closes opens with the close.
# A request that arrives early makes a learner push that fragment at most a step sooner; one that
# arrives on its own costs every learner a wake-up of its receiving thread: requests that follow the
# merged fragment on its connection took 0.15-0.2 ms of CPU a step off each learner on a 2-core VM.
EARLY_OPEN = 0.5


class DecoupledSyncer(GlobalFragments, HeardFrom):
    def __init__(
        self,
        recipe: Recipe,
        plan: FragmentPlan,
        initial: dict[str, np.ndarray],
        deliver: Deliver,
        clock: Callable[[], float],
        schedule: Schedule | None = None,
    ) -> None:
        """`schedule`: when rounds come up; by default the recipe's (`Schedule.from_recipe`)."""
        cfg = recipe.syncer
        self.cfg = cfg
        self.plan = plan
        self.deliver = deliver
        self.clock = clock
        self.schedule = schedule if schedule is not None else Schedule.from_recipe(recipe, plan.num_fragments)
        self.theta = [plan.gather(initial, p) for p in range(plan.num_fragments)]
        self.outer = [make_outer(cfg.outer, plan.size(p)) for p in range(plan.num_fragments)]
        # The learners' lr factors.
        self.spread = SpreadBook(plan, cfg.lr_feedback, cfg.lr_feedback_decay, cfg.lr_feedback_power)
        self.book = self._new_book([0] * plan.num_fragments)
        self.heartbeats: dict[int, float] = {}
        self.members: set[int] = set()
        # Learners that trained all their steps and handed their progress over (`retire`).
        self.retired: set[int] = set()
        self.counters = SyncCounters()
        self.events: list[events.Event] = []
        self.journal: Callable[[dict[str, Any]], None] | None = None  # durable record of each round
        # Recent seqs per learner that are settled, merged (every push folded in, superseded parts
        # too) or refused for good: a restarted syncer must refuse them when they are re-sent.
        self.settled_seqs: dict[int, list[int]] = {}
        self.downlink = Downlink(cfg.down_codec, cfg.codec_block_values, self.theta)
        self.asked: dict[int, set[int]] = {}  # open rounds: the learners asked for the fragment
        self.requests_sent = 0
        # Per fragment, the pushes accepted into its open round: a restarted syncer does not hold
        # them (the journal keeps closed rounds), so its count of accepted pushes leaves them out.
        self.waiting = [0] * plan.num_fragments

    def _new_book(self, versions: list[int]) -> RoundBook:
        cfg = self.cfg
        return RoundBook(
            [self.plan.size(p) for p in range(self.plan.num_fragments)],
            cfg.codec,
            quorum=cfg.quorum,
            max_staleness=cfg.max_staleness,
            grace=GraceWindow(gamma=cfg.grace_gamma, tau=max(cfg.overlap_steps, 1)),
            clock=self.clock,
            versions=versions,
            step_time_from_pushes=False,  # the schedule measures step times from heartbeats
        )

    # -- membership and health ----------------------------------------------------------------

    def join(self, learner: int, holds_initial: bool = True) -> None:
        """A learner starts (or resumes) with the initial parameters for its fragments still at
        version 0 (`holds_initial`), or with a state this syncer does not know (a copy of a peer,
        or any learner after a syncer restart): then every fragment merged so far goes to it whole,
        now, so it holds the current global model however many merges it missed, and a downlink
        by difference can start from there."""
        self.members.add(learner)
        self.retired.discard(learner)  # one that finished trains again (a resumed run with more steps)
        self.heartbeats[learner] = self.clock()
        self.schedule.forget(learner)
        self.downlink.forget(learner)
        for p, version in enumerate(self.book.versions):
            if holds_initial and version == 0:
                self.downlink.holds(learner, p, 0)
            elif not holds_initial and version > 0:
                message = self.downlink.whole(learner, p, version, self.theta[p], self.clock(), self._factors(p))
                self.counters.bytes_down += self.deliver(learner, message)

    def rejoin(self, learner: int) -> None:
        """A restarted learner: a new incarnation whose seqs start again, holding a peer's copy."""
        self.book.forget_learner(learner)
        self.join(learner, holds_initial=False)  # a peer's parameters are no version of ours

    def leave(self, learner: int) -> None:
        self.members.discard(learner)
        self.schedule.forget(learner)
        self.downlink.forget(learner)

    def retire(self, learner: int) -> None:
        """Learner `learner` trained all its steps, and the syncer holds every push it sent: it leaves
        the rounds, and every later merge counts its model as one that stays where it left it.

        The global model stands for the mean of the learners' models. Learners that end a few steps
        apart (they started apart, or one is slower) would otherwise hand the last rounds to the one
        or two still training, whose differences then move the whole global model: their batches'
        noise, which the mean of M learners' differences cancels, stays in it. Counted as learners
        that no longer move, the finished ones keep the run's last rounds at their share (`_close`)."""
        self.leave(learner)
        self.retired.add(learner)

    def _factors(self, p: int) -> tuple[float, ...]:
        """The learning-rate factors that go down with fragment p's value: its pieces' (`SpreadBook`), or
        each 1 once a learner has retired. The factor is made for M learners' differences cancelling in
        their mean; with learners retired the rounds merge fewer, counted at their share, and the run is
        in its last steps, where the schedule anneals and a learner's raised learning rate keeps its noise
        in the model (bench/RESULTS.md, "The learners' end")."""
        factors = self.spread.factors(p)
        return tuple(1.0 for _ in factors) if self.retired else factors

    def heartbeat(self, learner: int, step: int | None = None) -> None:
        """Learner `learner` is alive, at inner step `step` (None: it does not say)."""
        now = self.clock()
        self.heartbeats[learner] = now
        if step is not None:
            self.schedule.report(learner, step, now)

    def healthy(self) -> set[int]:
        now = self.clock()
        return {m for m in self.members if now - self.heartbeats.get(m, -1e18) <= self.cfg.heartbeat_timeout_s}

    def active(self, healthy: set[int] | None = None) -> set[int]:
        """Healthy learners that are training (not starting up): the ones rounds count on. When
        none is (every learner paused at once, say for a checkpoint), the healthy ones: quorum K
        never falls to nobody."""
        healthy = self.healthy() if healthy is None else healthy
        return self.schedule.stepping(healthy, self.clock()) or healthy

    # -- rounds --------------------------------------------------------------------------------

    def push(self, push: Push) -> None:
        if push.step is not None and push.learner in self.members:  # sent at once: a heartbeat too
            self.heartbeat(push.learner, push.step)
        self.counters.pushed(push.learner, push.payload.nbytes, self.clock())
        verdict = self.book.submit(push)
        common = {
            "learner": push.learner,
            "fragment": push.fragment,
            "seq": push.seq,
            "steps": push.steps,
            "base_version": push.base_version,
            "version": self.book.version(push.fragment),
        }
        if verdict.accepted:
            self.counters.accepted += 1
            self.waiting[push.fragment] += 1
            self.events.append(
                events.PushAccepted(
                    **common, bytes=push.payload.nbytes, part=verdict.part, superseded=verdict.superseded
                )
            )
        else:
            if verdict.reason != Reject.DUPLICATE:  # refused for good (a duplicate's first copy settled it)
                self._settle(push.learner, [push.seq])
                if self.journal is not None:  # at once: the learner re-sends it to a restarted syncer
                    self.journal({"refused": [push.learner, push.seq], "reason": str(verdict.reason)})
            self.events.append(events.PushRejected(**common, reason=str(verdict.reason), detail=verdict.detail))

    def tick(self) -> int:
        """Advance the global step, open the rounds it reaches, close every round that may close
        now; returns how many closed."""
        healthy = self.healthy()
        active = self.active(healthy)
        for p in self.schedule.advance(self.clock(), active):
            self.open_round(p, healthy)
        for p in list(self.asked):  # a learner healthy again while p's round is open is asked too
            self._ask(p, healthy)
        step_time = self.schedule.step_time_s(active)
        if step_time is not None:
            self.book.grace.step_time_s = step_time
        ready = self.book.closable(active)
        for p in ready:
            self._close(p, active)
        if ready:
            # Merged fragments just went down: a round due soon opens now, so that its requests
            # follow them on every learner's connection and wake each learner's receiver once.
            early = self.schedule.open_early(self.clock(), active, EARLY_OPEN * self.schedule.spacing)
            if early is not None:
                self.open_round(early, healthy)
        return len(ready)

    def next_tick_in(self) -> float:
        """Seconds until a tick has work no message announces: a grace window ending, the global
        step reaching the next round; at most `IDLE_TICK_S`, so that a learner that stops beating
        or stepping is noticed within it."""
        now = self.clock()
        active = self.active()
        waits = [IDLE_TICK_S]
        if (due := self.schedule.due_in(now, active)) is not None:
            waits.append(due)
        if (deadline := self.book.next_deadline(active)) is not None:
            waits.append(deadline - now)
        return max(0.0, min(waits))

    def open_round(self, p: int, healthy: set[int] | None = None) -> None:
        """Fragment p's round comes up: ask every healthy learner for p; the round may close from now."""
        self.book.open(p)
        self.asked[p] = set()
        self._ask(p, self.healthy() if healthy is None else healthy)

    def _ask(self, p: int, learners: set[int]) -> None:
        """Ask those of `learners` not asked yet in p's open round for fragment p."""
        new = learners - self.asked[p]
        if not new:
            return
        request = FragmentRequest(p, self.book.version(p), self.clock())
        for learner in sorted(new):
            self.deliver(learner, request)
            self.requests_sent += 1
        self.asked[p] |= new

    def flush(self) -> int:
        """Close every round holding a push, quorum or not (end of run)."""
        pending = [p for p in range(self.plan.num_fragments) if self.book.pending(p)]
        for p in pending:
            self._close(p, self.healthy())
        return len(pending)

    def _close(self, p: int, healthy: set[int]) -> RoundResult:
        result = self.book.close(p, healthy)
        self.asked.pop(p, None)
        self.waiting[p] = 0  # every push the round held is merged, superseded ones too
        weights = merge_weights(
            result.tokens, result.steps, self.cfg.weighting, result.staleness, self.cfg.staleness_discount
        )
        merged = merge_deltas(list(result.deltas), weights, self.cfg.merge, self.plan.segments(p), EMBEDDINGS)
        # The feedback needs the mean merge (RDA with it is refused): `merged` is the deltas' mean then.
        self.spread.update(p, result.deltas, weights, merged if self.cfg.merge == "mean" else None)
        factors = self._factors(p)  # the learners' lr factors that go down with the new value
        # Retired learners (`retire`) count as contributors of the mean weight whose difference is zero.
        retired = sorted(self.retired - set(result.learners))
        if retired:
            merged = merged * np.float32(len(result.learners) / (len(result.learners) + len(retired)))
        self.theta[p] = self.outer[p].step(self.theta[p], merged)
        pairs = tuple(zip(result.learners, result.seqs, strict=True))
        self.counters.round_closed(result.learners)
        for learner, seqs in zip(result.learners, result.merged_seqs, strict=True):
            self._settle(learner, seqs)
        event = events.RoundClosed(
            t=round(time.time(), 3),  # when it closed, also where a restarted syncer reports it again
            fragment=p,
            version=result.version,
            contributors=list(result.learners),
            weights=[round(float(w), 4) for w in weights],
            staleness=list(result.staleness),
            grace_s=round(result.grace_window_s, 4),
            waited_s=round(result.waited_s, 4),
            tokens=list(result.tokens),
            seqs=list(result.seqs),
            # Every push folded in, superseded ones included: (learner, seq) pairs, each merged once.
            merged=[
                (learner, seq)
                for learner, seqs in zip(result.learners, result.merged_seqs, strict=True)
                for seq in seqs
            ],
            lr_factors=[round(f, 4) for f in factors] or None,
            retired=retired or None,
        )
        if self.journal is not None:  # before anyone sees the new version: a restart replays it
            self.journal(
                {
                    "fragment": p,
                    "version": result.version,
                    "theta": self.theta[p],
                    "outer": self.outer[p].state(),  # the outer step's own state, keys unknown here
                    "spread": self.spread.state(p),
                    "merged": pairs,
                    "history": self.book.merged_history(p),  # what later pushes of p are netted against
                    "counters": self._counters(),
                    "event": event.record(),  # the round's record survives the syncer, even undrained
                }
            )
        # Once to every member, contributors or not.
        down = self.downlink.round(p, result.version, self.theta[p], pairs, self.members, self.clock(), factors)
        for learner, message in down:
            self.counters.bytes_down += self.deliver(learner, message)
        self.book.mark_sent(p)
        self.events.append(event)
        return result

    def _keep_seqs(self) -> int:
        # Enough history to recognise a re-sent push: a push older than this would be stale.
        return 4 * self.plan.num_fragments * (self.cfg.max_staleness + 1)

    def _settle(self, learner: int, seqs: Sequence[int]) -> None:
        settled = self.settled_seqs.setdefault(learner, [])
        settled.extend(seqs)
        del settled[: -self._keep_seqs()]

    def _see_settled(self, learner: int) -> None:
        """The book learns the learner's settled seqs (a restarted syncer): their re-sends are refused."""
        seqs = self.settled_seqs[learner]
        self.book.restore_seen(learner, seqs, complete=len(seqs) < self._keep_seqs())

    def _counters(self) -> dict[str, Any]:
        return {
            **self.counters.state(),
            # Those a restored syncer holds: the pushes waiting in open rounds die with this one,
            # and are accepted again when their learners re-send them.
            "accepted": self.counters.accepted - sum(self.waiting),
            "rejections": {str(k): v for k, v in self.book.rejections.items()},
            "settled_seqs": {str(k): v for k, v in self.settled_seqs.items()},
            "schedule": self.schedule.state(),
            "retired": sorted(self.retired),
        }

    def journal_snapshot(self) -> dict[str, Any]:
        """The state a checkpoint does not hold, as the first record of the journal that follows it:
        the merge history, which holds encoded payloads of every learner's last merged pushes."""
        return {"history": self.book.merged_history()}

    def replay(self, record: dict[str, Any]) -> bool:
        """Apply one journal record newer than the state; returns whether a round was applied.

        Records come in the order written: a snapshot taken with a checkpoint, then the rounds
        closed after it."""
        if "refused" in record:  # a push refused for good, maybe after the last round closed
            learner, seq = record["refused"]
            if seq not in self.settled_seqs.get(learner, []):
                self._settle(learner, [seq])
                self._see_settled(learner)
                self.book.rejections[Reject(record["reason"])] += 1
            return False
        if "fragment" not in record:  # a snapshot: the state at the checkpoint it was taken with
            self.book.restore_merged_history(record["history"])
            return False
        p = record["fragment"]
        if record["version"] <= self.book.version(p):
            return False
        self.theta[p] = np.asarray(record["theta"], dtype=np.float32)
        self.outer[p].load(record["outer"])
        self.spread.load(p, record["spread"])
        versions = list(self.book.versions)
        versions[p] = record["version"]
        self._restore_counters(versions, record["counters"])
        self.book.restore_merged_history(record["history"], fragment=p)
        return True

    def _restore_counters(self, versions: list[int], counters: dict[str, Any]) -> None:
        history = self.book.merged_history()
        self.book = self._new_book(versions)
        self.book.restore_merged_history(history)
        self.book.rejections.update(dict(counters["rejections"]))
        self.counters.load(counters)
        self.settled_seqs = {int(k): list(v) for k, v in counters.get("settled_seqs", {}).items()}
        for learner in self.settled_seqs:
            self._see_settled(learner)
        self.schedule.load(counters.get("schedule", {}))
        self.retired = {int(learner) for learner in counters.get("retired", [])}
        self.downlink.reset(self.theta)
        self.asked.clear()
        self.waiting = [0] * self.plan.num_fragments

    # -- views ---------------------------------------------------------------------------------

    def versions(self) -> list[int]:
        return list(self.book.versions)

    def next_seqs(self) -> dict[int, int]:
        return self.book.next_seqs()

    def status(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "versions": list(self.book.versions),
            "quorum": self.cfg.quorum,
            "healthy": sorted(self.healthy()),
            "global_step": round(self.schedule.global_step, 1),
            "grace_window_s": round(self.book.grace.window_s(), 4),
            "rejections": {str(k): v for k, v in self.book.rejections.items()},
            **self.counters.status(now),
        }

    def drain_events(self) -> list[events.Event]:
        drained, self.events = self.events, []
        return drained

    # -- checkpoint state ----------------------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tree = {
            "theta": {str(p): t for p, t in enumerate(self.theta)},
            "outer": {str(p): outer.state() for p, outer in enumerate(self.outer)},
            "spread": {str(p): self.spread.state(p) for p in range(self.plan.num_fragments)},
        }
        meta = {"versions": list(self.book.versions), **self._counters(), "plan": self.plan.fingerprint()}
        return tree, meta

    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        P = self.plan.num_fragments
        self.theta = [np.asarray(tree["theta"][str(p)], dtype=np.float32) for p in range(P)]
        for p, outer in enumerate(self.outer):
            outer.load(tree["outer"][str(p)])
            self.spread.load(p, tree["spread"][str(p)])
        self._restore_counters(list(meta["versions"]), meta)
