"""Balanced fragmentation, gather/scatter and the staggered schedule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlc.core.fragments import FragmentPlan, Piece, Segment, shapes_of


def transformer_shapes(fused_qkv: bool) -> dict[str, tuple[int, ...]]:
    """A decoder-only transformer: vocab 256, width 128, 4 layers, mlp 512."""
    shapes: dict[str, tuple[int, ...]] = {
        "embed/embedding": (256, 128),
        "final_norm/scale": (128,),
    }
    for i in range(4):
        b = f"blocks/{i}/"
        shapes[b + "ln1/scale"] = (128,)
        shapes[b + "ln2/scale"] = (128,)
        if fused_qkv:
            shapes[b + "attn/qkv/kernel"] = (128, 384)
        else:
            for n in "qkv":
                shapes[b + f"attn/{n}/kernel"] = (128, 128)
        shapes[b + "attn/o/kernel"] = (128, 128)
        shapes[b + "mlp/fc1/kernel"] = (128, 512)
        shapes[b + "mlp/fc1/bias"] = (512,)
        shapes[b + "mlp/fc2/kernel"] = (512, 128)
        shapes[b + "mlp/fc2/bias"] = (128,)
    return shapes


@pytest.mark.parametrize("fused_qkv", [True, False])
@pytest.mark.parametrize("num_fragments", [1, 2, 4, 8, 24])
def test_balance_on_a_transformer(fused_qkv: bool, num_fragments: int) -> None:
    shapes = transformer_shapes(fused_qkv)
    plan = FragmentPlan.build(shapes, num_fragments)
    # N = 256*128 + 128 + 4 * (2*128 + 128*384 + 128*128 + 128*512 + 512 + 512*128 + 128)
    #   = 32768 + 128 + 4 * 197504 = 822912 either way (fused or separate q/k/v).
    assert plan.total_size == 822912
    sizes = [plan.size(p) for p in range(num_fragments)]
    assert sum(sizes) == 822912
    assert max(sizes) <= 4 / 3 * 822912 / num_fragments
    for name, shape in shapes.items():
        pieces = [pc for p in range(num_fragments) for pc in plan.pieces(p)]
        rows = sorted((a, b) for n, a, b in pieces if n == name)
        if len(shape) < 2:
            assert rows == [(0, shape[0])]  # 1-D tensors are never split


def test_hand_built_plan() -> None:
    # N = 24 + 4 + 4 + 1 = 33, P = 2, N/P = 16.5. "a" (24 > 16.5) is cut into
    # ceil(24 / 16.5) = 2 pieces of 3 rows (12 values). Largest first, ties by name:
    # a[0:3] -> F0 (12), a[3:6] -> F1 (12), b -> F0 (tie: lowest index; 16),
    # c -> F1 (16), s -> F0 (17). Largest 17 <= 1.2 * 16.5, so no finer cut is tried.
    plan = FragmentPlan.build({"s": (), "c": (2, 2), "b": (4,), "a": (6, 4)}, 2)
    assert plan.pieces(0) == (Piece("a", 0, 3), Piece("b", 0, 4), Piece("s", 0, 1))
    assert plan.pieces(1) == (Piece("a", 3, 6), Piece("c", 0, 2))
    assert [plan.size(0), plan.size(1)] == [17, 16]
    assert plan.segments(0) == [Segment("a", 0, 12), Segment("b", 12, 4), Segment("s", 16, 1)]
    assert plan.segments(1) == [Segment("a", 0, 12), Segment("c", 12, 4)]


def test_gather_scatter_round_trip() -> None:
    params = {
        "a": np.arange(24, dtype=np.float32).reshape(6, 4),
        "b": np.arange(100, 104, dtype=np.float32),
        "c": np.arange(200, 204, dtype=np.float32).reshape(2, 2),
        "s": np.array(7.0, dtype=np.float32),
    }
    plan = FragmentPlan.build(shapes_of(params), 2)
    # Fragment 0 = a rows 0..2 (0..11), then b, then the scalar.
    expected0 = np.concatenate([np.arange(12), np.arange(100, 104), [7.0]])
    np.testing.assert_array_equal(plan.gather(params, 0), expected0)
    assert plan.gather(params, 0).dtype == np.float32

    # Scatter every fragment into zeroed arrays (one of them non-contiguous).
    target = {k: np.zeros_like(v) for k, v in params.items()}
    target["a"] = np.asfortranarray(target["a"])
    for p in range(plan.num_fragments):
        plan.scatter(target, p, plan.gather(params, p))
    for name in params:
        np.testing.assert_array_equal(target[name], params[name])

    # assemble builds new arrays from every fragment's vector.
    built = plan.assemble([plan.gather(params, p) for p in range(plan.num_fragments)], params)
    for name in params:
        np.testing.assert_array_equal(built[name], params[name])
        assert built[name] is not params[name] and built[name].dtype == np.float32

    # gather copies: writing into its result leaves the parameters alone.
    vec = plan.gather(params, 1)
    vec[:] = -1
    assert params["a"][3, 0] == 12


def test_scatter_and_gather_check_shapes() -> None:
    plan = FragmentPlan.build({"a": (6, 4), "b": (4,)}, 2)
    with pytest.raises(ValueError, match="holds"):
        plan.scatter({"a": np.zeros((6, 4)), "b": np.zeros(4)}, 0, np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        plan.gather({"a": np.zeros((4, 6)), "b": np.zeros(4)}, 0)
    with pytest.raises(KeyError):
        plan.gather({"b": np.zeros(4)}, 0)


def test_plan_serialisation_and_fingerprint() -> None:
    shapes = transformer_shapes(fused_qkv=True)
    plan = FragmentPlan.build(shapes, 8)
    again = FragmentPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert again.fingerprint() == plan.fingerprint()
    # Insertion order of the shapes does not matter; the fragment count does.
    reordered = dict(reversed(list(shapes.items())))
    assert FragmentPlan.build(reordered, 8).fingerprint() == plan.fingerprint()
    assert FragmentPlan.build(shapes, 4).fingerprint() != plan.fingerprint()


def test_from_dict_rejects_a_bad_tiling() -> None:
    data = {"shapes": {"a": [6, 4]}, "fragments": [[["a", 0, 4]], [["a", 3, 6]]]}
    with pytest.raises(ValueError, match="not tiled"):
        FragmentPlan.from_dict(data)


def test_build_errors() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FragmentPlan.build({"a": (4,)}, 0)
    with pytest.raises(ValueError, match="empty"):
        FragmentPlan.build({}, 2)
    # One 1-D tensor cannot be cut, so a second fragment would stay empty.
    with pytest.raises(ValueError, match="lower num_fragments"):
        FragmentPlan.build({"a": (4,)}, 2)
