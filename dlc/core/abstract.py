"""The model's arrays read from the model itself, by abstract evaluation: shapes and bytes, nothing allocated.

`jax.eval_shape` runs the model's constructor, the optimizer's `init` and the loss's forward pass on
shapes alone, so the names and shapes of the parameters (`param_shapes`), the optimizer's state and
the activations a step keeps for its backward pass (`learner_arrays`) come from the same code that
trains, for either family and any option. Nothing here touches a device: the driver sizes a run
(`dlc.plan.memory`) before it starts a process, also on a machine whose GPUs belong to the learners.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, cast

import jax
import numpy as np

from dlc.config.schema import Recipe
from dlc.config.workload import ModelConfig
from dlc.core.sharding import fsdp_axis

# XLA on CPU computes bfloat16 in float32: a CPU learner's activations take float32's bytes whatever
# model.compute_dtype says (measured: the step's temporary memory of a bf16 model is within 10% of
# the float32 model's).
CPU_FLOAT_BYTES = 4


@functools.lru_cache(maxsize=8)
def _abstract(model_json: str) -> tuple[Any, dict[str, jax.ShapeDtypeStruct], Any]:
    from flax import nnx

    from dlc.core.model import Transformer, flatten_params

    model = ModelConfig.model_validate_json(model_json)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(model, nnx.Rngs(0))), nnx.Param)
    params = nnx.to_pure_dict(state)
    return graphdef, cast(dict[str, jax.ShapeDtypeStruct], flatten_params(params)), params


def abstract_params(model: ModelConfig) -> tuple[Any, Any]:
    """The model's graph and its parameters as a nested dict of `jax.ShapeDtypeStruct`."""
    graphdef, _, params = _abstract(model.model_dump_json())
    return graphdef, params


def param_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, by the path names `dlc.core.model.flatten_params` gives it."""
    return {name: tuple(leaf.shape) for name, leaf in _abstract(model.model_dump_json())[1].items()}


def param_count(model: ModelConfig) -> int:
    """Parameters of the model. Every block has the same ones, so a model of one block and one of two
    give the count of any depth exactly, without tracing a deep model (which takes minutes a thousand
    blocks: a recipe of absurd depth is refused at once rather than traced)."""
    if model.num_layers <= 2:
        return sum(math.prod(shape) for shape in param_shapes(model).values())
    one, two = (param_count(model.model_copy(update={"num_layers": n})) for n in (1, 2))
    return one + (model.num_layers - 1) * (two - one)


def _nbytes(leaf: Any, float_bytes: int | None = None) -> int:
    itemsize = np.dtype(leaf.dtype).itemsize
    if float_bytes is not None and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
        itemsize = max(itemsize, float_bytes)
    return math.prod(leaf.shape) * itemsize


def _on_devices(leaves: list[Any], devices: int, fsdp: int) -> int:
    """Bytes `leaves` take on all `devices` of a learner together: split over fsdp along the axis
    `dlc.core.sharding` splits them on, replicated over the rest."""
    total = 0
    for leaf in leaves:
        split = fsdp if fsdp_axis(tuple(leaf.shape), fsdp) is not None else 1
        total += _nbytes(leaf) * devices // split
    return total


@dataclass(frozen=True)
class LearnerArrays:
    """Bytes of what one learner holds, all its devices together."""

    params: int
    optimizer: int  # AdamW's moments and step counters, and an lr factor a tensor, in the parameters' layout
    activations: int  # what the step's forward pass keeps for its backward pass, beyond the parameters

    @property
    def state(self) -> int:
        return self.params + self.optimizer


def learner_arrays(recipe: Recipe, index: int, cpu: bool = True) -> LearnerArrays:
    """What learner `index` of `recipe` holds across its devices. `cpu`: its activations in float32
    (`CPU_FLOAT_BYTES`), as XLA on CPU computes them.

    Parameters and optimizer state are sharded over the learner's fsdp axis and replicated over data
    (`dlc.core.sharding`). The activations are the residuals of the loss's `jax.vjp` on the learner's
    batch: every value the backward pass reads, less the parameters themselves. They are the whole
    batch's wherever its rows are split; gradients, made during the backward pass as the residuals are
    released, are not counted again.
    """
    settings = recipe.learners.resolved(index)
    devices = settings.devices
    fsdp = settings.mesh[1] if devices > 1 else 1
    _, params = abstract_params(recipe.model)
    inner = recipe.inner.model_dump_json()
    optimizer = _optimizer_leaves(recipe.model.model_dump_json(), inner, recipe.schedule_steps())
    per_example = activation_bytes(recipe.model, recipe.learners.seq_len, CPU_FLOAT_BYTES if cpu else None)
    return LearnerArrays(
        params=_on_devices(jax.tree_util.tree_leaves(params), devices, fsdp),
        optimizer=_on_devices(optimizer, devices, fsdp),
        activations=settings.batch_size * per_example,
    )


@functools.lru_cache(maxsize=8)
def _optimizer_leaves(model_json: str, inner_json: str, schedule_steps: int) -> list[jax.ShapeDtypeStruct]:
    """AdamW's state for the model, abstract: the same for every learner of a run, whatever its batch."""
    from dlc.config.workload import InnerConfig
    from dlc.core.steps import make_optimizer

    optimizer = make_optimizer(InnerConfig.model_validate_json(inner_json), schedule_steps)
    return jax.tree_util.tree_leaves(jax.eval_shape(optimizer.init, _abstract(model_json)[2]))


@functools.lru_cache(maxsize=16)
def _residual_bytes(model_json: str, seq: int, float_bytes: int | None) -> int:
    from dlc.core.steps import cross_entropy

    graphdef, flat, params = _abstract(model_json)
    tokens = jax.ShapeDtypeStruct((1, seq), np.int32)

    def residuals(p: Any, x: Any) -> Any:  # the vjp's closure holds exactly what the backward pass reads
        return jax.vjp(lambda q: cross_entropy(graphdef, q, x, x), p)[1]

    saved = jax.tree_util.tree_leaves(jax.eval_shape(residuals, params, tokens))
    total = sum(_nbytes(leaf, float_bytes) for leaf in saved)
    return max(total - sum(_nbytes(leaf, float_bytes) for leaf in flat.values()), 0)


def activation_bytes(model: ModelConfig, seq: int, float_bytes: int | None = CPU_FLOAT_BYTES) -> int:
    """Bytes one sequence of `seq` tokens keeps for the backward pass (a batch keeps batch times as
    much: every activation is per example). `float_bytes`: the least bytes a float takes.

    With `model.remat=block` the forward pass keeps each block's input only, and the backward pass
    holds one recomputed block's activations at a time: a one-block model's (its embeddings and
    logits too) are a generous bound on those."""
    saved = _residual_bytes(model.model_dump_json(), seq, float_bytes)
    if model.remat == "block":
        one_block = model.model_copy(update={"num_layers": 1, "remat": "none"})
        saved += _residual_bytes(one_block.model_dump_json(), seq, float_bytes)
    return saved
