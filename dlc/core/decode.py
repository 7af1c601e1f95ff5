"""Text generation from a model's parameters: a key-value cache, a compiled prefill and one-token step.

`generate` runs the transformer of `dlc.core.model` as a pure function over its nested parameter
dict (no NNX objects), so a checkpoint's parameters need no graphdef; what the parameters do not say
(the block family, the head counts, the rotary base, the context) travels as one static `Spec`. The
prompt is read once, padded to context_len so that every prompt length shares one executable
(`_prefill`); each new token then costs one call of `_step`, whose position is a traced integer, so a
whole generation compiles two functions once. Sampling (temperature, top-k) runs on the device with a
key split every step.

Decoding computes in float32 whatever model.compute_dtype says: the parameters are float32, and
reading them once per token costs the same either way. A model trained in bfloat16 is then decoded a
little more exactly than its training forward computes it, so a greedy token may differ from the
argmax of its bfloat16 logits where two tokens are nearly tied.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dlc.config.workload import ModelConfig
from dlc.core.model import Params, rotary
from dlc.core.shapes import kv_heads, vocab_size
from dlc.errors import UserError

# Keys and values of every layer, each [context_len, G, K] (G: key/value heads): position p holds
# token p's, once it was read.
KVCache = tuple[tuple[jax.Array, jax.Array], ...]

_NORM_EPSILON = 1e-6  # nnx.LayerNorm's and nnx.RMSNorm's default, which the model's norms use


@dataclass(frozen=True)
class Spec:
    """What `forward` needs beyond the parameters; hashable, so a jitted function takes it as static."""

    arch: str  # "gpt" or "llama" (model.arch)
    num_heads: int
    num_kv_heads: int  # num_heads for gpt
    context_len: int
    rope_theta: float

    @classmethod
    def of(cls, cfg: ModelConfig) -> Spec:
        llama = cfg.arch == "llama"
        # Fields a gpt model does not use are fixed, so they never cause a second compile.
        return cls(cfg.arch, cfg.num_heads, kv_heads(cfg), cfg.context_len, cfg.rope_theta if llama else 0.0)


def init_cache(params: Params, spec: Spec) -> KVCache:
    """An empty cache for the model these parameters belong to."""
    head_size = params["embed"]["embedding"].shape[1] // spec.num_heads
    empty_CxGxK = jnp.zeros((spec.context_len, spec.num_kv_heads, head_size), jnp.float32)
    return tuple((empty_CxGxK, empty_CxGxK) for _ in params["blocks"])


def _layer_norm(x_TxD: jax.Array, norm: Params) -> jax.Array:
    # As nnx.LayerNorm computes it: the variance as E[x^2] - E[x]^2, clipped at zero.
    mean_Tx1 = x_TxD.mean(-1, keepdims=True)
    var_Tx1 = jnp.maximum((x_TxD * x_TxD).mean(-1, keepdims=True) - mean_Tx1 * mean_Tx1, 0.0)
    return (x_TxD - mean_Tx1) * (jax.lax.rsqrt(var_Tx1 + _NORM_EPSILON) * norm["scale"]) + norm["bias"]


def _rms_norm(x_TxD: jax.Array, norm: Params) -> jax.Array:
    # As nnx.RMSNorm computes it: no mean subtracted, no bias.
    return x_TxD * (jax.lax.rsqrt((x_TxD * x_TxD).mean(-1, keepdims=True) + _NORM_EPSILON) * norm["scale"])


def _attend(q_TxHxK: jax.Array, keys_CxGxK: jax.Array, values_CxGxK: jax.Array, visible_TxC: jax.Array) -> jax.Array:
    """Causal attention against the cache, each key/value head g serving query heads g*R..g*R+R-1
    (R = H/G), the grouping of jax.nn.dot_product_attention and of Hugging Face's Llama."""
    T, H, K = q_TxHxK.shape
    G = keys_CxGxK.shape[1]
    q_TxGxRxK = q_TxHxK.reshape(T, G, H // G, K)
    scores_GxRxTxC = jnp.einsum("tgrk,cgk->grtc", q_TxGxRxK, keys_CxGxK) / np.sqrt(K).astype(np.float32)
    # Position 0 is visible to every query, so no row is all -inf.
    scores_GxRxTxC = jnp.where(visible_TxC, scores_GxRxTxC, -jnp.inf)
    y_TxGxRxK = jnp.einsum("grtc,cgk->tgrk", jax.nn.softmax(scores_GxRxTxC, axis=-1), values_CxGxK)
    return y_TxGxRxK.reshape(T, H * K)


def forward(
    params: Params, tokens_T: jax.Array, start: jax.Array | int, cache: KVCache, spec: Spec
) -> tuple[jax.Array, KVCache]:
    """Logits [T, V] for tokens_T read at positions start..start+T-1, and the cache with their keys and
    values written there. Each position attends to the cache up to itself, so cache entries past it
    (stale, or the padding of a prefill) are never read."""
    T = tokens_T.shape[0]
    llama = spec.arch == "llama"
    norm = _rms_norm if llama else _layer_norm
    H, G = spec.num_heads, spec.num_kv_heads
    K = params["embed"]["embedding"].shape[1] // H
    positions_T = start + jnp.arange(T)
    visible_TxC = jnp.arange(spec.context_len)[None, :] <= positions_T[:, None]
    x_TxD = params["embed"]["embedding"][tokens_T]
    if not llama:
        x_TxD = x_TxD + params["pos_embed"]["embedding"][positions_T]
    new_cache = []
    for i, (keys_CxGxK, values_CxGxK) in enumerate(cache):
        block = params["blocks"][i]
        attn, mlp = block["attn"], block["mlp"]
        h_TxD = norm(x_TxD, block["norm_attn"])
        if llama:
            q_TxHxK = rotary((h_TxD @ attn["q"]["kernel"]).reshape(T, H, K), positions_T, spec.rope_theta)
            k_TxGxK = rotary((h_TxD @ attn["k"]["kernel"]).reshape(T, G, K), positions_T, spec.rope_theta)
            v_TxGxK = (h_TxD @ attn["v"]["kernel"]).reshape(T, G, K)
        else:
            qkv_Tx3xHxK = (h_TxD @ attn["qkv"]["kernel"]).reshape(T, 3, H, K)
            q_TxHxK, k_TxGxK, v_TxGxK = qkv_Tx3xHxK[:, 0], qkv_Tx3xHxK[:, 1], qkv_Tx3xHxK[:, 2]
        keys_CxGxK = jax.lax.dynamic_update_slice(keys_CxGxK, k_TxGxK, (start, 0, 0))
        values_CxGxK = jax.lax.dynamic_update_slice(values_CxGxK, v_TxGxK, (start, 0, 0))
        new_cache.append((keys_CxGxK, values_CxGxK))
        x_TxD = x_TxD + _attend(q_TxHxK, keys_CxGxK, values_CxGxK, visible_TxC) @ attn["out"]["kernel"]
        h_TxD = norm(x_TxD, block["norm_mlp"])
        if llama:  # SwiGLU, without biases
            hidden_TxF = jax.nn.silu(h_TxD @ mlp["gate"]["kernel"]) * (h_TxD @ mlp["up"]["kernel"])
            x_TxD = x_TxD + hidden_TxF @ mlp["down"]["kernel"]
        else:
            hidden_TxF = jax.nn.gelu(h_TxD @ mlp["up"]["kernel"] + mlp["up"]["bias"])
            x_TxD = x_TxD + hidden_TxF @ mlp["down"]["kernel"] + mlp["down"]["bias"]
    x_TxD = norm(x_TxD, params["norm_out"])
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


@partial(jax.jit, static_argnames=("spec", "greedy", "top_k"))
def _prefill(
    params: Params,
    tokens_C: jax.Array,
    length: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    spec: Spec,
    greedy: bool,
    top_k: int | None,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Read the prompt (tokens_C[:length], zero-padded to context_len); sample the token after it."""
    logits_CxV, cache = forward(params, tokens_C, 0, init_cache(params, spec), spec)
    key, sample_key = jax.random.split(key)
    return _sample(logits_CxV[length - 1], sample_key, temperature, greedy, top_k), cache, key


@partial(jax.jit, static_argnames=("spec", "greedy", "top_k"), donate_argnames=("cache",))
def _step(
    params: Params,
    cache: KVCache,
    token: jax.Array,
    position: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    spec: Spec,
    greedy: bool,
    top_k: int | None,
) -> tuple[jax.Array, KVCache, jax.Array]:
    """Read `token` at `position`; sample the token after it."""
    logits_1xV, cache = forward(params, token[None], position, cache, spec)
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
    if cfg.arch == "gpt" and params["pos_embed"]["embedding"].shape[0] != context_len:
        raise UserError(
            f"the parameters hold {params['pos_embed']['embedding'].shape[0]} positions but "
            f"model.context_len={context_len}: use the recipe the parameters were trained with"
        )
    greedy = temperature == 0
    static = {
        "spec": Spec.of(cfg),
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
    tokens_C = np.zeros(static["spec"].context_len, np.int32)
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
