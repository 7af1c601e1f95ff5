from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlc.config.workload import ModelConfig
from dlc.core import decode
from dlc.core.decode import forward, generate, graph, init_cache
from dlc.core.model import apply_model, build_model
from dlc.errors import UserError

CFG = ModelConfig(width=32, num_layers=2, num_heads=2, context_len=32, vocab_size=64)
UNTIED = CFG.model_copy(update={"tie_embeddings": False})
# Two key/value heads, each serving two query heads: a grouping in the wrong order would show.
LLAMA = ModelConfig(arch="llama", width=32, num_layers=2, num_heads=4, num_kv_heads=2, context_len=32, vocab_size=64)
LLAMA_UNTIED = LLAMA.model_copy(update={"tie_embeddings": False})
MODELS = [CFG, UNTIED, LLAMA, LLAMA_UNTIED]
IDS = ["gpt-tied", "gpt-untied", "llama-tied", "llama-untied"]


@pytest.fixture(scope="module", params=MODELS, ids=IDS)
def model(request):
    cfg = request.param
    # init_std 0.5: logits spread enough that argmax never hangs on a near-tie between
    # two float orders of summation.
    cfg = cfg.model_copy(update={"init_std": 0.5})
    graphdef, params = build_model(cfg, seed=0)
    return cfg, graphdef, params


def reference_greedy(graphdef, params, prompt, n, context_len):
    """Re-run the whole sequence without a cache for every new token. It is zero-padded to context_len
    so that one executable serves every length: the model is causal, so padding after the last token
    leaves its logits alone."""
    model = jax.jit(partial(apply_model, graphdef))
    tokens = list(prompt)
    for _ in range(n):
        logits = model(params, jnp.asarray([tokens + [0] * (context_len - len(tokens))], jnp.int32))
        tokens.append(int(jnp.argmax(logits[0, len(tokens) - 1])))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("cfg", MODELS, ids=IDS)
def test_cached_logits_equal_the_model(cfg):
    # At the recipe's initialisation (std 0.02) the logits are below 1 and agree to ~1e-7; they differ
    # only in the order of float32 sums, which grows with their scale (1e-5 at std 0.5, logits ~12).
    graphdef, params = build_model(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, 64, 20).astype(np.int32)
    expected_TxV = np.asarray(apply_model(graphdef, params, tokens[None]))[0]
    # The whole prompt at once, as a prefill reads it...
    logits_TxV, _ = forward(graph(cfg), params, jnp.asarray(tokens), 0, init_cache(cfg))
    np.testing.assert_allclose(logits_TxV, expected_TxV, atol=1e-5)
    # ...and one token at a time against the cache, as each step reads it.
    step = jax.jit(forward, static_argnames="graphdef")
    cache = init_cache(cfg)
    for position, token in enumerate(tokens):
        logits_1xV, cache = step(graph(cfg), params, jnp.asarray([token]), position, cache)
        np.testing.assert_allclose(logits_1xV[0], expected_TxV[position], atol=1e-5)


def test_a_bfloat16_model_is_decoded_in_float32():
    # The parameters are float32 either way: decoding a bfloat16 model computes what the float32 model
    # does, within bfloat16's rounding (8 bits of mantissa, ~0.4%) of the bfloat16 forward.
    cfg = LLAMA.model_copy(update={"compute_dtype": "bfloat16", "init_std": 0.5})
    graphdef, params = build_model(cfg, seed=0)
    tokens = np.random.default_rng(0).integers(0, 64, 20).astype(np.int32)
    logits_TxV, _ = forward(graph(cfg), params, jnp.asarray(tokens), 0, init_cache(cfg))
    assert logits_TxV.dtype == jnp.float32
    float32_graphdef, _ = build_model(cfg.model_copy(update={"compute_dtype": "float32"}), seed=0)
    np.testing.assert_allclose(logits_TxV, apply_model(float32_graphdef, params, tokens[None])[0], atol=1e-5)
    bfloat16_TxV = np.asarray(apply_model(graphdef, params, tokens[None]))[0]
    assert np.abs(logits_TxV - bfloat16_TxV).max() < 0.05 * np.abs(bfloat16_TxV).max()


def test_greedy_equals_uncached_argmax(model):
    cfg, graphdef, params = model
    prompt = [3, 14, 15, 9, 26]
    got = list(generate(cfg, params, prompt, max_new_tokens=12, temperature=0))
    assert got == reference_greedy(graphdef, params, prompt, 12, cfg.context_len)


# Sampling is the same whatever the blocks: these run on GPT's only.
@pytest.mark.parametrize("model", MODELS[:2], ids=IDS[:2], indirect=True)
def test_top_k_1_is_greedy(model):
    cfg, _, params = model
    greedy = list(generate(cfg, params, [1, 2, 3], 10, temperature=0))
    assert list(generate(cfg, params, [1, 2, 3], 10, temperature=1.0, top_k=1, seed=5)) == greedy


@pytest.mark.parametrize("model", MODELS[:2], ids=IDS[:2], indirect=True)
def test_seed_decides_the_sample(model):
    cfg, _, params = model
    a = list(generate(cfg, params, [7], 20, temperature=1.0, seed=1))
    assert a == list(generate(cfg, params, [7], 20, temperature=1.0, seed=1))
    # 20 draws from ~64 tokens: equal by chance with negligible probability.
    assert a != list(generate(cfg, params, [7], 20, temperature=1.0, seed=2))
    assert all(0 <= t < 64 for t in a)


def test_top_k_keeps_only_the_k_most_likely():
    graphdef, params = build_model(CFG.model_copy(update={"init_std": 0.5}), seed=0)
    prompt = [5, 6]
    logits_V = np.asarray(apply_model(graphdef, params, jnp.asarray([prompt], jnp.int32)))[0, -1]
    top3 = set(np.argsort(logits_V)[-3:].tolist())
    firsts = {next(generate(CFG, params, prompt, 1, temperature=5.0, top_k=3, seed=s)) for s in range(40)}
    assert firsts <= top3 and len(firsts) > 1


def test_stops_at_context_len_and_at_stop_token():
    _, params = build_model(CFG, seed=0)
    # 32 positions, 30 taken by the prompt: at most 2 new tokens, however many are asked for.
    assert len(list(generate(CFG, params, list(range(30)), max_new_tokens=100, seed=0))) == 2
    assert len(list(generate(CFG, params, [1], max_new_tokens=100, seed=0))) == 31
    assert list(generate(CFG, params, [1], max_new_tokens=0)) == []
    free = list(generate(CFG, params, [1], max_new_tokens=20, seed=3))
    stop = free[5]
    stopped = list(generate(CFG, params, [1], max_new_tokens=20, seed=3, stop_token=stop))
    assert stopped == free[: free.index(stop) + 1] and stopped[-1] == stop


@pytest.mark.parametrize("cfg", [CFG, LLAMA], ids=["gpt", "llama"])
def test_step_compiles_once_per_generation(cfg):
    _, params = build_model(cfg, seed=0)
    decode._step.clear_cache()
    decode._prefill.clear_cache()
    assert len(list(generate(cfg, params, [1, 2], 25, temperature=0.8, seed=0))) == 25
    # Another prompt length, seed and temperature reuse both executables.
    assert len(list(generate(cfg, params, [4, 5, 6, 7, 8], 25, temperature=1.3, seed=9))) == 25
    assert decode._step._cache_size() == 1
    assert decode._prefill._cache_size() == 1


@pytest.mark.parametrize(
    ("prompt", "kwargs", "message"),
    [
        ([], {}, "the prompt has 0 tokens"),
        (list(range(32)), {}, "the prompt has 32 tokens"),
        ([64], {}, "outside the model's vocabulary"),
        ([1], {"max_new_tokens": -1}, "negative"),
        ([1], {"temperature": -0.5}, "temperature"),
        ([1], {"top_k": 0}, "top_k=0"),
    ],
)
def test_bad_arguments_are_user_errors_at_call_time(prompt, kwargs, message):
    _, params = build_model(CFG, seed=0)
    with pytest.raises(UserError, match=message):
        generate(CFG, params, prompt, **{"max_new_tokens": 4, **kwargs})  # raises before iterating
