"""What every block family shares: the `Family` a family module declares, and attention with a cache.

A family (`model.arch`) is one module of `dlc.core.arch` that declares a `FAMILY`: its attention and
MLP layers, its norm, whether positions are learned, its default MLP width and its Hugging Face
layout. `dlc.core.model` puts the layers into the same pre-norm block for every family, and one
forward pass serves training and decoding: a layer given a key-value cache writes its keys and values
there and attends against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dlc.config.workload import ModelConfig

# One block's keys and values, each [B, context_len, G, K] (G: key/value heads): position p holds
# token p's once it was read.
KV = tuple[jax.Array, jax.Array]


@dataclass(frozen=True)
class HFLayout:
    """A family's Hugging Face layout: dlc path -> (Hugging Face name, transposed), and its config.json."""

    architecture: str  # the transformers class an export loads as
    top: dict[str, tuple[str, bool]]
    block_prefix: str  # of block i's names, with {i}
    block: dict[str, tuple[str, bool]]  # paths under blocks/i
    head: tuple[str, bool]  # head/kernel, in untied models
    # Hugging Face's biases that dlc's blocks lack: written as zeros the size of the named kernel's
    # output, and refused unless zero when read back.
    zero_biases: dict[str, str]
    config: Callable[[ModelConfig, int | None], dict[str, Any]]  # config.json but "architectures" (export adds it)


@dataclass(frozen=True)
class Family:
    """One block family: what `dlc.core.model`, decoding and export need of it."""

    name: str  # model.arch
    # (cfg, rngs) -> a layer: attention(x_BxTxD, positions_T, cache) -> (y_BxTxD, cache); mlp(x_BxTxD).
    attention: Callable[[ModelConfig, nnx.Rngs], Any]
    mlp: Callable[[ModelConfig, nnx.Rngs], Any]
    norm: Callable[..., Any]  # (width, dtype=, rngs=) -> a norm layer
    learned_positions: bool  # a pos_embed table of context_len positions, added to the embedding
    mlp_hidden: Callable[[ModelConfig], int]  # the MLP width when model.mlp_hidden is not given (`arch.mlp_hidden`)
    hf: HFLayout


def compute_dtype(cfg: ModelConfig) -> Any:
    return jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32


def initializer(cfg: ModelConfig) -> Any:
    return nnx.initializers.normal(stddev=cfg.init_std)


def residual_initializer(cfg: ModelConfig) -> Any:
    """Residual projections start smaller so the residual stream's variance stays bounded with depth
    (GPT-2's scaled initialisation)."""
    return nnx.initializers.normal(stddev=cfg.init_std / (2 * cfg.num_layers) ** 0.5)


def attend(
    q_BxTxHxK: jax.Array, k_BxTxGxK: jax.Array, v_BxTxGxK: jax.Array, positions_T: jax.Array, cache: KV | None
) -> tuple[jax.Array, KV | None]:
    """Causal attention, each key/value head g serving query heads g*R..g*R+R-1 (R = H/G).

    Without a cache, over the T positions given. With one, the keys and values are written at
    positions_T (consecutive) and each query attends to the cache up to its own position, so entries
    past it (stale, or a prefill's padding) are never read.
    """
    if cache is None:
        return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, is_causal=True), None
    keys_BxCxGxK, values_BxCxGxK = cache
    start = (0, positions_T[0], 0, 0)
    keys_BxCxGxK = jax.lax.dynamic_update_slice(keys_BxCxGxK, k_BxTxGxK.astype(keys_BxCxGxK.dtype), start)
    values_BxCxGxK = jax.lax.dynamic_update_slice(values_BxCxGxK, v_BxTxGxK.astype(values_BxCxGxK.dtype), start)
    visible_TxC = jnp.arange(keys_BxCxGxK.shape[1])[None, :] <= positions_T[:, None]
    y_BxTxHxK = jax.nn.dot_product_attention(
        q_BxTxHxK.astype(keys_BxCxGxK.dtype), keys_BxCxGxK, values_BxCxGxK, mask=visible_TxC[None, None]
    )
    return y_BxTxHxK.astype(q_BxTxHxK.dtype), (keys_BxCxGxK, values_BxCxGxK)
