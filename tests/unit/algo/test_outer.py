"""The outer steps against steps computed by hand, through state()/load() and a syncer's journal."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dlc.algo.merge import merge_deltas
from dlc.algo.outer import OUTER_STEPS, DelayedNesterov, Nesterov, make_outer
from dlc.config.outer import OUTER_KINDS, DelayedNesterovOuter, NesterovOuter
from dlc.config.schema import Recipe


def nesterov(lr: float, momentum: float, size: int = 1) -> Nesterov:
    return Nesterov(NesterovOuter(lr=lr, momentum=momentum), size)


def delayed(lr: float, momentum: float, every: int, size: int = 1) -> DelayedNesterov:
    return DelayedNesterov(DelayedNesterovOuter(lr=lr, momentum=momentum, delay_rounds=every), size)


def test_every_kind_the_recipe_names_has_an_outer_step() -> None:
    assert tuple(OUTER_STEPS) == OUTER_KINDS


def test_nesterov_by_hand() -> None:
    opt = nesterov(lr=0.5, momentum=0.9)
    theta = np.array([1.0], dtype=np.float32)
    # Step 1, g = 0.2: buf = 0.9 * 0 + 0.2 = 0.2; theta = 1 - 0.5 * (0.2 + 0.9 * 0.2)
    # = 1 - 0.5 * 0.38 = 0.81.
    theta = opt.step(theta, np.array([0.2], dtype=np.float32))
    np.testing.assert_allclose([theta[0], opt.state()["momentum"][0]], [0.81, 0.2], rtol=1e-6)
    # Step 2, g = 0.1: buf = 0.9 * 0.2 + 0.1 = 0.28; theta = 0.81 - 0.5 * (0.1 + 0.252)
    # = 0.81 - 0.176 = 0.634.
    theta = opt.step(theta, np.array([0.1], dtype=np.float32))
    np.testing.assert_allclose([theta[0], opt.state()["momentum"][0]], [0.634, 0.28], rtol=1e-6)


def test_nesterov_matches_reference() -> None:
    rng = np.random.default_rng(0)
    lr, mu = 0.7, 0.9
    opt = nesterov(lr, mu, size=16)
    theta = rng.normal(size=16).astype(np.float32)
    ref_theta, ref_buf = theta.astype(np.float64), np.zeros(16)
    for _ in range(5):
        g = rng.normal(size=16).astype(np.float32)
        before = theta.copy()
        theta = opt.step(theta, g)
        ref_buf = mu * ref_buf + g  # torch.optim.SGD(nesterov=True), two lines
        ref_theta = ref_theta - lr * (g + mu * ref_buf)
        assert not np.shares_memory(theta, before)
    np.testing.assert_allclose(theta, ref_theta, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(opt.state()["momentum"], ref_buf, rtol=1e-5, atol=1e-5)


def test_lr_one_without_momentum_lands_on_the_mean_learner() -> None:
    # Deltas are anchor - theta_m: with lr 1 and no momentum the global fragment
    # becomes the weighted mean of the learners' parameters.
    anchor = np.array([1.0, 1.0], dtype=np.float32)
    learners = [np.array([0.0, 2.0], dtype=np.float32), np.array([2.0, 4.0], dtype=np.float32)]
    merged = merge_deltas([anchor - t for t in learners], np.array([0.5, 0.5]))
    theta = nesterov(lr=1.0, momentum=0.0, size=2).step(anchor, merged)
    np.testing.assert_allclose(theta, [1.0, 3.0])


def test_delayed_nesterov_by_hand() -> None:
    opt = delayed(lr=0.5, momentum=0.9, every=2)
    theta = np.array([1.0], dtype=np.float32)
    # Round 1, g = 0.2: no momentum update yet, plain SGD: theta = 1 - 0.5 * 0.2 = 0.9.
    theta = opt.step(theta, np.array([0.2], dtype=np.float32))
    np.testing.assert_allclose(theta, [0.9], rtol=1e-6)
    assert opt.state()["momentum"][0] == 0.0 and opt.state()["rounds"][0] == 1
    # Round 2, g = 0.4: buf = 0.9 * 0 + (0.2 + 0.4) / 2 = 0.3;
    # theta = 0.9 - 0.5 * (0.4 + 0.9 * 0.3) = 0.9 - 0.5 * 0.67 = 0.565.
    theta = opt.step(theta, np.array([0.4], dtype=np.float32))
    np.testing.assert_allclose([theta[0], opt.state()["momentum"][0]], [0.565, 0.3], rtol=1e-6)
    # Round 3, g = 0.1: plain again, the momentum waits: theta = 0.565 - 0.05 = 0.515.
    theta = opt.step(theta, np.array([0.1], dtype=np.float32))
    np.testing.assert_allclose(theta, [0.515], rtol=1e-6)
    # Round 4, g = 0.3: buf = 0.9 * 0.3 + (0.1 + 0.3) / 2 = 0.47;
    # theta = 0.515 - 0.5 * (0.3 + 0.9 * 0.47) = 0.515 - 0.5 * 0.723 = 0.1535.
    theta = opt.step(theta, np.array([0.3], dtype=np.float32))
    np.testing.assert_allclose([theta[0], opt.state()["momentum"][0]], [0.1535, 0.47], rtol=1e-6)


def test_delayed_nesterov_every_round_is_nesterov() -> None:
    rng = np.random.default_rng(1)
    a, b = nesterov(0.7, 0.9, size=8), delayed(0.7, 0.9, every=1, size=8)
    ta = tb = rng.normal(size=8).astype(np.float32)
    for _ in range(6):
        g = rng.normal(size=8).astype(np.float32)
        ta, tb = a.step(ta, g), b.step(tb, g)
    np.testing.assert_allclose(ta, tb, rtol=1e-6)


@pytest.mark.parametrize("kind", OUTER_KINDS)
def test_state_round_trips_through_a_pickle_and_continues_the_same(kind: str) -> None:
    # A journal pickles state(); a restarted syncer load()s it into a fresh step and goes on.
    cfg = Recipe.model_validate({"syncer": {"outer": {"kind": kind, "lr": 0.6, "momentum": 0.8}}}).syncer.outer
    rng = np.random.default_rng(2)
    first, theta = make_outer(cfg, 5), rng.normal(size=5).astype(np.float32)
    for _ in range(3):
        theta = first.step(theta, rng.normal(size=5).astype(np.float32))
    second = make_outer(cfg, 5)
    second.load(pickle.loads(pickle.dumps(first.state())))
    g = rng.normal(size=5).astype(np.float32)
    np.testing.assert_array_equal(second.step(theta, g), first.step(theta, g))


def test_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="shape"):
        nesterov(1.0, 0.0, size=2).step(np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="holds 2 values"):
        nesterov(1.0, 0.0, size=2).step(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="'momentum' holds 3 values"):
        nesterov(1.0, 0.0, size=2).load({"momentum": np.zeros(3)})
