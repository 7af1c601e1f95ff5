"""WAN bandwidth each approach needs: closed forms and a step-level link simulation.

Per site, with N parameters at b bits per value and M sites, one ring all-reduce moves
``S = 2 (1 - 1/M) b N`` bits over each site's link. Compute of one step takes T seconds,
the backward pass the last ``backward_fraction`` of it.

- **DP** all-reduces S every step. Gradient buckets leave during the backward pass and the
  next step waits for the last one, so at utilisation CU the link has
  ``T_bwd + T (1/CU - 1)`` seconds per step.
- **Blocking DiLoCo** all-reduces the outer gradient every H steps and waits for it:
  ``T_bwd + H T (1/CU - 1)`` seconds per sync.
- **Decoupled** sends one fragment (S/P bits) every H/P steps and never waits for it, so
  compute utilisation is 100% at any bandwidth that keeps up on average; what the design
  needs is each merged fragment back within tau steps. The link must carry
  ``max(S / (H T), (S/P) / (tau T))``.

The simulation replays steps against a FIFO link (one message at a time, in release
order) and searches the smallest bandwidth that meets the target; it adds what the closed
forms leave out, such as the last gradient bucket that cannot overlap any compute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlc.config.algorithms import BANDWIDTH_APPROACHES
from dlc.errors import UserError
from dlc.plan.inputs import LinkSetup, Setting, SettingError

GBIT = 1e9

# The decoupled simulation replays this many passes over the fragments.
SIM_CYCLES = 500
# Arrays the step simulation holds per message at once: release and finish times, indices,
# their differences and running maximum, the deadline test (8 bytes each, with room to spare).
SIM_BYTES_PER_MESSAGE = 96

CODEC_BITS: dict[str, float] = {"none": 32.0, "bf16": 16.0, "int8": 8.0, "int4": 4.0}


def codec_bits_per_value(codec: str, block_size: int = 64, scale_bits: int = 32) -> float:
    """Bits on the wire per value for a dlc codec, block scales included (int8/int4)."""
    if codec not in CODEC_BITS:
        raise UserError(f"codec {codec!r} is not one of {', '.join(CODEC_BITS)}")
    bits = CODEC_BITS[codec]
    return bits + scale_bits / block_size if codec in ("int8", "int4") else bits


def bytes_per_step(
    params: int,
    fragments: int,
    H: int,
    bits_per_value: float,
    reply_bits_per_value: float = 0.0,
    header_bytes: int = 0,
) -> float:
    """Mean bytes one learner sends per inner step in a decoupled run.

    Every parameter is pushed once per H steps, split into ``fragments`` messages of
    ``header_bytes`` overhead each. ``reply_bits_per_value`` > 0 adds the merged fragments
    the syncer sends back (learner receive side).
    """
    if params < 1 or fragments < 1 or H < 1 or bits_per_value <= 0 or reply_bits_per_value < 0:
        raise UserError(
            f"bytes_per_step needs params, fragments, H >= 1 and bits_per_value > 0; got params={params}, "
            f"fragments={fragments}, H={H}, bits_per_value={bits_per_value}"
        )
    payload = params * (bits_per_value + reply_bits_per_value) / 8.0
    messages = fragments * (2 if reply_bits_per_value > 0 else 1)
    return (payload + messages * header_bytes) / H


def check_size(setup: LinkSetup, available_bytes: int | None = None) -> None:
    """Raise SettingError, before any array exists, for simulations larger than this machine's memory."""
    if available_bytes is None:
        import psutil

        available_bytes = int(psutil.virtual_memory().available)
    for name, count, what in (
        ("fragments", SIM_CYCLES * setup.fragments, f"{SIM_CYCLES} cycles of {setup.fragments:,} fragments"),
        ("buckets", setup.buckets, f"{setup.buckets:,} gradient buckets"),
    ):
        need = SIM_BYTES_PER_MESSAGE * count
        if need > available_bytes:
            from dlc.units import format_bytes

            raise SettingError(
                Setting(name),
                f"={getattr(setup, name):,}: the step simulation replays {what}, which needs about "
                f"{format_bytes(need)} of memory; this machine has {format_bytes(available_bytes)} available: lower ",
                Setting(name),
            )


def dp_gbps(setup: LinkSetup, bits_per_value: float | None = None) -> float:
    """Closed form for DP: S within the backward pass plus the allowed stall, every step."""
    b = setup.bits_per_value if bits_per_value is None else bits_per_value
    t = setup.step_time_s
    window = setup.backward_fraction * t + t * (1.0 / setup.utilisation - 1.0)
    return setup.sync_bits(b) / window / GBIT


def diloco_gbps(setup: LinkSetup, bits_per_value: float | None = None) -> float:
    """Closed form for blocking DiLoCo: S every H steps, the stall budget of H steps to hide it."""
    b = setup.bits_per_value if bits_per_value is None else bits_per_value
    t = setup.step_time_s
    window = setup.backward_fraction * t + setup.H * t * (1.0 / setup.utilisation - 1.0)
    return setup.sync_bits(b) / window / GBIT


def decoupled_gbps(setup: LinkSetup, bits_per_value: float) -> float:
    """Closed form for decoupled: keep up on average, and return each fragment within tau steps."""
    s = setup.sync_bits(bits_per_value)
    t = setup.step_time_s
    sustained = s / (setup.H * t)
    deadline = s / setup.fragments / (setup.tau * t)
    return max(sustained, deadline) / GBIT


def _fifo_finish(release_s: np.ndarray, size_bits: float, bps: float) -> np.ndarray:
    """Finish times of equal messages sent in order over one link.

    f_i = max(f_{i-1}, r_i) + s/B unrolls to (i+1) s/B + max_{j<=i} (r_j - j s/B).
    """
    tx = size_bits / bps
    idx = np.arange(release_s.size)
    return (idx + 1) * tx + np.maximum.accumulate(release_s - idx * tx)


def _smallest(ok: Callable[[float], bool], guess_bps: float) -> float:
    """Smallest bandwidth for which ``ok`` holds (``ok`` is monotone in bandwidth)."""
    if not (math.isfinite(guess_bps) and guess_bps > 0):
        raise SettingError(
            "no finite bandwidth meets the target at these inputs: check ",
            Setting("params"),
            ", ",
            Setting("tau"),
            ", ",
            Setting("step_time_s"),
            " and ",
            Setting("bits_per_value"),
        )
    lo, hi = guess_bps, guess_bps
    while ok(lo) and lo > 1.0:
        lo /= 2.0
    while not ok(hi):
        hi *= 2.0
        if hi > guess_bps * 1e12:
            raise SettingError(
                f"no link under {hi / GBIT:.3g} Gbit/s meets the target: lower ",
                Setting("utilisation"),
                " or raise ",
                Setting("tau"),
                ", ",
                Setting("H"),
                " or ",
                Setting("step_time_s"),
            )
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def _blocking_utilisation(setup: LinkSetup, bits: float, bps: float, compute_steps: int) -> float:
    """Utilisation when ``bits`` leave in buckets during the last backward pass and the next step waits."""
    t = setup.step_time_s
    n = setup.buckets
    t_fwd = (1.0 - setup.backward_fraction) * t
    # Bucket k is ready once the backward pass has covered k+1 of n equal parts.
    release = t_fwd + setup.backward_fraction * t * np.arange(1, n + 1) / n
    last = _fifo_finish(release, bits / n, bps)[-1]
    return compute_steps * t / ((compute_steps - 1) * t + max(t, last))


def dp_sim_gbps(setup: LinkSetup, bits_per_value: float | None = None) -> float:
    """Step-level simulation for DP: smallest bandwidth reaching the utilisation target."""
    b = setup.bits_per_value if bits_per_value is None else bits_per_value
    s = setup.sync_bits(b)
    return _smallest(lambda bps: _blocking_utilisation(setup, s, bps, 1) >= setup.utilisation, s) / GBIT


def diloco_sim_gbps(setup: LinkSetup, bits_per_value: float | None = None) -> float:
    """Step-level simulation for blocking DiLoCo (sync during the H-th backward pass)."""
    b = setup.bits_per_value if bits_per_value is None else bits_per_value
    s = setup.sync_bits(b)
    return _smallest(lambda bps: _blocking_utilisation(setup, s, bps, setup.H) >= setup.utilisation, s) / GBIT


def decoupled_sim_gbps(setup: LinkSetup, bits_per_value: float, cycles: int = SIM_CYCLES) -> float:
    """Step-level simulation for decoupled: every fragment back within tau steps, over many cycles.

    Fragment i leaves at the end of step ceil((i+1) H / P); compute never waits, so
    release times do not depend on the link. ``cycles`` full passes over the fragments
    let a link that is slightly too slow on average build a queue that breaks the deadline.
    """
    t = setup.step_time_s
    n = cycles * setup.fragments
    steps = np.ceil((np.arange(n) + 1) * setup.H / setup.fragments)
    release = steps * t
    size = setup.sync_bits(bits_per_value) / setup.fragments
    deadline = setup.tau * t * (1.0 + 1e-9)

    def ok(bps: float) -> bool:
        return bool(np.all(_fifo_finish(release, size, bps) - release <= deadline))

    return _smallest(ok, size / (setup.tau * t)) / GBIT


@dataclass(frozen=True)
class BandwidthRow:
    """One approach: what it sends and the Gbit/s it needs, closed form and simulated."""

    approach: str
    bits_per_value: float
    gbps: float
    sim_gbps: float
    gbit_per_step: float


def plan(setup: LinkSetup) -> list[BandwidthRow]:
    """DP, blocking DiLoCo and decoupled (bf16, int4) side by side."""
    setup.check()
    check_size(setup)
    b, h = setup.bits_per_value, setup.H
    dp, diloco, decoupled_bf16, decoupled_int4 = BANDWIDTH_APPROACHES
    rows = [
        BandwidthRow(dp.name, b, dp_gbps(setup), dp_sim_gbps(setup), setup.sync_bits(b) / GBIT),
        BandwidthRow(diloco.name, b, diloco_gbps(setup), diloco_sim_gbps(setup), setup.sync_bits(b) / h / GBIT),
    ]
    for approach, bits in ((decoupled_bf16, 16.0), (decoupled_int4, setup.int4_bits)):
        rows.append(
            BandwidthRow(
                approach.name,
                bits,
                decoupled_gbps(setup, bits),
                decoupled_sim_gbps(setup, bits),
                setup.sync_bits(bits) / h / GBIT,
            )
        )
    assert all(math.isfinite(r.gbps) and math.isfinite(r.sim_gbps) for r in rows)
    return rows


def recipe_traffic(recipe: Any) -> dict[str, float]:
    """Predicted bytes per inner step of one learner in a `dlc train` run of `recipe`.

    Exact codec sizes of the recipe's own fragments: each fragment goes up once every H steps
    (the syncer asks for it once per round) and comes back once per round, to every learner
    (int8/int4 down: as a difference from the version the learner holds). diloco
    sends the whole model every H steps, dp its gradient every step (and gets the model back);
    none sends nothing.
    """
    from dlc.algo import get_algorithm
    from dlc.core.codec import get_codec
    from dlc.plan.memory import fragment_plan

    traffic = get_algorithm(recipe.algorithm).traffic(recipe)
    plan = fragment_plan(recipe)  # from the shapes alone: nothing as large as the model is allocated
    up = get_codec(traffic.up_codec, recipe.syncer.codec_block_values)
    down = get_codec(traffic.down_codec, recipe.syncer.codec_block_values)
    sizes = [plan.size(p) for p in range(plan.num_fragments)]
    params = plan.total_size
    sends = 1.0 if traffic.sends else 0.0
    up_bytes = sends * sum(up.encoded_nbytes(n) for n in sizes) / traffic.interval_steps
    down_bytes = sends * sum(down.encoded_nbytes(n) for n in sizes) / traffic.interval_steps
    return {
        "params": params,
        "up_bytes_per_step": up_bytes,
        "down_bytes_per_step": down_bytes,
        "fp32_gradient_bytes": 4 * params,
        "up_vs_fp32_gradient": up_bytes / (4 * params),
        # data-parallel moves an fp32 gradient up and the model down every step
        "total_vs_dp_fp32": (up_bytes + down_bytes) / (8 * params),
    }
