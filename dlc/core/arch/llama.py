"""Llama's blocks (model.arch=llama): rotary positions, RMSNorm, a SwiGLU MLP, no biases, grouped-query attention.

Grouped-query attention where model.num_kv_heads < num_heads. Its Hugging Face layout is
`LlamaForCausalLM`'s, G = num_kv_heads key/value heads, F the MLP's hidden size; torch's Linear is
[out, in]:

    dlc                              Llama (transformers)                              how
    embed/embedding  [V, D]          model.embed_tokens.weight                         as is
    blocks/i/norm_attn/scale         model.layers.i.input_layernorm.weight             as is
    blocks/i/attn/q/kernel [D, D]    model.layers.i.self_attn.q_proj.weight            transposed
    blocks/i/attn/k/kernel [D, GK]   model.layers.i.self_attn.k_proj.weight            transposed
    blocks/i/attn/v/kernel [D, GK]   model.layers.i.self_attn.v_proj.weight            transposed
    blocks/i/attn/out/kernel [D, D]  model.layers.i.self_attn.o_proj.weight            transposed
    blocks/i/norm_mlp/scale          model.layers.i.post_attention_layernorm.weight    as is
    blocks/i/mlp/gate/kernel [D, F]  model.layers.i.mlp.gate_proj.weight               transposed
    blocks/i/mlp/up/kernel [D, F]    model.layers.i.mlp.up_proj.weight                 transposed
    blocks/i/mlp/down/kernel [F, D]  model.layers.i.mlp.down_proj.weight               transposed
    norm_out/scale                   model.norm.weight                                 as is
    head/kernel  [D, V]              lm_head.weight [V, D]                             transposed (untied only)

No query or key permutation: `rotary` is Hugging Face's (each head's dimensions i and i + K/2
rotate together by position x theta^(-2i/K)), and both give query head h key/value head h // (H/G).
config.json gives the sizes, RMSNorm epsilon 1e-6 (Flax's), rope_theta, and no biases.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dlc.config.workload import ModelConfig
from dlc.core.arch import mlp_hidden
from dlc.core.arch.base import KV, Family, HFLayout, attend, compute_dtype, initializer, residual_initializer
from dlc.core.shapes import NORM_EPS, head_dim, kv_heads, vocab_size


def rotary(x_BxTxHxK: jax.Array, positions_T: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding, as Llama in Hugging Face applies it: each head's dimensions i and
    i + K/2 rotate together by position x theta^(-2i/K). Computed in float32, returned in x's dtype."""
    K = x_BxTxHxK.shape[-1]
    inverse_frequency = 1.0 / theta ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K)
    angles_TxK = jnp.tile(positions_T.astype(jnp.float32)[:, None] * inverse_frequency[None, :], (1, 2))
    cos, sin = jnp.cos(angles_TxK)[:, None, :], jnp.sin(angles_TxK)[:, None, :]  # broadcast over heads
    x = x_BxTxHxK.astype(jnp.float32)
    half = K // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).astype(x_BxTxHxK.dtype)


class Attention(nnx.Module):
    """Separate query, key and value projections, rotary positions on queries and keys, and
    num_kv_heads key/value heads each shared by num_heads / num_kv_heads query heads."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, kv_heads(cfg), head_dim(cfg)
        self.theta = cfg.rope_theta
        init, dtype, D = initializer(cfg), compute_dtype(cfg), cfg.width
        kv = self.num_kv_heads * self.head_dim
        self.q = nnx.Linear(D, D, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.k = nnx.Linear(D, kv, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.v = nnx.Linear(D, kv, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(D, D, use_bias=False, kernel_init=residual_initializer(cfg), dtype=dtype, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array, cache: KV | None) -> tuple[jax.Array, KV | None]:
        B, T, D = x_BxTxD.shape
        q_BxTxHxK = rotary(self.q(x_BxTxD).reshape(B, T, self.num_heads, self.head_dim), positions_T, self.theta)
        k_BxTxGxK = rotary(self.k(x_BxTxD).reshape(B, T, self.num_kv_heads, self.head_dim), positions_T, self.theta)
        v_BxTxGxK = self.v(x_BxTxD).reshape(B, T, self.num_kv_heads, self.head_dim)
        y_BxTxHxK, cache = attend(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, positions_T, cache)
        return self.out(y_BxTxHxK.reshape(B, T, D)), cache


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)), without biases."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        hidden, dtype, init = mlp_hidden(cfg), compute_dtype(cfg), initializer(cfg)
        self.gate = nnx.Linear(cfg.width, hidden, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.up = nnx.Linear(cfg.width, hidden, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(
            hidden, cfg.width, use_bias=False, kernel_init=residual_initializer(cfg), dtype=dtype, rngs=rngs
        )

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x_BxTxD)) * self.up(x_BxTxD))


def _mlp_hidden(cfg: ModelConfig) -> int:
    """The default when model.mlp_hidden is not given: two thirds of mlp_ratio x width, rounded up to 64
    (SwiGLU has three matrices where GELU's MLP has two, so this keeps the count)."""
    return -(-2 * cfg.mlp_ratio * cfg.width // (3 * 64)) * 64


def _config(cfg: ModelConfig, stop_token: int | None) -> dict[str, Any]:
    """config.json of a `LlamaForCausalLM` (but "architectures"): dlc's sizes, every field its blocks fix."""
    return {
        "model_type": "llama",
        "vocab_size": vocab_size(cfg),
        "hidden_size": cfg.width,
        "intermediate_size": mlp_hidden(cfg),
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": kv_heads(cfg),
        "head_dim": head_dim(cfg),
        "max_position_embeddings": cfg.context_len,
        "rms_norm_eps": NORM_EPS,
        "rope_theta": cfg.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": stop_token,
        "eos_token_id": stop_token,
        "torch_dtype": "float32",
    }


FAMILY = Family(
    name="llama",
    attention=Attention,
    mlp=SwiGLU,
    norm=nnx.RMSNorm,
    learned_positions=False,
    mlp_hidden=_mlp_hidden,
    hf=HFLayout(
        architecture="LlamaForCausalLM",
        top={
            "embed/embedding": ("model.embed_tokens.weight", False),
            "norm_out/scale": ("model.norm.weight", False),
        },
        block_prefix="model.layers.{i}.",
        block={  # torch's Linear is [out, in]: every kernel transposed
            "norm_attn/scale": ("input_layernorm.weight", False),
            "attn/q/kernel": ("self_attn.q_proj.weight", True),
            "attn/k/kernel": ("self_attn.k_proj.weight", True),
            "attn/v/kernel": ("self_attn.v_proj.weight", True),
            "attn/out/kernel": ("self_attn.o_proj.weight", True),
            "norm_mlp/scale": ("post_attention_layernorm.weight", False),
            "mlp/gate/kernel": ("mlp.gate_proj.weight", True),
            "mlp/up/kernel": ("mlp.up_proj.weight", True),
            "mlp/down/kernel": ("mlp.down_proj.weight", True),
        },
        head=("lm_head.weight", True),
        zero_biases={},
        config=_config,
    ),
)
