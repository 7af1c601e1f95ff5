"""GPT-2's blocks (model.arch=gpt): learned positions, LayerNorm, a GELU MLP, one fused query/key/value projection.

Its Hugging Face layout is `GPT2LMHeadModel`'s:

    dlc                              GPT-2 (transformers)                    how
    embed/embedding  [V, D]          transformer.wte.weight                  as is
    pos_embed/embedding  [C, D]      transformer.wpe.weight                  as is
    blocks/i/norm_attn/scale, bias   transformer.h.i.ln_1.weight, bias       as is
    blocks/i/attn/qkv/kernel [D, 3D] transformer.h.i.attn.c_attn.weight      as is (Conv1D is [in, out]);
                                     transformer.h.i.attn.c_attn.bias        zeros: dlc's has no bias
    blocks/i/attn/out/kernel [D, D]  transformer.h.i.attn.c_proj.weight      as is; its bias zeros
    blocks/i/norm_mlp/scale, bias    transformer.h.i.ln_2.weight, bias       as is
    blocks/i/mlp/up/kernel, bias     transformer.h.i.mlp.c_fc.weight, bias   as is
    blocks/i/mlp/down/kernel, bias   transformer.h.i.mlp.c_proj.weight, bias as is
    norm_out/scale, bias             transformer.ln_f.weight, bias           as is
    head/kernel  [D, V]              lm_head.weight [V, D]                   transposed (untied models only)

Both split the fused projection into query, key and value, each into heads, in that order, and
scale attention by 1/sqrt(head size). config.json says what differs from GPT-2's defaults:
LayerNorm epsilon 1e-6 (Flax's), `gelu_new` (the tanh GELU), no dropout, and the sizes.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx

from dlc.config.workload import ModelConfig
from dlc.core.arch import mlp_hidden
from dlc.core.arch.base import KV, Family, HFLayout, attend, compute_dtype, initializer, residual_initializer
from dlc.core.shapes import NORM_EPS, head_dim, vocab_size


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.num_heads, self.head_dim = cfg.num_heads, head_dim(cfg)
        dtype = compute_dtype(cfg)
        self.qkv = nnx.Linear(
            cfg.width, 3 * cfg.width, use_bias=False, kernel_init=initializer(cfg), dtype=dtype, rngs=rngs
        )
        self.out = nnx.Linear(
            cfg.width, cfg.width, use_bias=False, kernel_init=residual_initializer(cfg), dtype=dtype, rngs=rngs
        )

    def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array, cache: KV | None) -> tuple[jax.Array, KV | None]:
        """Attention over x (positions_T only place the cache's entries: GPT's positions are in its embedding)."""
        B, T, D = x_BxTxD.shape
        qkv = self.qkv(x_BxTxD).reshape(B, T, 3, self.num_heads, self.head_dim)
        y_BxTxHxK, cache = attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], positions_T, cache)
        return self.out(y_BxTxHxK.reshape(B, T, D)), cache


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        hidden, dtype = mlp_hidden(cfg), compute_dtype(cfg)
        self.up = nnx.Linear(cfg.width, hidden, kernel_init=initializer(cfg), dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(hidden, cfg.width, kernel_init=residual_initializer(cfg), dtype=dtype, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(x_BxTxD)))


def _mlp_hidden(cfg: ModelConfig) -> int:
    """mlp_ratio x width: the default when model.mlp_hidden is not given."""
    return cfg.mlp_ratio * cfg.width


def _config(cfg: ModelConfig, stop_token: int | None) -> dict[str, Any]:
    """config.json of a `GPT2LMHeadModel` (but "architectures"): dlc's sizes, what differs from GPT-2's defaults."""
    return {
        "model_type": "gpt2",
        "vocab_size": vocab_size(cfg),
        "n_positions": cfg.context_len,
        "n_embd": cfg.width,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": mlp_hidden(cfg),
        "activation_function": "gelu_new",  # jax.nn.gelu's default, the tanh approximation
        "layer_norm_epsilon": NORM_EPS,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        # The end-of-document token, where the model learned one (a byte corpus has none).
        "bos_token_id": stop_token,
        "eos_token_id": stop_token,
        "torch_dtype": "float32",
    }


FAMILY = Family(
    name="gpt",
    attention=Attention,
    mlp=MLP,
    norm=nnx.LayerNorm,
    learned_positions=True,
    mlp_hidden=_mlp_hidden,
    hf=HFLayout(
        architecture="GPT2LMHeadModel",
        top={
            "embed/embedding": ("transformer.wte.weight", False),
            "pos_embed/embedding": ("transformer.wpe.weight", False),
            "norm_out/scale": ("transformer.ln_f.weight", False),
            "norm_out/bias": ("transformer.ln_f.bias", False),
        },
        block_prefix="transformer.h.{i}.",
        block={
            "norm_attn/scale": ("ln_1.weight", False),
            "norm_attn/bias": ("ln_1.bias", False),
            "attn/qkv/kernel": ("attn.c_attn.weight", False),  # GPT-2's Conv1D is [in, out], as dlc's kernels
            "attn/out/kernel": ("attn.c_proj.weight", False),
            "norm_mlp/scale": ("ln_2.weight", False),
            "norm_mlp/bias": ("ln_2.bias", False),
            "mlp/up/kernel": ("mlp.c_fc.weight", False),
            "mlp/up/bias": ("mlp.c_fc.bias", False),
            "mlp/down/kernel": ("mlp.c_proj.weight", False),
            "mlp/down/bias": ("mlp.c_proj.bias", False),
        },
        head=("lm_head.weight", True),
        zero_biases={"attn.c_attn.bias": "attn/qkv/kernel", "attn.c_proj.bias": "attn/out/kernel"},
        config=_config,
    ),
)
