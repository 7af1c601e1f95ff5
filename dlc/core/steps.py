"""The inner optimizer and the pure, jitted train and eval steps of one learner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import jax.stages
import optax
from flax import nnx
from jax.typing import ArrayLike

from dlc.config.workload import InnerConfig
from dlc.core.model import Params, apply_model

Metrics = dict[str, jax.Array]


class TrainStep(Protocol):
    """The jitted inner step: called, or lowered and compiled before its first call (`Learner.compile`)."""

    def __call__(
        self, params: Params, opt_state: Any, x_BxT: jax.Array, y_BxT: jax.Array
    ) -> tuple[Params, Any, Metrics]: ...
    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered: ...


def make_schedule(cfg: InnerConfig, schedule_steps: int) -> optax.Schedule:
    """Linear warm-up to lr, then down to lr * min_lr_ratio at schedule_steps: a cosine decay over
    the rest (`cosine`), or lr held until the last `decay_fraction` of the steps decays linearly (`wsd`)."""
    warmup = min(cfg.warmup_steps, max(schedule_steps - 1, 0))
    end = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        decay = min(max(round(schedule_steps * cfg.decay_fraction), 1), max(schedule_steps - warmup, 1))
        stable = schedule_steps - warmup - decay
        return optax.join_schedules(
            [
                optax.linear_schedule(0.0, cfg.lr, warmup),
                optax.constant_schedule(cfg.lr),
                optax.linear_schedule(cfg.lr, end, decay),
            ],
            boundaries=[warmup, warmup + max(stable, 0)],
        )
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(schedule_steps, warmup + 1),
        end_value=end,
    )


class LeafScales(NamedTuple):
    """`scale_by_leaf`'s state: one factor a parameter tensor, in `jax.tree_util.tree_leaves` order."""

    scales: jax.Array


def scale_by_leaf() -> optax.GradientTransformation:
    """Multiply each tensor's update by its factor in the state (1 at first): a learning rate per
    tensor that the learner sets between steps (`Learner.set_leaf_scales`) without a recompile."""

    def init(params: Any) -> LeafScales:
        return LeafScales(jnp.ones(len(jax.tree_util.tree_leaves(params)), jnp.float32))

    def update(updates: Any, state: LeafScales, params: Any = None) -> tuple[Any, LeafScales]:
        leaves, tree = jax.tree_util.tree_flatten(updates)
        scaled = [leaf * state.scales[i].astype(leaf.dtype) for i, leaf in enumerate(leaves)]
        return jax.tree_util.tree_unflatten(tree, scaled), state

    return optax.GradientTransformation(init, update)


def make_optimizer(cfg: InnerConfig, schedule_steps: int) -> optax.GradientTransformation:
    """AdamW with clipping, each tensor's step then multiplied by its factor (`scale_by_leaf`: 1 unless
    `syncer.lr_feedback` sets it, there whatever the recipe, so that every checkpoint has one shape).
    Biases, norms and embeddings of rank < 2 are not decayed."""
    decay_mask = lambda params: jax.tree_util.tree_map(lambda x: x.ndim >= 2, params)  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip_norm),
        optax.adamw(
            make_schedule(cfg, schedule_steps),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=decay_mask,
        ),
        scale_by_leaf(),
    )


def cross_entropy(graphdef: nnx.GraphDef, params: Params, x_BxT: jax.Array, y_BxT: jax.Array) -> jax.Array:
    """Mean next-byte cross-entropy in nats."""
    logits_BxTxV = apply_model(graphdef, params, x_BxT).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, y_BxT).mean()


def objective(
    graphdef: nnx.GraphDef, params: Params, x_BxT: jax.Array, y_BxT: jax.Array, z_loss: float
) -> tuple[jax.Array, jax.Array]:
    """What the inner step minimises, and the cross-entropy in it: the cross-entropy plus
    z_loss * mean(logsumexp(logits)^2) (`inner.z_loss`)."""
    if not z_loss:
        loss = cross_entropy(graphdef, params, x_BxT, y_BxT)
        return loss, loss
    logits_BxTxV = apply_model(graphdef, params, x_BxT).astype(jnp.float32)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, y_BxT).mean()
    z_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
    return loss + z_loss * jnp.mean(z_BxT**2), loss


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    shardings: tuple[Any, Any, Any, Any] | None = None,
    z_loss: float = 0.0,
) -> TrainStep:
    """The jitted inner step. `shardings`, for a learner on several devices: the layouts of the parameters,
    the optimizer state, a batch, and replicated values; the step keeps the state where it is. Its
    `loss` is the cross-entropy, whatever `z_loss` adds to what it minimises."""

    def train_step(params: Params, opt_state: Any, x_BxT: jax.Array, y_BxT: jax.Array) -> tuple[Params, Any, Metrics]:
        (_, loss), grads = jax.value_and_grad(objective, argnums=1, has_aux=True)(
            graphdef, params, x_BxT, y_BxT, z_loss
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    # Donation lets XLA update parameters and moments in place instead of copying them.
    if shardings is None:
        return jax.jit(train_step, donate_argnums=(0, 1))
    params, opt_state, batch, replicated = shardings
    return jax.jit(
        train_step,
        donate_argnums=(0, 1),
        in_shardings=(params, opt_state, batch, batch),
        out_shardings=(params, opt_state, replicated),
    )


class GradStep(Protocol):
    """The jitted data-parallel step: (loss, gradients, gradient norm); called, or lowered and compiled first."""

    def __call__(self, params: Params, x_BxT: jax.Array, y_BxT: jax.Array) -> tuple[jax.Array, Params, jax.Array]: ...
    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered: ...


def make_grad_step(graphdef: nnx.GraphDef, z_loss: float = 0.0) -> GradStep:
    """Loss (the cross-entropy), gradient and gradient norm without an update (data-parallel: the update is global)."""

    def grad_step(params: Params, x_BxT: jax.Array, y_BxT: jax.Array) -> tuple[jax.Array, Params, jax.Array]:
        (_, loss), grads = jax.value_and_grad(objective, argnums=1, has_aux=True)(
            graphdef, params, x_BxT, y_BxT, z_loss
        )
        return loss, grads, optax.tree.norm(grads)

    return jax.jit(grad_step)


def make_eval_step(graphdef: nnx.GraphDef) -> Callable[[Params, ArrayLike, ArrayLike], jax.Array]:  # host batches
    return jax.jit(lambda params, x, y: cross_entropy(graphdef, params, x, y))
