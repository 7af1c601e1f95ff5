"""Text generation from a model's parameters: a key-value cache, a compiled prefill and one-token step.

Decoding runs the training forward pass itself (`Transformer.forward` with a cache per block) on the
checkpoint's nested parameter dict, merged into the model's graph, which depends only on the recipe
(`graph`). The prompt is read once, padded to context_len so that every prompt length shares one
executable (`_prefill`); each new token then costs one call of `_step`, whose position is a traced
integer, so a whole generation compiles two functions once. Sampling (temperature, top-k) runs on
the device with a key split every step.

Decoding computes in float32 whatever model.compute_dtype says: the parameters are float32, and
reading them once per token costs the same either way. A model trained in bfloat16 is then decoded a
little more exactly than its training forward computes it, so a greedy token may differ from the
argmax of its bfloat16 logits where two tokens are nearly tied.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dlc.config.workload import ModelConfig
from dlc.core.abstract import abstract_params
from dlc.core.arch import family
from dlc.core.arch.base import KV
from dlc.core.model import Params
from dlc.core.shapes import head_dim, kv_heads, vocab_size
from dlc.errors import UserError

# Keys and values of every block, each [1, context_len, G, K] (G: key/value heads).
KVCache = tuple[KV, ...]


def graph(cfg: ModelConfig) -> nnx.GraphDef:
    """The graph decoding merges parameters into: the model's in float32, without recomputation."""
    return abstract_params(cfg.model_copy(update={"compute_dtype": "float32", "remat": "none"}))[0]


def init_cache(cfg: ModelConfig) -> KVCache:
    """An empty cache for a model of this recipe, every array its own buffer (the prefill writes into them)."""
    shape_1xCxGxK = (1, cfg.context_len, kv_heads(cfg), head_dim(cfg))
    return tuple(
        (jnp.zeros(shape_1xCxGxK, jnp.float32), jnp.zeros(shape_1xCxGxK, jnp.float32)) for _ in range(cfg.num_layers)
    )


def forward(
    graphdef: nnx.GraphDef, params: Params, tokens_T: jax.Array, start: jax.Array | int, cache: KVCache
) -> tuple[jax.Array, KVCache]:
    """Logits [T, V] for tokens_T read at positions start..start+T-1, and the cache with their keys and
    values written there. Each position attends to the cache up to itself, so cache entries past it
    (stale, or the padding of a prefill) are never read."""
    positions_T = start + jnp.arange(tokens_T.shape[0])
    logits_1xTxV, written = nnx.merge(graphdef, params).forward(tokens_T[None], positions_T, cache)
    assert written is not None
    return logits_1xTxV[0], written


def _sample(logits_V: jax.Array, key: jax.Array, temperature: jax.Array, greedy: bool, top_k: int | None) -> jax.Array:
    if greedy:
        return jnp.argmax(logits_V).astype(jnp.int32)
    logits_V = logits_V / temperature
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits_V, top_k)[0][-1]
        logits_V = jnp.where(logits_V >= kth_largest, logits_V, -jnp.inf)
    return jax.random.categorical(key, logits_V).astype(jnp.int32)


@partial(jax.jit, static_argnames=("graphdef", "greedy", "top_k"), donate_argnames=("cache",))
def _prefill(
    params: Params,
    cache: KVCache,
    tokens_C: jax.Array,
    length: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    greedy: bool,
    top_k: int | None,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Read the prompt (tokens_C[:length], zero-padded to context_len) into the empty cache; sample the
    token after it."""
    logits_CxV, cache = forward(graphdef, params, tokens_C, 0, cache)
    key, sample_key = jax.random.split(key)
    return _sample(logits_CxV[length - 1], sample_key, temperature, greedy, top_k), cache, key


@partial(jax.jit, static_argnames=("graphdef", "greedy", "top_k"), donate_argnames=("cache",))
def _step(
    params: Params,
    cache: KVCache,
    token: jax.Array,
    position: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    greedy: bool,
    top_k: int | None,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Read `token` at `position`; sample the token after it."""
    logits_1xV, cache = forward(graphdef, params, token[None], position, cache)
    key, sample_key = jax.random.split(key)
    return _sample(logits_1xV[0], sample_key, temperature, greedy, top_k), cache, key


def generate(
    cfg: ModelConfig,
    params: Params,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    stop_token: int | None = None,
) -> Iterator[int]:
    """Yield new token ids one at a time (so a caller can stream them), at most max_new_tokens, and never
    past cfg.context_len tokens in all (prompt included): the model was trained on that many positions
    at most. temperature 0 is greedy (argmax); top_k keeps the k most likely tokens before
    sampling; stop_token ends the generation after it is yielded. The same seed gives the same tokens.

    Checks its arguments when called, before the first token is asked for.
    """
    vocab, context_len = vocab_size(cfg), cfg.context_len
    if not 1 <= len(prompt) <= context_len - 1:
        raise UserError(
            f"the prompt has {len(prompt)} tokens but model.context_len={context_len} allows 1 to "
            f"{context_len - 1} (one position is left for a new token): shorten the prompt"
        )
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise UserError(f"prompt token id {bad[0]} is outside the model's vocabulary 0..{vocab - 1}")
    if max_new_tokens < 0:
        raise UserError(f"max_new_tokens={max_new_tokens} is negative: ask for 0 or more tokens")
    if not (np.isfinite(temperature) and temperature >= 0):
        raise UserError(f"temperature={temperature} must be 0 (greedy) or positive")
    if top_k is not None and top_k < 1:
        raise UserError(f"top_k={top_k} must be at least 1, or unset to sample from every token")
    if family(cfg.arch).learned_positions and params["pos_embed"]["embedding"].shape[0] != context_len:
        raise UserError(
            f"the parameters hold {params['pos_embed']['embedding'].shape[0]} positions but "
            f"model.context_len={context_len}: use the recipe the parameters were trained with"
        )
    greedy = temperature == 0
    static = {
        "graphdef": graph(cfg),
        "greedy": greedy,
        # Ignored when greedy, and a no-op at or above the vocabulary: either way one executable.
        "top_k": None if greedy or top_k is None or top_k >= vocab else top_k,
    }
    budget = min(max_new_tokens, context_len - len(prompt))
    # Once to the device: host arrays (a checkpoint's) would otherwise be copied there every step.
    params = jax.device_put(params)
    return _tokens(cfg, params, prompt, budget, jnp.float32(temperature), seed, stop_token, static)


def _tokens(
    cfg: ModelConfig,
    params: Params,
    prompt: list[int],
    budget: int,
    temperature: jax.Array,
    seed: int,
    stop_token: int | None,
    static: dict[str, Any],
) -> Iterator[int]:
    if budget <= 0:
        return
    tokens_C = np.zeros(cfg.context_len, np.int32)
    tokens_C[: len(prompt)] = prompt
    key = jax.random.key(seed)
    token, cache, key = _prefill(params, init_cache(cfg), tokens_C, np.int32(len(prompt)), key, temperature, **static)
    last = len(prompt) + budget - 1  # the position of the last token this generation may yield
    for position in range(len(prompt), last + 1):
        new = int(token)
        yield new
        if new == stop_token or position == last:
            return
        token, cache, key = _step(params, cache, token, np.int32(position), key, temperature, **static)
