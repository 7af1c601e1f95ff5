"""Merging a round: contributor weights and the weighted merge of their outer gradients.

An outer gradient (delta) is ``anchor - theta``: it points from a learner's parameters
back to the global ones it started from; the merged delta is the gradient of the outer step
(`dlc.algo.outer`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

WEIGHT_MODES: tuple[str, ...] = ("uniform", "tokens", "tokens_squared_per_step")
MERGE_METHODS: tuple[str, ...] = ("mean", "rda")


def merge_weights(
    tokens: Sequence[int],
    steps: Sequence[int],
    mode: str = "tokens",
    staleness: Sequence[int] | None = None,
    discount: float = 1.0,
) -> np.ndarray:
    """Normalised contributor weights (float64, summing to 1).

    ``uniform``: 1 each; ``tokens``: tokens_m, the data behind the push; ``tokens_squared_per_step``:
    tokens_m^2 / steps_m, i.e. quantity of data times tokens per step (a learner with k times the
    batch gets k times its share of the data). Each version a push is behind (``staleness``)
    multiplies its weight by ``discount`` before they are normalised.
    """
    if mode not in WEIGHT_MODES:
        raise ValueError(f"unknown weight mode {mode!r}: choose one of {WEIGHT_MODES}")
    if len(tokens) != len(steps):
        raise ValueError(f"{len(tokens)} token counts but {len(steps)} step counts")
    if not tokens:
        raise ValueError("cannot weight an empty set of contributors")
    tok = np.asarray(tokens, dtype=np.float64)
    stp = np.asarray(steps, dtype=np.float64)
    if np.any(stp <= 0):
        bad = int(np.argmax(stp <= 0))
        raise ValueError(f"contributor {bad} reports {steps[bad]} steps; need >= 1")
    if np.any(tok < 0):
        raise ValueError("token counts must not be negative")
    if mode == "uniform":
        raw = np.ones_like(tok)
    elif mode == "tokens":
        raw = tok
    else:
        raw = tok * tok / stp
    if staleness is not None and discount != 1.0:
        raw = raw * discount ** np.asarray(staleness, dtype=np.float64)
    total = raw.sum()
    if total <= 0:
        raise ValueError(f"all contributors have zero weight under mode {mode!r}")
    return raw / total


def merge_deltas(
    deltas: Sequence[np.ndarray],
    weights: np.ndarray,
    method: str = "mean",
    segments: Sequence[tuple[str, int, int]] | None = None,
    mean_names: Collection[str] = frozenset(),
) -> np.ndarray:
    """Merge flat float32 deltas into one vector.

    ``mean``: weighted average. ``rda``: radial-directional averaging per segment
    (name, offset, length): the merged norm is the weighted mean of the norms and the
    direction is the normalised weighted sum of unit directions, so disagreeing
    learners do not shrink the update. Segments named in ``mean_names`` (embeddings,
    where each step touches few rows) use the weighted mean. ``segments=None`` means
    one segment spanning the whole vector. Weights need not be normalised.
    """
    if method not in MERGE_METHODS:
        raise ValueError(f"unknown merge method {method!r}: choose one of {MERGE_METHODS}")
    if not deltas:
        raise ValueError("cannot merge zero deltas")
    flats = [np.asarray(d, dtype=np.float32).reshape(-1) for d in deltas]
    size = flats[0].size
    if any(f.size != size for f in flats):
        raise ValueError(f"deltas differ in length: {sorted({f.size for f in flats})}")
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != (len(flats),):
        raise ValueError(f"{len(flats)} deltas but {w.size} weights")
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    w = w / w.sum()
    if method == "mean":
        return _mean(flats, w)
    if segments is None:
        segments = [("", 0, size)]
    if sum(length for _, _, length in segments) != size:
        raise ValueError(f"segments cover {sum(s[2] for s in segments)} of {size} values")
    out = np.empty(size, dtype=np.float32)
    for name, offset, length in segments:
        if offset < 0 or offset + length > size:
            raise ValueError(f"segment {name!r} [{offset}, {offset + length}) out of range")
        parts = [f[offset : offset + length] for f in flats]
        merge = _mean if name in mean_names else _rda
        out[offset : offset + length] = merge(parts, w)
    return out


def spreads(
    deltas: Sequence[np.ndarray],
    weights: np.ndarray,
    segments: Sequence[tuple[str, int, int]],
    mean: np.ndarray | None = None,
) -> np.ndarray:
    """How far the learners' deltas cancel in their weighted mean, per segment (name, offset, length):
    the weighted mean of their norms over the norm of their weighted mean, float64, at least 1 (1 where
    every delta points the same way, or only one learner contributed; sqrt(M) for M deltas of
    independent noise, more for deltas that undo one another). RDA's merged segment is as long as
    the mean times this factor; `syncer.lr_feedback=spread` raises the learners' learning rate by it
    instead. ``mean``: their weighted mean where the caller has it already (`merge_deltas(...,
    "mean")`), else computed here."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    w = w / w.sum()
    out = np.ones(len(segments))
    for i, (_, offset, length) in enumerate(segments):
        parts = [np.asarray(d, dtype=np.float32).reshape(-1)[offset : offset + length] for d in deltas]
        merged = _mean(parts, w) if mean is None else mean.reshape(-1)[offset : offset + length]
        norm = float(np.linalg.norm(merged))
        if norm > 0:
            out[i] = max(float(w @ np.array([np.linalg.norm(part) for part in parts])) / norm, 1.0)
    return out


def _mean(parts: Sequence[np.ndarray], w: np.ndarray) -> np.ndarray:
    """Weighted sum of float32 vectors; ``w`` sums to 1."""
    out = np.zeros(parts[0].shape, dtype=np.float32)
    for weight, part in zip(w, parts, strict=True):
        out += np.float32(weight) * part
    return out


def _rda(parts: Sequence[np.ndarray], w: np.ndarray) -> np.ndarray:
    """RDA of one segment, one float32 vector per learner; ``w`` sums to 1."""
    norms = np.array([float(np.linalg.norm(part)) for part in parts])
    radius = float(w @ norms)
    direction = np.zeros(parts[0].shape, dtype=np.float32)
    for weight, norm, part in zip(w, norms, parts, strict=True):
        # A zero delta has no direction: it lowers the mean norm but adds no direction.
        if norm > 0:
            direction += np.float32(weight / norm) * part
    length = float(np.linalg.norm(direction))
    if length == 0:
        # No learner moved, or their directions cancel exactly: no move either.
        return np.zeros_like(direction)
    return direction * np.float32(radius / length)
