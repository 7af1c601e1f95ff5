"""The training algorithms, named once: the recipe's `algorithm`, and the variants the planning tools compare.

`dlc train` runs one of `ALGORITHM_NAMES`. `dlc simulate` and `dlc bandwidth` model some of them in
more than one way and print each way under a name of its own; every such name is declared here
with the algorithm it models, so the three tools share one vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

AlgorithmName = Literal["decoupled", "diloco", "dp", "none"]
ALGORITHM_NAMES: tuple[AlgorithmName, ...] = get_args(AlgorithmName)

ALGORITHM_DESCRIPTION = (
    "decoupled: Decoupled DiLoCo; diloco: blocking DiLoCo (every H steps all learners send "
    "the whole model and wait); dp: data-parallel (every step all learners send gradients and wait); "
    "none: independent learners that never synchronise (a baseline for overhead; no global model)."
)


@dataclass(frozen=True)
class Variant:
    """One algorithm as a planning tool models it, under the name the tool prints (JSON keys included)."""

    name: str
    algorithm: AlgorithmName
    label: str  # the title of its row in a table


# `dlc simulate`, in this order (a cell's random stream is seeded with the system's position).
SIMULATED_SYSTEMS: tuple[Variant, ...] = (
    # restarts the whole job after any failure, with idle hot spares so it never waits for a repair
    Variant("dp", "dp", "DP, no elasticity"),
    # pauses to reconfigure on every failure and return, as `dlc train algorithm=dp` does
    Variant("elastic_dp", "dp", "DP, elastic"),
    Variant("decoupled", "decoupled", "decoupled"),
)

# `dlc bandwidth`: decoupled twice, sending bf16 and int4 values.
BANDWIDTH_APPROACHES: tuple[Variant, ...] = (
    Variant("dp", "dp", "dp"),
    Variant("diloco", "diloco", "diloco"),
    Variant("decoupled_bf16", "decoupled", "decoupled_bf16"),
    Variant("decoupled_int4", "decoupled", "decoupled_int4"),
)
