"""Event-driven goodput simulation of plain DP, elastic DP and decoupled training at scale.

Failures are Poisson with rate chips / MTBI. A failure takes its slice out for a repair
time drawn from ``repair_dist``. The three systems differ only in what a failure costs:

- plain DP stops the whole job for ``dp_restart_s``; it keeps hot spares so it never waits
  for a repair, and those spares are allocated but idle;
- elastic DP pauses the whole job for a reconfiguration on every failure and every return
  of a repaired slice, and between pauses runs on the healthy slices;
- decoupled runs M independent elastic learners of chips / M each; a pause touches one
  learner, and goodput is the mean over learners (they are all the same size).

A failure or return during a pause is folded into that pause (the reconfiguration that is
under way takes it along) instead of starting a new one. Everything is vectorised: the
chain of pauses comes from pointer doubling over sorted event times, and capacity
integrals from prefix sums, so millions of events cost NumPy passes, not Python loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlc.config.algorithms import SIMULATED_SYSTEMS
from dlc.plan.inputs import (
    SECONDS_PER_DAY,
    SECONDS_PER_HOUR,
    SECONDS_PER_YEAR,
    FailureModel,
    RepairDist,
    Setting,
    SettingError,
)

SYSTEMS: tuple[str, ...] = tuple(system.name for system in SIMULATED_SYSTEMS)
LABELS: dict[str, str] = {system.name: system.label for system in SIMULATED_SYSTEMS}
# Peak bytes per failure drawn, at the peak of an elastic learner's pass: failure, repair and
# return times, their merged order, the pause chain and the capacity integral. Measured with
# tracemalloc: 216 for elastic DP and 240 for 16 decoupled learners at 2.4M chips over 300 days.
BYTES_PER_FAILURE = 320
MAX_SEED = 2**63 - 1  # NumPy's seed sequence takes non-negative integers; keep them to 64 bits

# The paper's goodput table (percent, 1 failure per chip-year), keyed by (system, M).
PAPER_CHIPS: tuple[int, ...] = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
PAPER_LEARNERS: tuple[int, ...] = (1, 2, 4, 8, 16)
PAPER_GOODPUT_PCT: dict[tuple[str, int], tuple[int, ...]] = {
    ("dp", 1): (72, 57, 38, 27, 18),
    ("elastic_dp", 1): (88, 80, 69, 58, 40),
    ("decoupled", 2): (94, 88, 80, 70, 54),
    ("decoupled", 4): (96, 93, 89, 82, 73),
    ("decoupled", 8): (98, 96, 94, 88, 80),
    ("decoupled", 16): (99, 98, 96, 93, 86),
}


@dataclass(frozen=True)
class SystemResult:
    """Goodput and uptime of one system over the horizon, both fractions of wall time."""

    goodput: float
    uptime: float
    failures: int


def draw_repairs(model: FailureModel, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` repair durations in seconds with the model's mean and shape."""
    mean_s = model.repair_mean_h * SECONDS_PER_HOUR
    if model.repair_dist is RepairDist.FIXED:
        return np.full(n, mean_s)
    if model.repair_dist is RepairDist.EXPONENTIAL:
        return rng.exponential(mean_s, n)
    sigma = model.repair_sigma
    return rng.lognormal(np.log(mean_s) - sigma**2 / 2, sigma, n)


def _repair_tail_s(model: FailureModel) -> float:
    """A repair time exceeded with probability ~1e-3: the warm-up needed before t = 0."""
    mean_s = model.repair_mean_h * SECONDS_PER_HOUR
    if model.repair_dist is RepairDist.FIXED:
        return mean_s
    if model.repair_dist is RepairDist.EXPONENTIAL:
        return mean_s * np.log(1000.0)
    sigma = model.repair_sigma
    return float(np.exp(np.log(mean_s) - sigma**2 / 2 + 3.09 * sigma))


def poisson_times(rate_per_s: float, start_s: float, end_s: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted event times of a Poisson process on [start_s, end_s)."""
    n = rng.poisson(rate_per_s * (end_s - start_s))
    return np.sort(rng.uniform(start_s, end_s, n))


def absorbing_pauses(times: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pauses started by sorted events, each absorbing the events that fall inside it.

    The first event starts a pause; the next pause starts at the first event at or after
    its end, and so on. That chain is sequential, so follow it by pointer doubling: after
    round r the chain holds its first 2**r members, in O(n log n) vectorised work.
    """
    n = times.size
    if n == 0:
        return np.zeros(0), np.zeros(0)
    jump = np.append(np.searchsorted(times, times + lengths, side="left"), n)  # n: past the end
    chain = np.zeros(1, dtype=np.intp)
    while chain[-1] != n:
        chain = np.concatenate([chain, jump[chain]])
        jump = jump[jump]
    starts = chain[chain < n]
    return times[starts], times[starts] + lengths[starts]


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into disjoint sorted ones."""
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def _clipped_length(starts: np.ndarray, ends: np.ndarray, horizon_s: float) -> float:
    """Total length of disjoint intervals inside [0, horizon_s)."""
    return float(np.clip(np.minimum(ends, horizon_s) - np.maximum(starts, 0.0), 0.0, None).sum())


def simulate_dp(chips: float, model: FailureModel, rng: np.random.Generator) -> SystemResult:
    """Plain DP: any failure of a job chip stops everything for the restart time."""
    horizon_s = model.horizon_days * SECONDS_PER_DAY
    job_chips = chips * (1.0 - model.dp_spare_fraction)  # spares fail too, but off the job
    rate = job_chips / (model.mtbi_chip_years * SECONDS_PER_YEAR)
    warmup_s = 10.0 * model.dp_restart_s  # long enough for the pause chain to forget its start
    fails = poisson_times(rate, -warmup_s, horizon_s, rng)
    starts, ends = absorbing_pauses(fails, np.full(fails.size, model.dp_restart_s))
    uptime = 1.0 - _clipped_length(starts, ends, horizon_s) / horizon_s
    failures = int(np.count_nonzero(fails >= 0))
    return SystemResult(goodput=uptime * (1.0 - model.dp_spare_fraction), uptime=uptime, failures=failures)


def _simulate_learner(
    chips: float, model: FailureModel, rng: np.random.Generator
) -> tuple[float, np.ndarray, np.ndarray, int]:
    """One elastic learner: (useful capacity-time in s, its idle intervals, failures in horizon)."""
    horizon_s = model.horizon_days * SECONDS_PER_DAY
    n_slices = max(1, round(chips / model.chips_per_slice))
    rate = chips / (model.mtbi_chip_years * SECONDS_PER_YEAR)
    warmup_s = _repair_tail_s(model) + max(model.pause_on_failure_s, model.pause_on_return_s)
    fails = poisson_times(rate, -warmup_s, horizon_s, rng)
    returns = fails + draw_repairs(model, fails.size, rng)
    returns = returns[returns < horizon_s]
    times = np.concatenate([fails, returns])
    order = np.argsort(times, kind="stable")
    times = times[order]
    is_fail = order < fails.size
    lengths = np.where(is_fail, model.pause_on_failure_s, model.pause_on_return_s)
    p_start, p_end = absorbing_pauses(times, lengths)

    # Healthy capacity is piecewise constant: caps[j] holds on [grid[j], grid[j+1]), all
    # slices healthy before the first event. Integrate it with prefix sums.
    down = np.cumsum(np.where(is_fail, 1, -1))
    caps = np.concatenate([[1.0], np.clip(1.0 - down / n_slices, 0.0, 1.0)])
    grid = np.concatenate([[-warmup_s], times, [horizon_s]])
    cum = np.concatenate([[0.0], np.cumsum(caps * np.diff(grid))])

    def integral_to(x: np.ndarray) -> np.ndarray:
        k = np.minimum(np.searchsorted(grid, x, side="right") - 1, caps.size - 1)
        return cum[k] + caps[k] * (x - grid[k])

    lo, hi = np.clip(p_start, 0.0, horizon_s), np.clip(p_end, 0.0, horizon_s)
    edges = integral_to(np.array([0.0, horizon_s]))
    useful = float(edges[1] - edges[0] - (integral_to(hi) - integral_to(lo)).sum())

    # Idle = paused, or no healthy slice left (only tiny learners ever get there).
    dead = np.flatnonzero(caps <= 0.0)
    idle_s, idle_e = union_intervals(np.concatenate([p_start, grid[dead]]), np.concatenate([p_end, grid[dead + 1]]))
    return useful, idle_s, idle_e, int(np.count_nonzero((fails >= 0) & (fails < horizon_s)))


def simulate_decoupled(
    chips: float, learners: int, quorum: int, model: FailureModel, rng: np.random.Generator
) -> SystemResult:
    """M independent elastic learners of chips / M each; uptime needs ``quorum`` of them stepping."""
    horizon_s = model.horizon_days * SECONDS_PER_DAY
    useful = 0.0
    failures = 0
    bounds: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    for _ in range(learners):
        u, idle_s, idle_e, f = _simulate_learner(chips / learners, model, rng)
        useful += u
        failures += f
        idle_s, idle_e = np.clip(idle_s, 0.0, horizon_s), np.clip(idle_e, 0.0, horizon_s)
        bounds += [idle_s, idle_e]
        steps += [np.ones(idle_s.size), -np.ones(idle_e.size)]
    # Count idle learners over time from +1/-1 boundaries; stepping = M - idle.
    t = np.concatenate([*bounds, [0.0, horizon_s]])
    d = np.concatenate([*steps, [0.0, 0.0]])
    order = np.argsort(t, kind="stable")
    t, idle = t[order], np.cumsum(d[order])
    seg = np.diff(t)
    uptime = float(seg[(learners - idle[:-1]) >= quorum].sum() / horizon_s)
    return SystemResult(goodput=useful / (learners * horizon_s), uptime=uptime, failures=failures)


def simulate_elastic(chips: float, model: FailureModel, rng: np.random.Generator) -> SystemResult:
    """Elastic DP is one learner holding every chip."""
    return simulate_decoupled(chips, 1, 1, model, rng)


def cell_rng(seed: int, system: str, chips: float, learners: int) -> np.random.Generator:
    """An independent generator per (system, chips, M), so a cell does not depend on sweep order."""
    return np.random.default_rng([seed, SYSTEMS.index(system), round(chips), learners])


def simulate_all(chips: float, learners: int, quorum: int, model: FailureModel, seed: int) -> dict[str, SystemResult]:
    """The three systems at one cluster size."""
    check_shape(chips, learners, quorum, seed)
    model.check()
    check_size(chips, model)
    dp, elastic_dp, decoupled = SYSTEMS
    return {
        dp: simulate_dp(chips, model, cell_rng(seed, dp, chips, 1)),
        elastic_dp: simulate_elastic(chips, model, cell_rng(seed, elastic_dp, chips, 1)),
        decoupled: simulate_decoupled(chips, learners, quorum, model, cell_rng(seed, decoupled, chips, learners)),
    }


def expected_failures(chips: float, model: FailureModel) -> float:
    """Failures a cell draws on average: over the horizon and the warm-up before it."""
    rate = chips / (model.mtbi_chip_years * SECONDS_PER_YEAR)
    elastic_warmup_s = _repair_tail_s(model) + max(model.pause_on_failure_s, model.pause_on_return_s)
    return rate * (model.horizon_days * SECONDS_PER_DAY + max(elastic_warmup_s, 10.0 * model.dp_restart_s))


def check_size(chips: float, model: FailureModel, available_bytes: int | None = None) -> None:
    """Raise SettingError, before anything is drawn, for a simulation larger than this machine's memory."""
    failures = expected_failures(chips, model)
    need = BYTES_PER_FAILURE * failures
    if available_bytes is None:
        import psutil

        available_bytes = int(psutil.virtual_memory().available)
    if not need <= available_bytes:  # also refuses an infinite or NaN count
        from dlc.units import format_bytes

        raise SettingError(
            f"simulating {chips:.3g} chips for {model.horizon_days:g} days draws about {failures:.3g} failures "
            f"({model.failures_per_chip_year:g} per chip-year, over the horizon and a warm-up as long as the longest "
            f"repair), which needs about {format_bytes(need)} of memory; this machine has "
            f"{format_bytes(available_bytes)} available: shorten ",
            Setting("horizon_days"),
            ", or lower ",
            Setting("chips"),
            ", ",
            Setting("failures_per_chip_year"),
            ", ",
            Setting("repair_mean_h"),
            " or ",
            Setting("dp_restart_s"),
        )


def check_shape(chips: float, learners: int, quorum: int, seed: int = 0) -> None:
    """Raise SettingError for a cluster that cannot be built."""
    seed_, chips_, learners_, quorum_ = Setting("seed"), Setting("chips"), Setting("learners"), Setting("quorum")
    if not 0 <= seed <= MAX_SEED:
        raise SettingError(seed_, f"={seed} must be between 0 and 2^63 - 1: pass e.g. ", seed_, " 0")
    if not (chips > 0 and math.isfinite(chips)):
        raise SettingError(chips_, f"={chips:g} must be positive and finite: pass e.g. ", chips_, " 1.2M")
    if learners < 1:
        raise SettingError(learners_, f"={learners} must be at least 1")
    if not 1 <= quorum <= learners:
        raise SettingError(quorum_, f"={quorum} must be between 1 and ", learners_, f"={learners}: lower the quorum")
    if chips / learners < 1:
        raise SettingError(learners_, f"={learners} leaves under one chip per learner at ", chips_, f"={chips:g}")


@dataclass(frozen=True)
class SweepRow:
    """One row of the sweep table: a system and its goodput at each chip count."""

    label: str
    system: str
    learners: int
    results: tuple[SystemResult, ...]


def sweep(
    chips_list: Sequence[float],
    learners_list: Sequence[int],
    quorum: int,
    model: FailureModel,
    seed: int,
    on_cell: Callable[[], None] | None = None,
) -> list[SweepRow]:
    """The paper's layout: plain DP, elastic DP, then decoupled for each M > 1."""
    model.check()
    ms = sorted({m for m in learners_list if m > 1})
    for chips in chips_list:
        for m in [1, *ms]:
            check_shape(chips, m, min(quorum, m), seed)
    check_size(max(chips_list), model)
    rows: list[SweepRow] = []

    def run(label: str, system: str, m: int, fn: Callable[[float], SystemResult]) -> None:
        results = []
        for chips in chips_list:
            results.append(fn(chips))
            if on_cell is not None:
                on_cell()
        rows.append(SweepRow(label, system, m, tuple(results)))

    dp, elastic_dp, decoupled = SYSTEMS
    run(LABELS[dp], dp, 1, lambda c: simulate_dp(c, model, cell_rng(seed, dp, c, 1)))
    run(LABELS[elastic_dp], elastic_dp, 1, lambda c: simulate_elastic(c, model, cell_rng(seed, elastic_dp, c, 1)))
    for m in ms:

        def decoupled_cell(c: float, m: int = m, k: int = min(quorum, m)) -> SystemResult:
            return simulate_decoupled(c, m, k, model, cell_rng(seed, decoupled, c, m))

        run(f"{LABELS[decoupled]} M={m}", decoupled, m, decoupled_cell)
    return rows


def sweep_cells(chips_list: Sequence[float], learners_list: Sequence[int]) -> int:
    """How many cells ``sweep`` will simulate, for a progress bar."""
    return len(chips_list) * (2 + len({m for m in learners_list if m > 1}))
