"""Text generation from a model's parameters: a key-value cache, a compiled prefill and one-token step.

`generate` runs the transformer of `dlc.core.model` as a pure function over its nested parameter
dict (no NNX objects), so a checkpoint's parameters need no graphdef. The prompt is read once, padded
to context_len so that every prompt length shares one executable (`_prefill`); each new token then
costs one call of `_step`, whose position is a traced integer, so a whole generation compiles two
functions once. Sampling (temperature, top-k) runs on the device with a key split every step.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dlc.config.workload import ModelConfig
from dlc.core.model import Params
from dlc.core.shapes import vocab_size
from dlc.errors import UserError

# Keys and values of every layer, each [context_len, H, K]: position p holds token p's, once it was read.
KVCache = tuple[tuple[jax.Array, jax.Array], ...]

_LAYER_NORM_EPSILON = 1e-6  # nnx.LayerNorm's default, which the model's norms use


def init_cache(params: Params, num_heads: int) -> KVCache:
    """An empty cache for the model these parameters belong to."""
    context_len, D = params["pos_embed"]["embedding"].shape
    empty_CxHxK = jnp.zeros((context_len, num_heads, D // num_heads), jnp.float32)
    return tuple((empty_CxHxK, empty_CxHxK) for _ in params["blocks"])


def _layer_norm(x_TxD: jax.Array, norm: Params) -> jax.Array:
    # As nnx.LayerNorm computes it: the variance as E[x^2] - E[x]^2, clipped at zero.
    mean_Tx1 = x_TxD.mean(-1, keepdims=True)
    var_Tx1 = jnp.maximum((x_TxD * x_TxD).mean(-1, keepdims=True) - mean_Tx1 * mean_Tx1, 0.0)
    return (x_TxD - mean_Tx1) * (jax.lax.rsqrt(var_Tx1 + _LAYER_NORM_EPSILON) * norm["scale"]) + norm["bias"]


def forward(
    params: Params, tokens_T: jax.Array, start: jax.Array | int, cache: KVCache, num_heads: int
) -> tuple[jax.Array, KVCache]:
    """Logits [T, V] for tokens_T read at positions start..start+T-1, and the cache with their keys and
    values written there. Each position attends to the cache up to itself, so cache entries past it
    (stale, or the padding of a prefill) are never read."""
    T = tokens_T.shape[0]
    context_len, D = params["pos_embed"]["embedding"].shape
    K = D // num_heads
    positions_T = start + jnp.arange(T)
    visible_TxC = jnp.arange(context_len)[None, :] <= positions_T[:, None]
    x_TxD = params["embed"]["embedding"][tokens_T] + params["pos_embed"]["embedding"][positions_T]
    new_cache = []
    for i, (keys_CxHxK, values_CxHxK) in enumerate(cache):
        block = params["blocks"][i]
        h_TxD = _layer_norm(x_TxD, block["norm_attn"])
        qkv_Tx3xHxK = (h_TxD @ block["attn"]["qkv"]["kernel"]).reshape(T, 3, num_heads, K)
        q_TxHxK, k_TxHxK, v_TxHxK = qkv_Tx3xHxK[:, 0], qkv_Tx3xHxK[:, 1], qkv_Tx3xHxK[:, 2]
        keys_CxHxK = jax.lax.dynamic_update_slice(keys_CxHxK, k_TxHxK, (start, 0, 0))
        values_CxHxK = jax.lax.dynamic_update_slice(values_CxHxK, v_TxHxK, (start, 0, 0))
        new_cache.append((keys_CxHxK, values_CxHxK))
        scores_HxTxC = jnp.einsum("thk,chk->htc", q_TxHxK, keys_CxHxK) / np.sqrt(K).astype(np.float32)
        # Position 0 is visible to every query, so no row is all -inf.
        scores_HxTxC = jnp.where(visible_TxC[None], scores_HxTxC, -jnp.inf)
        y_TxHxK = jnp.einsum("htc,chk->thk", jax.nn.softmax(scores_HxTxC, axis=-1), values_CxHxK)
        x_TxD = x_TxD + y_TxHxK.reshape(T, D) @ block["attn"]["out"]["kernel"]
        h_TxD = _layer_norm(x_TxD, block["norm_mlp"])
        mlp = block["mlp"]
        hidden_TxF = jax.nn.gelu(h_TxD @ mlp["up"]["kernel"] + mlp["up"]["bias"])
        x_TxD = x_TxD + hidden_TxF @ mlp["down"]["kernel"] + mlp["down"]["bias"]
    x_TxD = _layer_norm(x_TxD, params["norm_out"])
    if "head" in params:
        return x_TxD @ params["head"]["kernel"], tuple(new_cache)
    return x_TxD @ params["embed"]["embedding"].T, tuple(new_cache)  # tied: embed.attend


def _sample(logits_V: jax.Array, key: jax.Array, temperature: jax.Array, greedy: bool, top_k: int | None) -> jax.Array:
    if greedy:
        return jnp.argmax(logits_V).astype(jnp.int32)
    logits_V = logits_V / temperature
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits_V, top_k)[0][-1]
        logits_V = jnp.where(logits_V >= kth_largest, logits_V, -jnp.inf)
    return jax.random.categorical(key, logits_V).astype(jnp.int32)


@partial(jax.jit, static_argnames=("num_heads", "greedy", "top_k"))
def _prefill(
    params: Params,
    tokens_C: jax.Array,
    length: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    num_heads: int,
    greedy: bool,
    top_k: int | None,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Read the prompt (tokens_C[:length], zero-padded to context_len); sample the token after it."""
    logits_CxV, cache = forward(params, tokens_C, 0, init_cache(params, num_heads), num_heads)
    key, sample_key = jax.random.split(key)
    return _sample(logits_CxV[length - 1], sample_key, temperature, greedy, top_k), cache, key


@partial(jax.jit, static_argnames=("num_heads", "greedy", "top_k"), donate_argnames=("cache",))
def _step(
    params: Params,
    cache: KVCache,
    token: jax.Array,
    position: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    num_heads: int,
    greedy: bool,
    top_k: int | None,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Read `token` at `position`; sample the token after it."""
    logits_1xV, cache = forward(params, token[None], position, cache, num_heads)
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
    past cfg.context_len tokens in all (prompt included): the model has learned positions up to
    context_len only. temperature 0 is greedy (argmax); top_k keeps the k most likely tokens before
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
    if params["pos_embed"]["embedding"].shape[0] != context_len:
        raise UserError(
            f"the parameters hold {params['pos_embed']['embedding'].shape[0]} positions but "
            f"model.context_len={context_len}: use the recipe the parameters were trained with"
        )
    greedy = temperature == 0
    static = {
        "num_heads": cfg.num_heads,
        "greedy": greedy,
        # Ignored when greedy, and a no-op at or above the vocabulary: either way one executable.
        "top_k": None if greedy or top_k is None or top_k >= vocab else top_k,
    }
    budget = min(max_new_tokens, context_len - len(prompt))
    # Once to the device: host arrays (a checkpoint's) would otherwise be copied there every step.
    params = jax.device_put(params)
    return _tokens(params, prompt, budget, jnp.float32(temperature), seed, stop_token, static)


def _tokens(
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
    context_len = params["pos_embed"]["embedding"].shape[0]
    tokens_C = np.zeros(context_len, np.int32)
    tokens_C[: len(prompt)] = prompt
    key = jax.random.key(seed)
    token, cache, key = _prefill(params, tokens_C, np.int32(len(prompt)), key, temperature, **static)
    last = len(prompt) + budget - 1  # the position of the last token this generation may yield
    for position in range(len(prompt), last + 1):
        new = int(token)
        yield new
        if new == stop_token or position == last:
            return
        token, cache, key = _step(params, cache, token, np.int32(position), key, temperature, **static)
