"""A decoder-only transformer over bytes or a prepared dataset's tokens, in Flax NNX.

Two families of blocks (`model.arch`): GPT-2's (learned positions, LayerNorm, a GELU MLP, one fused
query/key/value projection) and Llama's (rotary positions, RMSNorm, a SwiGLU MLP, no biases, and
grouped-query attention where model.num_kv_heads < num_heads). Parameters are float32 whatever
model.compute_dtype says; with bfloat16, matmuls and activations run in it, but the output layer
runs in float32, so the logits and the loss keep their precision.

The model is built once with `build_model`; training code then works on its parameters as a
plain nested dict of arrays (`split_params`), so the jitted step is a pure function and the
syncer can address tensors by their path name (`flatten_params`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlc.config.workload import ModelConfig
from dlc.core.shapes import head_dim, kv_heads, mlp_hidden, vocab_size

Params = dict[str, Any]


def compute_dtype(cfg: ModelConfig) -> Any:
    return jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32


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


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.width // cfg.num_heads
        init, dtype = nnx.initializers.normal(stddev=cfg.init_std), compute_dtype(cfg)
        self.qkv = nnx.Linear(cfg.width, 3 * cfg.width, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        # Residual projections start smaller so the residual stream's variance stays bounded
        # with depth (GPT-2's scaled initialisation).
        out_init = _residual_init(cfg)
        self.out = nnx.Linear(cfg.width, cfg.width, use_bias=False, kernel_init=out_init, dtype=dtype, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array) -> jax.Array:
        """Attention over x (positions_T unused: GPT's positions are in its embedding)."""
        B, T, D = x_BxTxD.shape
        qkv = self.qkv(x_BxTxD).reshape(B, T, 3, self.num_heads, self.head_dim)
        q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        y_BxTxHxK = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, is_causal=True)
        return self.out(y_BxTxHxK.reshape(B, T, D))


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        hidden, dtype = mlp_hidden(cfg), compute_dtype(cfg)
        init = nnx.initializers.normal(stddev=cfg.init_std)
        self.up = nnx.Linear(cfg.width, hidden, kernel_init=init, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(hidden, cfg.width, kernel_init=_residual_init(cfg), dtype=dtype, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        return self.down(jax.nn.gelu(self.up(x_BxTxD)))


class LlamaAttention(nnx.Module):
    """Separate query, key and value projections, rotary positions on queries and keys, and
    num_kv_heads key/value heads each shared by num_heads / num_kv_heads query heads."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, kv_heads(cfg), head_dim(cfg)
        self.theta = cfg.rope_theta
        init, dtype, D = nnx.initializers.normal(stddev=cfg.init_std), compute_dtype(cfg), cfg.width
        kv = self.num_kv_heads * self.head_dim
        self.q = nnx.Linear(D, D, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.k = nnx.Linear(D, kv, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.v = nnx.Linear(D, kv, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(D, D, use_bias=False, kernel_init=_residual_init(cfg), dtype=dtype, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array) -> jax.Array:
        B, T, D = x_BxTxD.shape
        q_BxTxHxK = rotary(self.q(x_BxTxD).reshape(B, T, self.num_heads, self.head_dim), positions_T, self.theta)
        k_BxTxGxK = rotary(self.k(x_BxTxD).reshape(B, T, self.num_kv_heads, self.head_dim), positions_T, self.theta)
        v_BxTxGxK = self.v(x_BxTxD).reshape(B, T, self.num_kv_heads, self.head_dim)
        y_BxTxHxK = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxGxK, v_BxTxGxK, is_causal=True)
        return self.out(y_BxTxHxK.reshape(B, T, D))


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x)), without biases."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        hidden, dtype = mlp_hidden(cfg), compute_dtype(cfg)
        init = nnx.initializers.normal(stddev=cfg.init_std)
        self.gate = nnx.Linear(cfg.width, hidden, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.up = nnx.Linear(cfg.width, hidden, use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(
            hidden, cfg.width, use_bias=False, kernel_init=_residual_init(cfg), dtype=dtype, rngs=rngs
        )

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x_BxTxD)) * self.up(x_BxTxD))


class Block(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)), of GPT-2's layers or Llama's."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        dtype, llama = compute_dtype(cfg), cfg.arch == "llama"
        norm = nnx.RMSNorm if llama else nnx.LayerNorm
        self.norm_attn = norm(cfg.width, dtype=dtype, rngs=rngs)
        self.attn = LlamaAttention(cfg, rngs) if llama else CausalSelfAttention(cfg, rngs)
        self.norm_mlp = norm(cfg.width, dtype=dtype, rngs=rngs)
        self.mlp = SwiGLU(cfg, rngs) if llama else MLP(cfg, rngs)

    def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array) -> jax.Array:
        x_BxTxD = x_BxTxD + self.attn(self.norm_attn(x_BxTxD), positions_T)
        return x_BxTxD + self.mlp(self.norm_mlp(x_BxTxD))


def _remat_block(block: Block, x_BxTxD: jax.Array) -> jax.Array:
    """One block's forward whose activations the backward pass recomputes from its input (`model.remat=block`).

    Not `jax.checkpoint`: XLA's CPU compiler drops the optimization barriers that keep its
    recomputation apart and schedules it right after the forward pass, so every activation is
    kept anyway (measured: the same temporary bytes with and without it). The recomputation here
    runs inside a conditional on the cotangent that reaches the block, which no compiler can start
    before that cotangent exists; both branches are the same computation.
    """
    graphdef, state = nnx.split(block)

    def forward(state: Any, x_BxTxD: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x_BxTxD, jnp.arange(x_BxTxD.shape[1]))

    def backward(saved: tuple[Any, jax.Array], g_BxTxD: jax.Array) -> tuple[Any, jax.Array]:
        def recompute(operands: tuple[Any, jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
            state, x_BxTxD, g_BxTxD = operands
            return jax.vjp(forward, state, x_BxTxD)[1](g_BxTxD)

        arrived = jnp.isfinite(g_BxTxD.ravel()[0])
        return jax.lax.cond(arrived, recompute, recompute, (*saved, g_BxTxD))

    run = jax.custom_vjp(forward)
    run.defvjp(lambda state, x_BxTxD: (forward(state, x_BxTxD), (state, x_BxTxD)), backward)
    return run(state, x_BxTxD)


def _residual_init(cfg: ModelConfig) -> Any:
    return nnx.initializers.normal(stddev=cfg.init_std / (2 * cfg.num_layers) ** 0.5)


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        init, dtype, llama = nnx.initializers.normal(stddev=cfg.init_std), compute_dtype(cfg), cfg.arch == "llama"
        self.embed = nnx.Embed(vocab_size(cfg), cfg.width, embedding_init=init, dtype=dtype, rngs=rngs)
        self.pos_embed = (
            None if llama else nnx.Embed(cfg.context_len, cfg.width, embedding_init=init, dtype=dtype, rngs=rngs)
        )
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.remat = cfg.remat == "block"
        norm = nnx.RMSNorm if llama else nnx.LayerNorm
        self.norm_out = norm(cfg.width, dtype=dtype, rngs=rngs)
        self.head = (
            None
            if cfg.tie_embeddings
            else nnx.Linear(cfg.width, vocab_size(cfg), use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        )

    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        """Logits for the next token at every position: [B, T] int -> [B, T, V] float32 (V: `vocab_size`)."""
        positions_T = jnp.arange(tokens_BxT.shape[1])
        x_BxTxD = self.embed(tokens_BxT)
        if self.pos_embed is not None:
            x_BxTxD = x_BxTxD + self.pos_embed(positions_T)[None]
        for block in self.blocks:
            x_BxTxD = _remat_block(block, x_BxTxD) if self.remat else block(x_BxTxD, positions_T)
        # The output layer in float32 whatever the compute dtype: with a large vocabulary, bfloat16 logits
        # (about 3 significant digits) would add noise to the loss.
        x_BxTxD = self.norm_out(x_BxTxD).astype(jnp.float32)
        if self.head is None:
            return x_BxTxD @ self.embed.embedding[...].T
        return x_BxTxD @ self.head.kernel[...]


def build_model(cfg: ModelConfig, seed: int) -> tuple[nnx.GraphDef, Params]:
    """The model's static structure and its initial parameters as a nested dict."""
    model = Transformer(cfg, nnx.Rngs(seed))
    graphdef, state = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(state)


def apply_model(graphdef: nnx.GraphDef, params: Params, tokens_BxT: jax.Array) -> jax.Array:
    return nnx.merge(graphdef, params)(tokens_BxT)


def flatten_params(params: Params) -> dict[str, np.ndarray]:
    """Nested dict -> {"blocks/0/attn/qkv/kernel": array}, as host NumPy arrays (abstract leaves,
    `jax.ShapeDtypeStruct`, as they are)."""
    flat: dict[str, np.ndarray] = {}

    def visit(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key in sorted(node, key=str):
                visit(node[key], f"{prefix}/{key}" if prefix else str(key))
        else:
            flat[prefix] = node if isinstance(node, jax.ShapeDtypeStruct) else np.asarray(node)

    visit(params, "")
    return flat


def unflatten_params(flat: dict[str, np.ndarray], like: Params) -> Params:
    """Inverse of `flatten_params`, shaped like `like` (keys keep their original types)."""

    def rebuild(node: Any, prefix: str) -> Any:
        if isinstance(node, dict):
            return {k: rebuild(v, f"{prefix}/{k}" if prefix else str(k)) for k, v in node.items()}
        return flat[prefix]

    return rebuild(like, "")


def count_params(params: Params) -> int:
    return sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))


class ParamView:
    """Reads and replaces individual tensors of a nested parameter dict by path name."""

    def __init__(self, like: Params) -> None:
        self.paths: dict[str, tuple[Any, ...]] = {}

        def visit(node: Any, path: tuple[Any, ...]) -> None:
            if isinstance(node, dict):
                for key, child in node.items():
                    visit(child, (*path, key))
            else:
                self.paths["/".join(str(k) for k in path)] = path

        visit(like, ())

    def read(self, params: Params, names: Any) -> dict[str, np.ndarray]:
        """Host copies (never views: device buffers are donated to the next step)."""
        out = {}
        for name in names:
            node = params
            for key in self.paths[name]:
                node = node[key]
            out[name] = np.array(node, dtype=np.float32, copy=True)
        return out

    def write(self, params: Params, tensors: dict[str, np.ndarray]) -> Params:
        """A new nested dict with `tensors` replaced; other leaves are shared, not copied."""
        params = dict(params)
        for name, value in tensors.items():
            *parents, leaf = self.paths[name]
            node = params
            for key in parents:
                node[key] = dict(node[key])
                node = node[key]
            node[leaf] = jnp.asarray(value)
        return params
