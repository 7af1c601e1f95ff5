"""Fragments read and written on the device: jitted functions compiled once, dispatched after the step.

A learner sends fragment p as `encode(anchor[p] - theta[p])` and takes a merged fragment back by
overwriting theta[p]. Done on the host, each costs a round trip of the fragment and, worse, a wait
for the step in flight. Here both are jitted functions dispatched after the step like the step
itself:

- `extract(leaves, anchor_M, table)` gathers fragment p out of the parameters, subtracts it from
  its anchor and encodes the difference with the run's codec (bf16 bits, or int4/int8 codes and
  one scale per block); the result is read on the host later, by whoever sends it;
- `swap(leaves, table, value_M, ref_M, a, b)` writes `value + a * theta - b * ref` into fragment
  p, donating the leaves it takes, so the adoption modes (replace, mix, rebase) are one function
  and the update happens in place.

Every fragment is padded to the same length M, and where its pieces lie is an argument (`table`),
so no function compiles again whatever fragment it gets. Two layouts:

- `pieces` (on CPU): the functions take only the leaves fragment p has pieces of, and slice those
  pieces. Fragments whose pieces have the same shapes (the tiny recipe's 24 fall into 9 such
  groups) share one compiled pair. A call passes a few arrays and touches a 24th of the model; on
  one core that takes the two functions from 1.5 ms of CPU a step to nothing measurable
  (measured on a 2-core VM), for about a second more of compiling a learner without a cache.
- `concat` (on GPU): one pair for every fragment, taking every leaf; an index vector into the
  concatenation of every parameter. The copies are a few fused kernels there; `pieces` has not
  been measured on a GPU.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dlc.core.codec import Encoded, get_codec
from dlc.core.fragments import FragmentPlan
from dlc.core.model import Params
from dlc.core.sharding import Placement


def leaf_names(tree: Any) -> list[str]:
    """The "a/b/c" name of every leaf, in `jax.tree_util.tree_leaves` order: each step a dict's key, a
    sequence's index or a named tuple's field, so that a tree of tuples and the dicts and lists a
    checkpoint stores it as name their leaves alike."""
    paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [
        "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path) for path, _ in paths
    ]


def encode_on_device(codec: str, block_size: int, x_M: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`dlc.core.codec`'s encodings of `x_M` (length a multiple of the block size), on the device.

    Returns (payload, scales) as the host codec lays them out; the caller cuts the padding off.
    Quotients are rounded in float32 here (float64 on the host), so a value within a rounding
    error of a half step may land on the neighbouring level: still within half a step plus that.
    """
    if codec == "none":
        return x_M, jnp.zeros(0, jnp.float32)
    if codec == "bf16":
        return jax.lax.bitcast_convert_type(x_M.astype(jnp.bfloat16), jnp.uint16), jnp.zeros(0, jnp.float32)
    bits = 8 if codec == "int8" else 4
    levels = 2 ** (bits - 1) - 1
    blocks = x_M.reshape(-1, block_size)
    scales = jnp.max(jnp.abs(blocks), axis=1) / levels
    usable = jnp.isfinite(scales) & (scales > 0)
    scales = jnp.where(jnp.isfinite(scales), scales, jnp.nan)
    safe = jnp.where(usable, scales, 1.0)[:, None]
    q = jnp.where(usable[:, None], jnp.clip(jnp.round(blocks / safe), -levels, levels), 0).astype(jnp.int8)
    q = q.reshape(-1)
    if bits == 8:
        return q, scales
    nibbles = (q + 8).astype(jnp.uint8)
    return nibbles[0::2] | (nibbles[1::2] << 4), scales


class _Leaves(NamedTuple):
    """A parameter tree's leaves, in `jax.tree_util.tree_leaves` order."""

    position: dict[str, int]  # "a/b/c" name -> position (not `index`: a tuple's method)
    sizes: list[int]
    shapes: list[tuple[int, ...]]
    dtypes: list[Any]

    @classmethod
    def of(cls, like: Params) -> _Leaves:
        leaves = jax.tree_util.tree_leaves(like)
        return cls(
            {name: i for i, name in enumerate(leaf_names(like))},
            [int(np.prod(np.shape(x))) for x in leaves],
            [np.shape(x) for x in leaves],
            [jnp.asarray(x).dtype for x in leaves],
        )


class Layout(NamedTuple):
    """How the functions find each fragment: fragment p is served by the pair `functions[group[p]]`,
    called with the leaves `slots[p]` (positions in `tree_leaves` order) and `tables[p]`."""

    functions: list[tuple[Any, Any]]  # (extract, swap) per group
    group: list[int]
    slots: list[tuple[int, ...]]
    tables: list[np.ndarray]


def _by_pieces(plan: FragmentPlan, like: Params, M: int, codec: str, block_size: int) -> Layout:
    """A pair of functions per shape of fragment, taking only the leaves a fragment has pieces of.

    A fragment's shape is the shapes and dtypes of those leaves, in order, and which leaf and how
    many values each of its pieces takes; where each piece starts in its leaf and in the fragment
    vector is its table, a `(pieces, 2)` int32 array. Pieces are put in a canonical order (by leaf
    shape and length) so that fragments of the same make-up share a pair.
    """
    leaves = _Leaves.of(like)

    def canonical(span: Any) -> tuple[Any, ...]:  # its leaf's shape and dtype, its length; ties by place
        i = leaves.position[span.name]
        return (leaves.shapes[i], str(leaves.dtypes[i]), span.length, i, span.start)

    groups: dict[Any, int] = {}
    functions: list[tuple[Any, Any]] = []
    group, slots, tables = [], [], []
    for p in range(plan.num_fragments):
        spans = sorted(plan.spans(p), key=canonical)
        at = [leaves.position[s.name] for s in spans]  # each piece's leaf
        mine = list(dict.fromkeys(at))  # leaves, first seen first
        spec = tuple((mine.index(i), s.length) for i, s in zip(at, spans, strict=True))
        key = (tuple((leaves.shapes[i], str(leaves.dtypes[i])) for i in mine), spec)
        if key not in groups:
            groups[key] = len(functions)
            functions.append(_piece_functions(spec, [leaves.shapes[i] for i in mine], M, codec, block_size))
        group.append(groups[key])
        slots.append(tuple(mine))
        tables.append(np.array([(s.start, s.offset) for s in spans], np.int32).reshape(-1, 2))
    return Layout(functions, group, slots, tables)


def _piece_functions(
    spec: tuple[tuple[int, int], ...], shapes: list[tuple[int, ...]], M: int, codec: str, block_size: int
) -> tuple[Any, Any]:
    """The pair for one shape of fragment: piece k is `spec[k] = (leaf, length)`, starting at
    `table[k, 0]` in that leaf's flat values and at `table[k, 1]` in the fragment vector."""

    def extract(leaves: list[jax.Array], anchor_M: jax.Array, table: jax.Array) -> tuple[jax.Array, ...]:
        flats = [x.reshape(-1).astype(jnp.float32) for x in leaves]
        theta_M = jnp.zeros(M, jnp.float32)
        for k, (j, n) in enumerate(spec):
            piece = jax.lax.dynamic_slice(flats[j], (table[k, 0],), (n,))
            theta_M = jax.lax.dynamic_update_slice(theta_M, piece, (table[k, 1],))
        payload, scales = encode_on_device(codec, block_size, anchor_M - theta_M)
        return payload, scales, theta_M

    def swap(
        leaves: list[jax.Array], table: jax.Array, value_M: jax.Array, ref_M: jax.Array, a: jax.Array, b: jax.Array
    ) -> list[jax.Array]:
        flats = [x.reshape(-1) for x in leaves]
        for k, (j, n) in enumerate(spec):
            start, at = table[k, 0], table[k, 1]
            old = jax.lax.dynamic_slice(flats[j], (start,), (n,)).astype(jnp.float32)
            value, ref = jax.lax.dynamic_slice(value_M, (at,), (n,)), jax.lax.dynamic_slice(ref_M, (at,), (n,))
            new = (value + a * old - b * ref).astype(flats[j].dtype)
            flats[j] = jax.lax.dynamic_update_slice(flats[j], new, (start,))
        return [f.reshape(shape) for f, shape in zip(flats, shapes, strict=True)]

    return extract, swap


def _concatenated(plan: FragmentPlan, like: Params, M: int, codec: str, block_size: int) -> Layout:
    """One pair for every fragment, taking every leaf: per-fragment index vectors into the
    concatenation of every parameter (padding points one past the end: gathered as zero, never
    written)."""
    info = _Leaves.of(like)
    firsts = np.cumsum([0, *info.sizes[:-1]]).tolist()  # each leaf's first index in the concatenation
    total = sum(info.sizes)
    indices = []
    for p in range(plan.num_fragments):
        parts = [np.zeros(0, np.int32)]
        for span in plan.spans(p):
            begin = firsts[info.position[span.name]] + span.start
            parts.append(np.arange(begin, begin + span.length, dtype=np.int32))
        flat = np.concatenate(parts)
        index = np.full(M, total, dtype=np.int32)
        index[: flat.size] = flat
        indices.append(index)
    cuts = np.cumsum(info.sizes)[:-1].tolist()

    def concat(leaves: list[jax.Array]) -> jax.Array:
        return jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in leaves])

    def extract(leaves: list[jax.Array], anchor_M: jax.Array, index_M: jax.Array) -> tuple[jax.Array, ...]:
        theta_M = concat(leaves).at[index_M].get(mode="fill", fill_value=0.0)
        payload, scales = encode_on_device(codec, block_size, anchor_M - theta_M)
        return payload, scales, theta_M

    def swap(
        leaves: list[jax.Array], index_M: jax.Array, value_M: jax.Array, ref_M: jax.Array, a: jax.Array, b: jax.Array
    ) -> list[jax.Array]:
        flat = concat(leaves)
        theta_M = flat.at[index_M].get(mode="fill", fill_value=0.0)
        flat = flat.at[index_M].set(value_M + a * theta_M - b * ref_M, mode="drop")
        return [
            f.reshape(shape).astype(dtype)
            for f, shape, dtype in zip(jnp.split(flat, cuts), info.shapes, info.dtypes, strict=True)
        ]

    every = tuple(range(len(info.sizes)))
    return Layout([(extract, swap)], [0] * plan.num_fragments, [every] * plan.num_fragments, indices)


LAYOUTS = {"pieces": _by_pieces, "concat": _concatenated}


class FragmentOps:
    """One learner's device functions, extraction and write, for one fragment plan and one codec up:
    a pair per group of fragments (`groups`), which `push` and `write` pick by fragment.

    `layout`: how they find a fragment's values (see the module doc); None picks by the device.
    """

    def __init__(
        self,
        plan: FragmentPlan,
        like: Params,
        codec: str,
        block_size: int,
        layout: str | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.plan = plan
        self.codec = get_codec(codec, block_size)
        self.codec_name, self.block_size = codec, block_size
        # The learner's devices (default: this process's first). On several (`placement.sharded`),
        # vectors are replicated on them, and the written leaves keep the parameters' sharding.
        self.placement = placement or Placement()
        self.device = self.placement.device
        self.sizes = [plan.size(p) for p in range(plan.num_fragments)]
        # A multiple of the block (and even, for int4 pairs) so the codes of a block never straddle.
        quantum = block_size if codec in ("int4", "int8") else 2
        self.M = -(-max(self.sizes) // quantum) * quantum
        self.on_host = self.device.platform == "cpu"  # vectors stay on the host: `to_device`
        self.layout = layout or ("pieces" if self.on_host else "concat")
        found = LAYOUTS[self.layout](plan, like, self.M, codec, block_size)
        self.treedef = jax.tree_util.tree_structure(like)
        self.group, self.slots = found.group, found.slots
        self.tables = [self.put(table) for table in found.tables]  # each fragment's argument to both
        self.functions = found.functions
        self.extract = [jax.jit(extract) for extract, _ in found.functions]
        self.swap = [jax.jit(swap, donate_argnums=(0,)) for _, swap in found.functions]
        self._zeros = self.put(np.zeros(self.M, np.float32))
        self._extract: list[Any] = []  # the compiled functions, per group: `compile`
        self._swap: list[Any] = []
        self._compiling = threading.Lock()  # a learner compiles in a thread of its own

    @property
    def groups(self) -> int:
        """How many pairs of functions serve the fragments (each compiled once)."""
        return len(self.extract)

    def compile(self, params: Params) -> None:
        """Compile every pair for these parameters now (or load them from the persistent cache),
        once: every later call runs these executables."""
        with self._compiling:
            if self._swap:
                return
            leaves = jax.tree_util.tree_leaves(params)
            vector, scalar = self._zeros, np.float32(0)
            extracts, swaps = [], []
            for g, (extract, swap) in enumerate(zip(self.extract, self.swap, strict=True)):
                p = self.group.index(g)  # the first fragment it serves
                mine, table = [leaves[i] for i in self.slots[p]], self.tables[p]
                if self.placement.sharded:  # fixed layouts in and out
                    raw_extract, raw_swap = self.functions[g]
                    extract = jax.jit(raw_extract, out_shardings=self.placement.replicated)
                    swap = jax.jit(raw_swap, donate_argnums=(0,), out_shardings=[x.sharding for x in mine])
                extracts.append(extract.lower(mine, vector, table).compile())
                swaps.append(swap.lower(mine, table, vector, vector, scalar, scalar).compile())
            self._extract, self._swap = extracts, swaps

    # -- host <-> device ----------------------------------------------------------------------

    def put(self, x: np.ndarray) -> jax.Array:
        """A host array on this learner's device (committed, as every input of the jitted functions);
        on several devices, whole on each."""
        return jax.device_put(x, self.placement.replicated)

    def pad(self, p: int, vector: np.ndarray) -> np.ndarray:
        """Fragment p's flat float32 vector, zero-padded to M."""
        flat = np.asarray(vector, dtype=np.float32).reshape(-1)
        if flat.size != self.sizes[p]:
            raise ValueError(f"fragment {p} has {self.sizes[p]} values, not {flat.size}")
        out = np.zeros(self.M, np.float32)
        out[: flat.size] = flat
        return out

    def to_device(self, p: int, vector: np.ndarray) -> jax.Array | np.ndarray:
        """Fragment p's host vector, padded, ready to pass to both functions.

        On a GPU it goes to the device now, from the thread that calls this (`device_put` returns
        before it lands). On CPU the device's memory is the host's: the padded vector itself is
        passed, and the functions' call copies it in, in C++, for a few microseconds, where
        `device_put` costs tens of microseconds of Python (measured on a 2-core VM).
        """
        padded = self.pad(p, vector)
        return padded if self.on_host else self.put(padded)

    def staged(self, p: int, vector: jax.Array | np.ndarray) -> jax.Array | np.ndarray:
        """`vector` as the functions take it: itself if `to_device` made it, else through `to_device`."""
        if isinstance(vector, jax.Array):
            return vector
        if self.on_host and vector.dtype == np.float32 and vector.shape == (self.M,):
            return vector
        return self.to_device(p, vector)

    def to_host(self, p: int, vector_M: jax.Array | np.ndarray) -> np.ndarray:
        """Fragment p's values of a padded device vector, on the host (waits for it)."""
        return np.asarray(vector_M)[: self.sizes[p]].copy()

    def encoded(self, p: int, payload: Any, scales: Any) -> Encoded:
        """The host `Encoded` of fragment p from `extract`'s outputs (waits for them)."""
        n = self.sizes[p]
        payload, scales = np.asarray(payload), np.asarray(scales)
        if self.codec_name in ("int4", "int8"):
            plen = n if self.codec_name == "int8" else (n + 1) // 2
            blocks = -(-n // self.block_size)
            return Encoded(self.codec_name, n, payload[:plen].copy(), scales[:blocks].copy(), self.block_size)
        return Encoded(self.codec_name, n, payload[:n].copy())

    def nbytes(self, p: int) -> int:
        return self.codec.encoded_nbytes(self.sizes[p])

    # -- the two operations -------------------------------------------------------------------

    def push(self, params: Params, p: int, anchor_M: jax.Array | np.ndarray) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Dispatch the extraction of fragment p; its outputs start copying to the host at once."""
        if not self._swap:
            self.compile(params)
        leaves = jax.tree_util.tree_leaves(params)
        mine = [leaves[i] for i in self.slots[p]]
        payload, scales, theta = self._extract[self.group[p]](mine, anchor_M, self.tables[p])
        payload.copy_to_host_async()
        scales.copy_to_host_async()
        return payload, scales, theta

    def write(
        self,
        params: Params,
        p: int,
        value_M: jax.Array | np.ndarray,
        ref_M: jax.Array | np.ndarray | None = None,
        a: float = 0.0,
        b: float = 0.0,
    ) -> Params:
        """Dispatch `theta[p] <- value + a * theta[p] - b * ref`; the leaves it writes are donated."""
        if not self._swap:
            self.compile(params)
        ref = self._zeros if ref_M is None else ref_M
        leaves = jax.tree_util.tree_leaves(params)
        slots = self.slots[p]
        new = self._swap[self.group[p]](
            [leaves[i] for i in slots], self.tables[p], value_M, ref, np.float32(a), np.float32(b)
        )
        for i, leaf in zip(slots, new, strict=True):
            leaves[i] = leaf
        return jax.tree_util.tree_unflatten(self.treedef, leaves)
