"""The syncer's clock: a global step at the healthy learners' pace, and the fragment rounds it opens.

Learners report their step with every heartbeat. Each learner's rate (steps per second) is
measured over a few recent reports; the global step advances at the median rate of the learners
that are stepping, so one slow or frozen learner never slows it and a fast one never rushes it.
Fragment p's round opens every H global steps, staggered: the r-th round (r = 0, 1, ...) opens
at global step (r + 1) H / P and is fragment r mod P, as in Streaming DiLoCo. The syncer may
open a round a little before that (`open_early`), to send its requests together with a merged
fragment.

Pure bookkeeping with the time passed in: no threads, no clock of its own.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection

from dlc.config.schema import Recipe


class _Reports:
    """One learner's recent reports: the first, then each one whose step had grown.

    Kept by step change, not by report, so a learner whose steps take longer than the window
    (a big model, a slow chip) still has a rate: the last changes span at least two steps.
    """

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()
        self.advanced = False  # its step has grown since it joined: it is training, not starting
        self.changed_at = 0.0  # when its step last grew

    def add(self, now: float, step: int, window_s: float) -> None:
        # An older step is a report overtaken by a newer one (heartbeats and pushes report steps
        # and reach the syncer by different threads): it says nothing new. A new process of the
        # learner starts from `Schedule.forget`, so its reports never follow the old one's.
        if self.samples and step <= self.samples[-1][1]:
            return
        if self.samples:
            self.advanced = True
            self.changed_at = now
        self.samples.append((now, step))
        while len(self.samples) > 2 and now - self.samples[1][0] >= window_s:
            self.samples.popleft()

    def rate(self) -> float | None:
        """Steps per second between the oldest and newest change kept, or None before two."""
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


class Schedule:
    """The global step and the round counter.

    ``window_s`` is how far back a learner's rate is measured; ``idle_s`` how long a learner's step
    may stand still before it no longer counts as stepping.
    """

    def __init__(self, fragments: int, interval_steps: int, window_s: float = 2.0, idle_s: float = 5.0) -> None:
        if fragments < 1 or interval_steps < 1 or window_s <= 0 or idle_s <= 0:
            raise ValueError(f"schedule: P={fragments}, H={interval_steps}, window {window_s}, idle {idle_s}")
        self.P, self.H = fragments, interval_steps
        self.window_s, self.idle_s = window_s, idle_s
        self.global_step = 0.0
        self.next_round = 0  # rounds opened so far
        self._reports: dict[int, _Reports] = {}
        self._last_advance: float | None = None

    @classmethod
    def from_recipe(cls, recipe: Recipe, fragments: int) -> Schedule:
        """The schedule of the recipe's syncer: a learner's rate is measured over a few of its
        heartbeats, and it stops counting as stepping when it would be declared dead."""
        cfg = recipe.syncer
        return cls(
            fragments,
            cfg.sync_interval_steps,
            window_s=max(2.0, 4 * cfg.heartbeat_interval_s),
            idle_s=cfg.heartbeat_timeout_s,
        )

    @property
    def spacing(self) -> float:
        """Global steps between two rounds (of consecutive fragments)."""
        return self.H / self.P

    def report(self, learner: int, step: int, now: float) -> None:
        """Learner ``learner`` was at ``step`` at time ``now`` (from a heartbeat)."""
        self._reports.setdefault(learner, _Reports()).add(now, int(step), self.window_s)

    def forget(self, learner: int) -> None:
        """A learner left or was restarted: its reports no longer describe a running process."""
        self._reports.pop(learner, None)

    def stepping(self, learners: Collection[int], now: float) -> set[int]:
        """Those of ``learners`` that train: a learner that never reported a step counts (it is
        not on this clock); one that reported must have advanced, and not stood still for long."""
        out = set()
        for m in learners:
            reports = self._reports.get(m)
            if reports is None:
                out.add(m)
                continue
            rate = reports.rate()
            # Standing still for idle_s, or for three of its own steps when those are longer.
            limit = max(self.idle_s, 3.0 / rate) if rate else self.idle_s
            if reports.advanced and now - reports.changed_at <= limit:
                out.add(m)
        return out

    def rate(self, learners: Collection[int]) -> float | None:
        """The median rate of ``learners`` (steps per second), or None when none is measured."""
        rates = [r for m in learners if (r := self._rate(m)) is not None and r > 0]
        return statistics.median(rates) if rates else None

    def step_time_s(self, learners: Collection[int]) -> float | None:
        """The mean step time of ``learners``: what the grace window waits in units of."""
        times = [1.0 / r for m in learners if (r := self._rate(m)) is not None and r > 0]
        return sum(times) / len(times) if times else None

    def _rate(self, learner: int) -> float | None:
        reports = self._reports.get(learner)
        return reports.rate() if reports is not None else None

    def advance(self, now: float, learners: Collection[int]) -> list[int]:
        """Move the global step on to ``now`` at the median rate of ``learners``; returns the
        fragments whose rounds open, in order (at most P at once, however long the gap)."""
        last, self._last_advance = self._last_advance, now
        rate = self.rate(learners)
        if last is None or rate is None or now <= last:
            return []
        self.global_step += (now - last) * rate
        due: list[int] = []
        while self.global_step >= self._next_at():
            if len(due) < self.P:
                due.append(self.next_round % self.P)
            self.next_round += 1
        return due

    def due_in(self, now: float, learners: Collection[int]) -> float | None:
        """Seconds from ``now`` until the global step reaches the next round at the median rate
        of ``learners`` as measured now; None while it does not advance."""
        rate = self.rate(learners)
        if self._last_advance is None or rate is None:
            return None
        return max(0.0, (self._next_at() - self._step_at(now, rate)) / rate)

    def open_early(self, now: float, learners: Collection[int], lead: float) -> int | None:
        """The next round's fragment when the global step, as measured now, is within ``lead``
        global steps of it: the round opens now, and `advance` will not open it again. None
        when it is further off, or the clock does not advance."""
        rate = self.rate(learners)
        if self._last_advance is None or rate is None or self._step_at(now, rate) + lead < self._next_at():
            return None
        self.next_round += 1
        return (self.next_round - 1) % self.P

    def _step_at(self, now: float, rate: float) -> float:
        assert self._last_advance is not None
        return self.global_step + max(0.0, now - self._last_advance) * rate

    def _next_at(self) -> float:
        """The global step at which the next round opens."""
        return (self.next_round + 1) * self.spacing

    def state(self) -> dict[str, float | int]:
        return {"global_step": self.global_step, "next_round": self.next_round}

    def load(self, state: dict[str, float | int]) -> None:
        self.global_step = float(state.get("global_step", 0.0))
        self.next_round = int(state.get("next_round", 0))


class NoRounds(Schedule):
    """A schedule whose global step never reaches a round: the syncer of `algorithm: none`, whose
    learners send nothing and must never be asked for a fragment. Learners still report their
    steps, so it still says which of them are stepping."""

    def advance(self, now: float, learners: Collection[int]) -> list[int]:
        return []

    def due_in(self, now: float, learners: Collection[int]) -> float | None:
        return None

    def open_early(self, now: float, learners: Collection[int], lead: float) -> int | None:
        return None

    def step_time_s(self, learners: Collection[int]) -> float | None:
        return None  # no round: no grace window to size
