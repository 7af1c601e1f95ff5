"""The inner optimizer's schedules and the training objective, against values computed by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dlc.config.workload import InnerConfig, ModelConfig
from dlc.core.model import apply_model, build_model
from dlc.core.steps import cross_entropy, make_grad_step, make_schedule, objective


def test_wsd_warms_up_holds_then_decays_linearly_over_its_last_fraction():
    cfg = InnerConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, schedule="wsd", decay_fraction=0.2)
    lr = make_schedule(cfg, 100)
    assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5)
    assert [float(lr(s)) for s in (10, 50, 80)] == [1.0, 1.0, 1.0]  # stable until the last 20 steps
    assert float(lr(90)) == pytest.approx(0.55)  # halfway down from 1.0 to 0.1
    assert float(lr(100)) == pytest.approx(0.1) and float(lr(150)) == pytest.approx(0.1)


def test_wsd_on_a_schedule_shorter_than_its_warm_up_still_ends_at_the_final_lr():
    cfg = InnerConfig(lr=1.0, min_lr_ratio=0.0, warmup_steps=50, schedule="wsd", decay_fraction=0.5)
    lr = make_schedule(cfg, 10)
    assert float(lr(9)) == pytest.approx(1.0) and float(lr(10)) == pytest.approx(0.0)


def test_cosine_is_still_the_default():
    cfg = InnerConfig(lr=1.0, min_lr_ratio=0.0, warmup_steps=0)
    lr = make_schedule(cfg, 100)
    assert cfg.schedule == "cosine" and float(lr(50)) == pytest.approx(0.5) and float(lr(100)) == pytest.approx(0.0)


def test_the_z_loss_adds_the_mean_squared_log_normaliser_and_the_loss_reported_is_the_cross_entropy():
    graphdef, params = build_model(ModelConfig(width=16, num_layers=1, num_heads=2, context_len=8), 0)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 8)), jnp.int32)
    logits = apply_model(graphdef, params, x).astype(jnp.float32)
    by_hand = float(jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2))
    ce = float(cross_entropy(graphdef, params, x, x))
    total, reported = objective(graphdef, params, x, x, 1e-2)
    assert float(reported) == pytest.approx(ce, rel=1e-6)
    assert float(total) == pytest.approx(ce + 1e-2 * by_hand, rel=1e-5)
    # Off, the objective is the cross-entropy; on, its gradient differs, and the loss reported does not.
    plain_loss, plain_grads, _ = make_grad_step(graphdef)(params, x, x)
    z_loss, z_grads, _ = make_grad_step(graphdef, 1e-2)(params, x, x)
    assert float(plain_loss) == pytest.approx(float(z_loss), rel=1e-6)
    differ = jax.tree_util.tree_map(lambda a, b: bool(jnp.any(a != b)), plain_grads, z_grads)
    assert any(jax.tree_util.tree_leaves(differ))


def test_each_tensors_step_is_multiplied_by_its_factor():
    from dlc.core.steps import LeafScales, make_optimizer

    cfg = InnerConfig(lr=0.1, warmup_steps=0, weight_decay=0.1)
    params = {"a": jnp.ones((2, 2)), "b": jnp.full((3,), 2.0)}  # leaves in order: a, b
    grads = {"a": jnp.full((2, 2), 0.1), "b": jnp.array([0.2, -0.2, 0.05])}  # norm 0.35: not clipped
    optimizer = make_optimizer(cfg, 10)
    state = optimizer.init(params)
    assert isinstance(state[-1], LeafScales) and state[-1].scales.tolist() == [1.0, 1.0]
    plain = optax.adamw(0.1, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=0.1, mask={"a": True, "b": False})
    expected, _ = plain.update(grads, plain.init(params), params)
    same, _ = optimizer.update(grads, state, params)  # factors of 1: AdamW's step exactly
    got, _ = optimizer.update(grads, (*state[:-1], LeafScales(jnp.array([2.0, 0.0]))), params)
    for key, factor in (("a", 2.0), ("b", 0.0)):  # decoupled weight decay is scaled with the rest
        np.testing.assert_allclose(same[key], expected[key], rtol=1e-6)
        np.testing.assert_allclose(got[key], factor * expected[key], rtol=1e-6)
