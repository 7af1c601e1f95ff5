"""The schedule: a plan's timeline merged with Poisson arrivals, in time order. Pure and deterministic.

Each Poisson stream (one per kind and learner, one per kind for join and kill_syncer) draws from its
own generator, seeded from the caller's `random.Random` and the stream's name. So raising the stall
rate does not move the kills, and adding a learner does not move the other learners' faults.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator, Sequence

from chaos.faults import Fault, FaultKind
from chaos.plan import Plan

_ORDER = {kind: i for i, kind in enumerate(FaultKind)}


def schedule(plan: Plan, learner_ids: Sequence[int], rng: random.Random) -> Iterator[Fault]:
    """Every fault of the plan in time order, up to plan.duration_s (without end when it is None).

    Poisson arrivals start after the warm-up; learner faults are drawn for each id in ``learner_ids``
    (the run's learners when chaos starts). Timeline faults are kept as written, even inside the
    warm-up: the controller refuses those, and says so.
    """
    base = rng.getrandbits(64)
    streams: list[Iterator[Fault]] = [iter(sorted((plan.fault_of(e) for e in plan.timeline), key=lambda f: f.at_s))]
    for kind in FaultKind:
        rate = plan.rate_per_min(kind)
        if rate <= 0:
            continue
        for learner in sorted(learner_ids) if kind.rate_per_learner else [None]:
            stream_rng = random.Random(f"{base}/{kind.value}/{learner}")
            # A lost node is named by a learner on it, drawn for each arrival from the stream's own generator.
            draw = sorted(learner_ids) if kind.needs_learner and learner is None else None
            streams.append(_poisson(plan, kind, learner, rate / 60.0, stream_rng, draw))
    merged = heapq.merge(*streams, key=lambda f: (f.at_s, _ORDER[f.kind], -1 if f.learner is None else f.learner))
    if plan.duration_s is None:
        return merged
    end = plan.duration_s
    return itertools.takewhile(lambda f: f.at_s <= end, merged)


def _poisson(
    plan: Plan,
    kind: FaultKind,
    learner: int | None,
    rate_per_s: float,
    rng: random.Random,
    draw: Sequence[int] | None = None,
) -> Iterator[Fault]:
    """Arrivals of one Poisson stream: exponential gaps with mean 1/rate, from the end of the warm-up.

    With `draw`, each arrival targets a learner drawn uniformly from it (a run-wide rate).
    """
    duration = plan.default_duration_s(kind)
    factor = plan.default_factor(kind)
    notice = plan.default_notice_s(kind)
    t = plan.warmup_s
    while True:
        t += rng.expovariate(rate_per_s)
        if plan.duration_s is not None and t > plan.duration_s:
            return
        target = rng.choice(draw) if draw else learner
        yield Fault(round(t, 3), kind, target, duration, factor, origin="poisson", notice_s=notice)


def faults_until(plan: Plan, learner_ids: Sequence[int], rng: random.Random, horizon_s: float) -> list[Fault]:
    """The schedule's faults up to ``horizon_s``, as a list (for previews and tests)."""
    return list(itertools.takewhile(lambda f: f.at_s <= horizon_s, schedule(plan, learner_ids, rng)))
