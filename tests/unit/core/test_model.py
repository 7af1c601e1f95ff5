import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlc.config.workload import ModelConfig
from dlc.core.abstract import activation_bytes
from dlc.core.model import apply_model, build_model, count_params, flatten_params, unflatten_params
from dlc.core.steps import make_grad_step

CFG = ModelConfig(width=32, num_layers=2, num_heads=4, mlp_ratio=4, context_len=16)


def test_logits_shape():
    graphdef, params = build_model(CFG, seed=0)
    tokens = jnp.zeros((3, 16), jnp.int32)
    assert apply_model(graphdef, params, tokens).shape == (3, 16, 256)


def test_causal_future_bytes_do_not_change_past_logits():
    graphdef, params = build_model(CFG, seed=0)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (1, 16)).astype(np.int32)
    b = a.copy()
    b[0, 10:] = (b[0, 10:] + 1) % 256  # change bytes 10..15 only
    la, lb = apply_model(graphdef, params, a), apply_model(graphdef, params, b)
    np.testing.assert_allclose(la[0, :10], lb[0, :10], atol=1e-5)
    assert not np.allclose(la[0, 10:], lb[0, 10:])


def test_parameter_count_by_hand():
    # Tied embeddings, width D=32, L=2 blocks, MLP 4D=128, context 16, vocab 256:
    #   embed 256*32 = 8192, pos 16*32 = 512
    #   per block: 2 LayerNorms 2*(32+32) = 128; qkv 32*96 = 3072; out 32*32 = 1024;
    #              up 32*128+128 = 4224; down 128*32+32 = 4128   -> 12576
    #   final LayerNorm 64
    #   total 8192 + 512 + 2*12576 + 64 = 33920
    _, params = build_model(CFG, seed=0)
    assert count_params(params) == 33920
    # Untied adds a 32x256 output matrix: 33920 + 8192 = 42112.
    _, untied = build_model(CFG.model_copy(update={"tie_embeddings": False}), seed=0)
    assert count_params(untied) == 42112


def test_flatten_round_trip_and_names():
    _, params = build_model(CFG, seed=0)
    flat = flatten_params(params)
    assert "blocks/0/attn/qkv/kernel" in flat and flat["blocks/0/attn/qkv/kernel"].shape == (32, 96)
    back = flatten_params(unflatten_params(flat, params))
    assert back.keys() == flat.keys()
    for name in flat:
        np.testing.assert_array_equal(back[name], flat[name])


def test_same_seed_same_init():
    _, a = build_model(CFG, seed=3)
    _, b = build_model(CFG, seed=3)
    _, c = build_model(CFG, seed=4)
    fa, fb, fc = flatten_params(a), flatten_params(b), flatten_params(c)
    assert all(np.array_equal(fa[k], fb[k]) for k in fa)
    assert not np.array_equal(fa["embed/embedding"], fc["embed/embedding"])


LLAMA = ModelConfig(arch="llama", width=32, num_layers=2, num_heads=4, num_kv_heads=2, context_len=16)


def test_llama_parameter_count_by_hand():
    # Width D=32, L=2, 4 query heads of 8, 2 key/value heads (16 wide), SwiGLU hidden 2/3 * 4 * 32 = 85.3,
    # rounded up to 128; vocab 256, tied, no position table, no biases:
    #   embed 256*32 = 8192
    #   per block: 2 RMSNorms 2*32 = 64; q 32*32 = 1024; k, v 2 * 32*16 = 1024; out 32*32 = 1024;
    #              gate, up 2 * 32*128 = 8192; down 128*32 = 4096   -> 15424
    #   final RMSNorm 32
    #   total 8192 + 2*15424 + 32 = 39072
    _, params = build_model(LLAMA, seed=0)
    assert count_params(params) == 39072
    assert "pos_embed" not in params and flatten_params(params)["blocks/1/attn/k/kernel"].shape == (32, 16)


def test_llama_is_causal_and_its_positions_relative():
    graphdef, params = build_model(LLAMA, seed=0)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (1, 16)).astype(np.int32)
    b = a.copy()
    b[0, 10:] = (b[0, 10:] + 1) % 256
    la, lb = apply_model(graphdef, params, a), apply_model(graphdef, params, b)
    np.testing.assert_allclose(la[0, :10], lb[0, :10], atol=1e-5)
    assert not np.allclose(la[0, 10:], lb[0, 10:])


def test_rotary_is_hugging_faces_rotate_half_and_depends_on_distance_only():
    from dlc.core.arch.llama import rotary

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 5, 2, 8)).astype(np.float32)
    positions = np.arange(3, 8)
    # Hugging Face's Llama: inv_freq = theta^(-2i/K), cos/sin of the angles repeated over both halves,
    # x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1].
    inv = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    angles = np.concatenate([positions[:, None] * inv] * 2, axis=-1)[None, :, None, :]
    half = np.concatenate([-x[..., 4:], x[..., :4]], axis=-1)
    np.testing.assert_allclose(
        np.asarray(rotary(x, positions, 10000.0)), x * np.cos(angles) + half * np.sin(angles), atol=1e-5
    )
    q, k = x[:, :, 0], x[:, :, 1]
    scores = [
        np.einsum(
            "btk,bsk->ts",
            np.asarray(rotary(q[:, :, None], positions + shift, 10000.0))[:, :, 0],
            np.asarray(rotary(k[:, :, None], positions + shift, 10000.0))[:, :, 0],
        )
        for shift in (0, 40)
    ]
    np.testing.assert_allclose(scores[0], scores[1], atol=1e-4)


def test_grouped_query_attention_shares_each_key_value_head_among_consecutive_query_heads():
    # Two kv heads for four query heads equal four kv heads that repeat them: 0, 0, 1, 1.
    graphdef, params = build_model(LLAMA, seed=0)
    full_cfg = LLAMA.model_copy(update={"num_kv_heads": 4})
    full_graphdef, full = build_model(full_cfg, seed=0)
    flat, full_flat = flatten_params(params), flatten_params(full)
    for name in full_flat:
        if name.endswith(("attn/k/kernel", "attn/v/kernel")):
            heads = flat[name].reshape(32, 2, 8)
            full_flat[name] = np.repeat(heads, 2, axis=1).reshape(32, 32)
        else:
            full_flat[name] = flat[name]
    tokens = np.random.default_rng(2).integers(0, 256, (2, 16)).astype(np.int32)
    np.testing.assert_allclose(
        apply_model(full_graphdef, unflatten_params(full_flat, full), tokens),
        apply_model(graphdef, params, tokens),
        atol=1e-5,
    )


def test_bfloat16_computes_in_bfloat16_and_keeps_float32_parameters():
    import jax

    tokens = np.random.default_rng(3).integers(0, 256, (2, 16)).astype(np.int32)
    for cfg in (CFG, LLAMA):
        graphdef, params = build_model(cfg, seed=0)
        low_graphdef, low = build_model(cfg.model_copy(update={"compute_dtype": "bfloat16"}), seed=0)
        assert all(v.dtype == np.float32 for v in flatten_params(low).values())
        exact, approx = apply_model(graphdef, params, tokens), apply_model(low_graphdef, params, tokens)
        assert approx.dtype == jnp.float32 and not np.array_equal(exact, approx)
        np.testing.assert_allclose(approx, exact, atol=0.05)
        hlo = jax.jit(lambda p, t, g=low_graphdef: apply_model(g, p, t)).lower(params, tokens).as_text()
        assert "bf16" in hlo and "dot_general" in hlo


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_remat_per_block_computes_the_same_loss_and_gradients_and_the_planner_counts_less(arch):
    """model.remat=block recomputes each block in the backward pass: the same numbers, fewer kept."""
    x = jnp.asarray(np.random.default_rng(0).integers(0, 256, (16, 16)), jnp.int32)
    results, temps = {}, {}
    for remat in ("none", "block"):
        cfg = CFG.model_copy(update={"arch": arch, "num_layers": 4, "remat": remat})
        graphdef, params = build_model(cfg, 0)
        compiled = make_grad_step(graphdef).lower(params, x, x).compile()
        results[remat] = compiled(params, x, x)[:2]
        # What the compiler allocates: XLA's temporary buffers of the gradient step (on the CPU,
        # jax.checkpoint alone left them as they were).
        temps[remat] = compiled.memory_analysis().temp_size_in_bytes
    (loss, grads), (remat_loss, remat_grads) = results["none"], results["block"]
    assert float(remat_loss) == pytest.approx(float(loss), rel=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(remat_grads), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7)
    assert temps["block"] < temps["none"] / 2, temps
    # The planner: each block's input kept, one block recomputed at a time, instead of every block's activations.
    deep = CFG.model_copy(update={"arch": arch, "num_layers": 12})
    kept, recomputed = (activation_bytes(deep.model_copy(update={"remat": r}), 16) for r in ("none", "block"))
    assert recomputed < kept / 3


def test_every_registered_arch_has_its_family_module():
    from dlc.config.workload import ARCHES
    from dlc.core.arch import family

    assert [family(name).name for name in ARCHES] == list(ARCHES)
