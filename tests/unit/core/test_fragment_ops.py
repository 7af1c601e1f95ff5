"""The learner's device functions against the host code they replace: what `extract` sends is the
host codec's encoding of anchor - theta, and `swap` writes one fragment and nothing else, in either
layout of the fragments (a learner on CPU uses pieces)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.core.fragment_ops import FragmentOps
from dlc.core.fragments import FragmentPlan, Piece, shapes_of
from dlc.core.model import build_model, flatten_params
from tests.helpers import TINY

BLOCK = 48  # rows of tiny are 64 wide: most fragments end in a partial block


@pytest.fixture(scope="module")
def model():
    recipe = load_recipe(TINY, [])
    _, params = build_model(recipe.model, seed=0)
    flat = flatten_params(params)
    # 7 fragments of uneven sizes.
    plan = FragmentPlan.build(shapes_of(flat), 7)
    assert any(plan.size(p) % BLOCK for p in range(7))  # the padding of a last block is exercised
    return params, flat, plan


def host_anchor(flat, plan, rng):
    """Anchors near the parameters, per fragment, as a learner holds them (host vectors)."""
    return [plan.gather(flat, p) + rng.normal(0, 1e-2, plan.size(p)).astype(np.float32) for p in range(7)]


@pytest.mark.parametrize("layout", ["pieces", "concat"])
@pytest.mark.parametrize("codec", ["none", "bf16", "int8", "int4"])
def test_extract_sends_the_host_codecs_encoding_of_anchor_minus_theta(model, codec, layout):
    params, flat, plan = model
    ops = FragmentOps(plan, params, codec, BLOCK, layout=layout)
    host = get_codec(codec, BLOCK)
    anchors = host_anchor(flat, plan, np.random.default_rng(0))
    for p in range(plan.num_fragments):
        payload, scales, theta_M = ops.push(params, p, ops.to_device(p, anchors[p]))
        sent = ops.encoded(p, payload, scales)
        np.testing.assert_array_equal(ops.to_host(p, theta_M), plan.gather(flat, p))
        delta = anchors[p] - plan.gather(flat, p)
        expected = host.encode(delta)
        assert (sent.codec, sent.length, sent.block_size) == (expected.codec, expected.length, expected.block_size)
        assert sent.payload.dtype == expected.payload.dtype and sent.payload.shape == expected.payload.shape
        assert sent.nbytes == expected.nbytes == ops.nbytes(p)
        if codec in ("int8", "int4"):
            np.testing.assert_allclose(sent.scales, expected.scales, rtol=1e-6)
            # float32 quotients on the device, float64 on the host: a value within a rounding error
            # of a half step may take the neighbouring level, nothing more.
            step = np.repeat(expected.scales, BLOCK)[: delta.size]
            np.testing.assert_allclose(host.decode(sent), host.decode(expected), rtol=0, atol=1.0001 * step.max())
            assert np.mean(sent.payload != expected.payload) < 1e-3
            assert np.all(np.abs(host.decode(sent) - delta) <= 0.5 * step * (1 + 1e-5) + 1e-12)
        else:
            np.testing.assert_array_equal(sent.payload, expected.payload)


@pytest.mark.parametrize("layout", ["pieces", "concat"])
def test_swap_writes_one_fragment_in_each_adoption_mode(model, layout):
    params, flat, plan = model
    ops = FragmentOps(plan, params, "int4", BLOCK, layout=layout)
    rng = np.random.default_rng(1)
    p = 3
    value = rng.normal(size=plan.size(p)).astype(np.float32)
    ref = rng.normal(size=plan.size(p)).astype(np.float32)
    theta = plan.gather(flat, p)
    for a, b in ((0.0, 0.0), (0.5, 0.0), (1.0, 1.0)):  # replace, mix, rebase
        current = jax.tree_util.tree_map(lambda x: x.copy(), params)  # swap donates its input
        out = flatten_params(ops.write(current, p, ops.to_device(p, value), ops.to_device(p, ref), a, b))
        np.testing.assert_allclose(plan.gather(out, p), value + a * theta - b * ref, rtol=1e-6, atol=1e-6)
        for q in range(plan.num_fragments):
            if q != p:
                np.testing.assert_array_equal(plan.gather(out, q), plan.gather(flat, q))
        assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in flat.items()}


def test_a_cpu_learner_reads_and_writes_pieces(model):
    params, _, plan = model
    assert FragmentOps(plan, params, "int4", BLOCK).layout == "pieces"


def test_fragments_of_one_make_up_share_a_pair_and_a_write_keeps_every_other_leaf():
    recipe = load_recipe(TINY, [])
    _, params = build_model(recipe.model, seed=0)
    plan = FragmentPlan.build(shapes_of(flatten_params(params)), 24)
    ops = FragmentOps(plan, params, "int4", 64)
    assert ops.groups < 12  # the tiny model's 24 fragments fall into 9 shapes
    assert len(set(ops.group)) == ops.groups
    before = jax.tree_util.tree_leaves(params)
    current = jax.tree_util.tree_map(lambda x: x.copy(), params)
    kept = jax.tree_util.tree_leaves(current)
    after = jax.tree_util.tree_leaves(ops.write(current, 5, ops.to_device(5, np.zeros(plan.size(5), np.float32))))
    touched = set(ops.slots[5])
    assert 0 < len(touched) < len(before)
    for i, (old, new) in enumerate(zip(kept, after, strict=True)):
        assert (new is old) == (i not in touched)  # the same arrays: no copy of what p has no piece of


def test_pieces_serve_a_fragment_holding_two_pieces_of_one_tensor(model):
    params, flat, _ = model
    # Fragment 0: the embedding's first 10 rows and its last 56 (two pieces of one leaf, which the
    # functions take once); fragment 1: the rows between and every other tensor.
    shapes = tuple(sorted(shapes_of(flat).items()))
    rows = dict(shapes)["embed/embedding"][0]
    others = tuple(Piece(name, 0, shape[0] if shape else 1) for name, shape in shapes if name != "embed/embedding")
    plan = FragmentPlan(
        shapes,
        (
            (Piece("embed/embedding", 0, 10), Piece("embed/embedding", 200, rows)),
            (Piece("embed/embedding", 10, 200), *others),
        ),
    )
    ops = FragmentOps(plan, params, "none", BLOCK, layout="pieces")
    rng = np.random.default_rng(2)
    for p in range(2):
        _, _, theta_M = ops.push(params, p, ops.to_device(p, np.zeros(plan.size(p), np.float32)))
        np.testing.assert_array_equal(ops.to_host(p, theta_M), plan.gather(flat, p))
        value = rng.normal(size=plan.size(p)).astype(np.float32)
        current = jax.tree_util.tree_map(lambda x: x.copy(), params)
        out = flatten_params(ops.write(current, p, ops.to_device(p, value)))
        np.testing.assert_array_equal(plan.gather(out, p), value)
        np.testing.assert_array_equal(plan.gather(out, 1 - p), plan.gather(flat, 1 - p))


def test_on_cpu_vectors_stay_on_the_host_and_serve_as_a_device_vector_does(model):
    params, flat, plan = model
    ops = FragmentOps(plan, params, "int4", BLOCK)
    p = 2
    value = np.random.default_rng(3).normal(size=plan.size(p)).astype(np.float32)
    staged = ops.to_device(p, value)
    assert isinstance(staged, np.ndarray) and staged.shape == (ops.M,)  # no device_put on the receiving thread
    assert ops.staged(p, staged) is staged and ops.staged(p, ops.put(staged)) is not staged
    np.testing.assert_array_equal(ops.staged(p, value), staged)  # a host vector is padded on the way
    outs = []
    for vector in (staged, ops.put(staged)):
        current = jax.tree_util.tree_map(lambda x: x.copy(), params)
        outs.append(flatten_params(ops.write(current, p, vector)))
        payload, scales, _ = ops.push(params, p, vector)
        outs.append(ops.encoded(p, payload, scales).payload)
    for host_side, device_side in zip(outs[:2], outs[2:], strict=True):
        jax.tree_util.tree_map(np.testing.assert_array_equal, host_side, device_side)
    np.testing.assert_array_equal(plan.gather(outs[0], p), value)
    with pytest.raises(ValueError, match="not 5"):
        ops.to_device(p, np.zeros(5, np.float32))
