"""Balanced tensor fragmentation and the staggered sync schedule.

The parameters (a flat ``dict[str, np.ndarray]``) are cut into P disjoint fragments of
about N/P values each, so each sync moves a similar amount of data. Tensors are placed
largest first, each into the currently smallest fragment; tensors too big for that to
balance are cut along their first axis into row ranges (1-D and scalar tensors never
are). A fragment travels as one flat float32 vector: the concatenation of its pieces in
(name, row) order.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

# Cap divisors tried in turn: the first cap is N/P, then smaller ones. With every piece
# at most N/(P*d), greedy placement ends each fragment below N/P * (1 + 1/d), so the
# last divisor bounds the imbalance by 9/8 whenever the tensors can be cut that finely.
_CAP_DIVISORS = (1, 2, 3, 4, 6, 8)


class Piece(NamedTuple):
    """Rows ``[row_start, row_stop)`` along the first axis of one tensor."""

    name: str
    row_start: int
    row_stop: int


class Segment(NamedTuple):
    """Where one piece lies in the flat fragment vector."""

    name: str
    offset: int
    length: int


class Span(NamedTuple):
    """Where one piece lies among its tensor's flat values (from `start`) and in the flat fragment
    vector (from `offset`)."""

    name: str
    start: int
    offset: int
    length: int


def _rows(shape: tuple[int, ...]) -> int:
    # A scalar is one row of one value.
    return shape[0] if shape else 1


def _row_size(shape: tuple[int, ...]) -> int:
    return math.prod(shape[1:])


def shapes_of(params: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a parameter dict."""
    return {name: tuple(np.shape(value)) for name, value in params.items()}


@dataclass(frozen=True)
class FragmentPlan:
    """Which rows of which tensors form each fragment; equal plans compare equal."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    fragments: tuple[tuple[Piece, ...], ...]
    _shape_of: dict[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_shape_of", dict(self.shapes))
        if len(self._shape_of) != len(self.shapes):
            raise ValueError("fragment plan: a tensor name appears twice in shapes")
        if not self.fragments:
            raise ValueError("fragment plan: needs at least one fragment")
        covered: dict[str, list[tuple[int, int]]] = {n: [] for n in self._shape_of}
        for pieces in self.fragments:
            for name, start, stop in pieces:
                if name not in covered:
                    raise ValueError(f"fragment plan: unknown tensor {name!r}")
                covered[name].append((start, stop))
        for name, ranges in covered.items():
            # The pieces of a tensor must tile its rows exactly once.
            expected = 0
            for start, stop in sorted(ranges):
                if start != expected or stop < start:
                    raise ValueError(f"fragment plan: rows of {name!r} not tiled")
                expected = stop
            if expected != _rows(self._shape_of[name]) or not ranges:
                raise ValueError(f"fragment plan: rows of {name!r} not tiled")

    @classmethod
    def build(
        cls,
        shapes: Mapping[str, Sequence[int]],
        num_fragments: int,
        max_imbalance: float = 1.2,
    ) -> FragmentPlan:
        """Plan P fragments, the largest at most about ``max_imbalance * N/P``.

        Tries cutting big tensors at N/P first and at finer caps only while the
        largest fragment is above the bound, so tensors are cut as little as needed.
        Deterministic: the result depends only on the shapes and P.
        """
        if num_fragments < 1:
            raise ValueError(f"num_fragments={num_fragments} must be at least 1")
        if not shapes:
            raise ValueError("cannot fragment an empty parameter dict")
        named = tuple(sorted((n, tuple(int(d) for d in s)) for n, s in shapes.items()))
        total = sum(_rows(s) * _row_size(s) for _, s in named)
        target = total / num_fragments
        best: tuple[int, int, list[list[Piece]]] | None = None
        for divisor in _CAP_DIVISORS:
            assignment = _assign(named, num_fragments, target / divisor)
            if any(not pieces for pieces in assignment):
                continue
            sizes = [_pieces_size(dict(named), pieces) for pieces in assignment]
            key = (max(sizes), sum(len(pieces) for pieces in assignment))
            if best is None or key < best[:2]:
                best = (*key, assignment)
            if max(sizes) <= max_imbalance * target:
                break
        if best is None:
            raise ValueError(
                f"num_fragments={num_fragments} is more than the {len(named)} tensors "
                "can fill even when cut by rows: lower num_fragments"
            )
        fragments = tuple(tuple(_coalesce(pieces)) for pieces in best[2])
        return cls(shapes=named, fragments=fragments)

    @property
    def num_fragments(self) -> int:
        """P, the number of fragments."""
        return len(self.fragments)

    @property
    def total_size(self) -> int:
        """N, the number of parameter values."""
        return sum(_rows(s) * _row_size(s) for _, s in self.shapes)

    def pieces(self, p: int) -> tuple[Piece, ...]:
        """The pieces of fragment p, in the order of its flat vector."""
        return self.fragments[p]

    def size(self, p: int) -> int:
        """Number of values in fragment p."""
        return _pieces_size(self._shape_of, self.fragments[p])

    def segments(self, p: int) -> list[Segment]:
        """(name, offset, length) of each piece within fragment p's flat vector."""
        return [Segment(span.name, span.offset, span.length) for span in self.spans(p)]

    def spans(self, p: int) -> list[Span]:
        """Each piece of fragment p, in its tensor's flat values and in the fragment's flat vector."""
        out: list[Span] = []
        offset = 0
        for name, start, stop in self.fragments[p]:
            row = _row_size(self._shape_of[name])
            out.append(Span(name, start * row, offset, (stop - start) * row))
            offset += (stop - start) * row
        return out

    def gather(self, params: Mapping[str, np.ndarray], p: int) -> np.ndarray:
        """Fragment p of ``params`` as a new flat float32 vector."""
        parts = []
        for name, start, stop in self.fragments[p]:
            arr = self._checked(params, name)
            rows = arr.reshape(1) if arr.ndim == 0 else arr[start:stop]
            parts.append(np.asarray(rows, dtype=np.float32).reshape(-1))
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(parts)

    def scatter(self, params: MutableMapping[str, np.ndarray], p: int, vector: np.ndarray) -> None:
        """Write the flat vector of fragment p back into the arrays of ``params``."""
        vector = np.asarray(vector)
        if vector.shape != (self.size(p),):
            raise ValueError(f"fragment {p} holds {self.size(p)} values, got shape {vector.shape}")
        for (name, start, stop), (_, offset, length) in zip(self.fragments[p], self.segments(p), strict=True):
            arr = self._checked(params, name)
            chunk = vector[offset : offset + length]
            if arr.ndim == 0:
                arr[()] = chunk[0]
            else:
                # Indexing the first axis writes in place, contiguous or not.
                arr[start:stop] = chunk.reshape((stop - start, *arr.shape[1:]))

    def assemble(self, vectors: Sequence[np.ndarray], like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """New float32 arrays shaped like ``like``, filled from fragment p's vector for every p."""
        params = {name: np.empty(np.shape(value), dtype=np.float32) for name, value in like.items()}
        for p, vector in enumerate(vectors):
            self.scatter(params, p, vector)
        return params

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description; ``from_dict`` rebuilds an equal plan."""
        return {
            "shapes": {name: list(shape) for name, shape in self.shapes},
            "fragments": [[list(piece) for piece in pieces] for pieces in self.fragments],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FragmentPlan:
        """Inverse of ``to_dict``; validates that the pieces tile every tensor."""
        shapes = tuple(sorted((n, tuple(s)) for n, s in data["shapes"].items()))
        fragments = tuple(tuple(Piece(str(n), int(a), int(b)) for n, a, b in pieces) for pieces in data["fragments"])
        return cls(shapes=shapes, fragments=fragments)

    def fingerprint(self) -> str:
        """A short stable hash; learners and the syncer compare it before training."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _checked(self, params: Mapping[str, np.ndarray], name: str) -> np.ndarray:
        if name not in params:
            raise KeyError(f"parameter {name!r} of the fragment plan is missing")
        arr = params[name]
        if tuple(np.shape(arr)) != self._shape_of[name]:
            raise ValueError(f"parameter {name!r} has shape {np.shape(arr)}, plan expects {self._shape_of[name]}")
        return arr


def _pieces_size(shape_of: Mapping[str, tuple[int, ...]], pieces: Sequence[Piece]) -> int:
    return sum((b - a) * _row_size(shape_of[n]) for n, a, b in pieces)


def _split(name: str, shape: tuple[int, ...], cap: float) -> list[Piece]:
    """Cut a tensor larger than ``cap`` into near-equal row ranges of at most ~cap."""
    rows, size = _rows(shape), _rows(shape) * _row_size(shape)
    if len(shape) < 2 or size <= cap or rows < 2:
        return [Piece(name, 0, rows)]
    count = min(rows, math.ceil(size / cap))
    bounds = [i * rows // count for i in range(count + 1)]
    return [Piece(name, bounds[i], bounds[i + 1]) for i in range(count)]


def _assign(shapes: tuple[tuple[str, tuple[int, ...]], ...], num_fragments: int, cap: float) -> list[list[Piece]]:
    """Largest piece first into the smallest fragment (ties: lowest index)."""
    shape_of = dict(shapes)
    pieces = [piece for name, shape in shapes for piece in _split(name, shape, cap)]
    pieces.sort(key=lambda pc: (-_pieces_size(shape_of, [pc]), pc.name, pc.row_start))
    heap = [(0, p) for p in range(num_fragments)]
    out: list[list[Piece]] = [[] for _ in range(num_fragments)]
    for piece in pieces:
        load, p = heapq.heappop(heap)
        out[p].append(piece)
        heapq.heappush(heap, (load + _pieces_size(shape_of, [piece]), p))
    return out


def _coalesce(pieces: list[Piece]) -> list[Piece]:
    """Sort by (name, rows) and join adjacent row ranges of the same tensor."""
    out: list[Piece] = []
    for piece in sorted(pieces, key=lambda pc: (pc.name, pc.row_start)):
        if out and out[-1].name == piece.name and out[-1].row_stop == piece.row_start:
            out[-1] = Piece(piece.name, out[-1].row_start, piece.row_stop)
        else:
            out.append(piece)
    return out
