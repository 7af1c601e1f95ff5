"""Contributor weights and the mean and RDA merges of a round."""

from __future__ import annotations

import numpy as np
import pytest

from dlc.algo.merge import merge_deltas, merge_weights, spreads


def test_weight_modes_by_hand() -> None:
    # Learner 0: 4 steps of 100 tokens; learner 1 (fast, small batches): 8 steps of 50.
    tokens, steps = [400, 400], [4, 8]
    np.testing.assert_allclose(merge_weights(tokens, steps, "uniform"), [0.5, 0.5])
    np.testing.assert_allclose(merge_weights(tokens, steps, "tokens"), [0.5, 0.5])
    np.testing.assert_allclose(merge_weights(tokens, steps), [0.5, 0.5])  # tokens, the default
    # tokens^2 / steps: 400^2 / 4 = 40000 and 400^2 / 8 = 20000 -> [2/3, 1/3]: the same data, in
    # batches twice as large, counts twice.
    np.testing.assert_allclose(merge_weights(tokens, steps, "tokens_squared_per_step"), [2 / 3, 1 / 3])
    # tokens: 100 and 300 of 400 -> [0.25, 0.75].
    np.testing.assert_allclose(merge_weights([100, 300], [1, 3], "tokens"), [0.25, 0.75])
    # A push two versions behind, discounted by 0.5 a version: 300 * 0.25 = 75 against 100 -> [4/7, 3/7].
    np.testing.assert_allclose(merge_weights([100, 300], [1, 3], "tokens", [0, 2], 0.5), [4 / 7, 3 / 7])
    np.testing.assert_allclose(merge_weights([100, 300], [1, 3], "tokens", [0, 2]), [0.25, 0.75])  # no discount


def test_weight_errors() -> None:
    with pytest.raises(ValueError, match="0 steps"):
        merge_weights([100, 100], [4, 0])
    with pytest.raises(ValueError, match="unknown weight mode"):
        merge_weights([1], [1], "votes")
    with pytest.raises(ValueError, match="token counts but"):
        merge_weights([1, 2], [1])
    with pytest.raises(ValueError, match="zero weight"):
        merge_weights([0, 0], [1, 1], "tokens")


def test_weighted_mean_by_hand() -> None:
    d0 = np.array([1.0, 2.0], dtype=np.float32)
    d1 = np.array([3.0, 6.0], dtype=np.float32)
    # 0.25 * [1, 2] + 0.75 * [3, 6] = [0.25 + 2.25, 0.5 + 4.5] = [2.5, 5.0]
    out = merge_deltas([d0, d1], np.array([0.25, 0.75]), "mean")
    np.testing.assert_allclose(out, [2.5, 5.0])
    assert out.dtype == np.float32
    # Unnormalised weights give the same answer.
    np.testing.assert_allclose(merge_deltas([d0, d1], np.array([1, 3]), "mean"), out)


def test_rda_by_hand_with_an_embedding_segment() -> None:
    segments = [("w", 0, 2), ("emb", 2, 2)]
    d0 = np.array([3.0, 4.0, 1.0, 0.0], dtype=np.float32)
    d1 = np.array([0.0, 10.0, 0.0, 1.0], dtype=np.float32)
    w = np.array([0.5, 0.5])
    out = merge_deltas([d0, d1], w, "rda", segments, mean_names={"emb"})
    # "w": norms 5 and 10 -> radius 0.5 * 5 + 0.5 * 10 = 7.5.
    # Units [0.6, 0.8] and [0, 1]; 0.5 * sum = [0.3, 0.9], norm sqrt(0.9) = 0.948683.
    # Direction [0.316228, 0.948683]; merged = 7.5 * direction = [2.371708, 7.115125].
    # (The plain mean [1.5, 7.0] has norm 7.159: shorter than 7.5.)
    # "emb" uses the mean: [0.5, 0.5].
    np.testing.assert_allclose(out, [2.371708, 7.115125, 0.5, 0.5], rtol=1e-6)
    # Without the mean exemption "emb" is RDA too: radius 1, direction [1, 1] / sqrt 2.
    out = merge_deltas([d0, d1], w, "rda", segments)
    np.testing.assert_allclose(out[2:], [0.707107, 0.707107], rtol=1e-6)


def test_rda_single_learner_is_identity() -> None:
    d = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    np.testing.assert_allclose(merge_deltas([d], np.array([1.0]), "rda"), d, rtol=1e-6)


def test_rda_zero_deltas_without_nan() -> None:
    zero = np.zeros(2, dtype=np.float32)
    d = np.array([3.0, 4.0], dtype=np.float32)
    w = np.array([0.5, 0.5])
    # Radius 0.5 * 0 + 0.5 * 5 = 2.5; only d has a direction, [0.6, 0.8]: [1.5, 2.0].
    np.testing.assert_allclose(merge_deltas([zero, d], w, "rda"), [1.5, 2.0])
    np.testing.assert_array_equal(merge_deltas([zero, zero], w, "rda"), [0.0, 0.0])
    # Opposite directions cancel: no move.
    opposite = [np.array([1.0, 0.0]), np.array([-1.0, 0.0])]
    np.testing.assert_array_equal(merge_deltas(opposite, w, "rda"), [0.0, 0.0])


def test_merge_errors() -> None:
    d = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match="unknown merge method"):
        merge_deltas([d], np.array([1.0]), "median")
    with pytest.raises(ValueError, match="weights"):
        merge_deltas([d, d], np.array([1.0]), "mean")
    with pytest.raises(ValueError, match="differ in length"):
        merge_deltas([d, np.ones(3)], np.array([1.0, 1.0]), "mean")
    with pytest.raises(ValueError, match="cover"):
        merge_deltas([d], np.array([1.0]), "rda", [("a", 0, 3)])


def test_spreads_by_hand() -> None:
    segments = [("w", 0, 2), ("emb", 2, 2), ("still", 4, 1)]
    d0 = np.array([3.0, 4.0, 1.0, 0.0, 0.0], dtype=np.float32)
    d1 = np.array([0.0, 10.0, 0.0, 1.0, 0.0], dtype=np.float32)
    got = spreads([d0, d1], np.array([1.0, 1.0]), segments)
    # "w": norms 5 and 10 -> 7.5 over the mean [1.5, 7.0]'s norm sqrt(51.25) = 7.158911 -> 1.047648.
    # "emb": two orthogonal unit deltas -> 1 over sqrt(0.5) = sqrt(2). "still": nobody moved -> 1.
    np.testing.assert_allclose(got, [7.5 / np.sqrt(51.25), np.sqrt(2.0), 1.0], rtol=1e-6)
    # Weighted: 0.25 and 0.75 of "emb" -> 1 over |[0.25, 0.75]| = 1 / sqrt(0.625).
    np.testing.assert_allclose(spreads([d0, d1], np.array([1.0, 3.0]), segments)[1], 1 / np.sqrt(0.625), rtol=1e-6)
    # One learner, or learners that agree, spread nothing: exactly 1.
    np.testing.assert_array_equal(spreads([d0], np.array([1.0]), segments), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(spreads([d1, d1], np.array([0.3, 0.7]), segments), [1.0, 1.0, 1.0])
    # The mean merge's own output, passed in, gives the same spreads bit for bit (the syncer's path).
    w = np.array([1.0, 3.0])
    merged = merge_deltas([d0, d1], w, "mean", segments)
    np.testing.assert_array_equal(spreads([d0, d1], w, segments, merged), spreads([d0, d1], w, segments))
