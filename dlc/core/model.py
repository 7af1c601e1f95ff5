"""A decoder-only transformer over bytes or a prepared dataset's tokens, in Flax NNX.

Pre-norm blocks of the layers of the family `model.arch` names (`dlc.core.arch`: GPT-2's or Llama's).
Parameters are float32 whatever model.compute_dtype says; with bfloat16, matmuls and activations run
in it, but the output layer runs in float32, so the logits and the loss keep their precision. The
same forward pass trains and decodes (`Transformer.forward`, given key-value caches).

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
from dlc.core.arch import family
from dlc.core.arch.base import KV, compute_dtype, initializer
from dlc.core.shapes import vocab_size

Params = dict[str, Any]


class Block(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)), of the layers model.arch's family makes."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        arch, dtype = family(cfg.arch), compute_dtype(cfg)
        self.norm_attn = arch.norm(cfg.width, dtype=dtype, rngs=rngs)
        self.attn = arch.attention(cfg, rngs)
        self.norm_mlp = arch.norm(cfg.width, dtype=dtype, rngs=rngs)
        self.mlp = arch.mlp(cfg, rngs)

    def __call__(self, x_BxTxD: jax.Array, positions_T: jax.Array, cache: KV | None) -> tuple[jax.Array, KV | None]:
        y_BxTxD, cache = self.attn(self.norm_attn(x_BxTxD), positions_T, cache)
        x_BxTxD = x_BxTxD + y_BxTxD
        return x_BxTxD + self.mlp(self.norm_mlp(x_BxTxD)), cache


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
        return nnx.merge(graphdef, state)(x_BxTxD, jnp.arange(x_BxTxD.shape[1]), None)[0]

    def backward(saved: tuple[Any, jax.Array], g_BxTxD: jax.Array) -> tuple[Any, jax.Array]:
        def recompute(operands: tuple[Any, jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
            state, x_BxTxD, g_BxTxD = operands
            return jax.vjp(forward, state, x_BxTxD)[1](g_BxTxD)

        arrived = jnp.isfinite(g_BxTxD.ravel()[0])
        return jax.lax.cond(arrived, recompute, recompute, (*saved, g_BxTxD))

    run = jax.custom_vjp(forward)
    run.defvjp(lambda state, x_BxTxD: (forward(state, x_BxTxD), (state, x_BxTxD)), backward)
    return run(state, x_BxTxD)


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        arch, init, dtype = family(cfg.arch), initializer(cfg), compute_dtype(cfg)
        self.embed = nnx.Embed(vocab_size(cfg), cfg.width, embedding_init=init, dtype=dtype, rngs=rngs)
        self.pos_embed = (
            nnx.Embed(cfg.context_len, cfg.width, embedding_init=init, dtype=dtype, rngs=rngs)
            if arch.learned_positions
            else None
        )
        self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
        self.remat = cfg.remat == "block"
        self.norm_out = arch.norm(cfg.width, dtype=dtype, rngs=rngs)
        self.head = (
            None
            if cfg.tie_embeddings
            else nnx.Linear(cfg.width, vocab_size(cfg), use_bias=False, kernel_init=init, dtype=dtype, rngs=rngs)
        )

    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        """Logits for the next token at every position: [B, T] int -> [B, T, V] float32 (V: `vocab_size`)."""
        return self.forward(tokens_BxT, jnp.arange(tokens_BxT.shape[1]), None)[0]

    def forward(
        self, tokens_BxT: jax.Array, positions_T: jax.Array, caches: tuple[KV, ...] | None
    ) -> tuple[jax.Array, tuple[KV, ...] | None]:
        """Logits of tokens read at positions_T, and with `caches` (one per block) those caches with the
        tokens' keys and values written: what decoding calls, a token or a prompt at a time."""
        x_BxTxD = self.embed(tokens_BxT)
        if self.pos_embed is not None:
            x_BxTxD = x_BxTxD + self.pos_embed(positions_T)[None]
        written: list[KV] = []
        for i, block in enumerate(self.blocks):
            if caches is None and self.remat:
                x_BxTxD = _remat_block(block, x_BxTxD)
                continue
            x_BxTxD, cache = block(x_BxTxD, positions_T, None if caches is None else caches[i])
            if cache is not None:
                written.append(cache)
        # The output layer in float32 whatever the compute dtype: with a large vocabulary, bfloat16 logits
        # (about 3 significant digits) would add noise to the loss.
        x_BxTxD = self.norm_out(x_BxTxD).astype(jnp.float32)
        logits_BxTxV = x_BxTxD @ (self.embed.embedding[...].T if self.head is None else self.head.kernel[...])
        return logits_BxTxV, None if caches is None else tuple(written)


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
    flat: dict[str, Any] = {}  # arrays, or jax.ShapeDtypeStruct for an abstract tree

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
