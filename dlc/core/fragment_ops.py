"""Fragments read and written on the device: one jitted function each way, compiled once.

A learner sends fragment p as `encode(anchor[p] - theta[p])` and takes a merged fragment back by
overwriting theta[p]. Done on the host, each costs a round trip of the fragment and, worse, a wait
for the step in flight. Here both are jitted functions dispatched after the step like the step
itself:

- `extract(params, anchor_M, table)` gathers fragment p out of the parameters, subtracts it
  from its anchor and encodes the difference with the run's codec (bf16 bits, or int4/int8 codes
  and one scale per block); the result is read on the host later, by whoever sends it;
- `swap(params, table, value_M, ref_M, a, b)` writes `value + a * theta - b * ref` into
  fragment p, donating the parameters, so the adoption modes (replace, mix, rebase) are one
  function and the update happens in place.

Every fragment is padded to the same length M and named by a table, so neither function is
compiled more than once, whatever fragment it gets. Two layouts of that table:

- `windows` (on CPU): for each slot (a leaf's k-th piece in a fragment), a window of the leaf as
  wide as the slot's widest piece, of which the table marks fragment p's part. The functions read
  and write those windows, never a copy of the whole model: on one core an extraction followed by
  a write, a tiny learner's step boundary, costs 227 us of CPU against 568 with `concat`.
- `concat` (on GPU): an index vector into the concatenation of every parameter. The copies are a
  few fused kernels there; windows, a kernel or more per slot, have not been measured on a GPU.
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


def leaf_names(params: Params) -> list[str]:
    """The "a/b/c" name of every leaf, in `jax.tree_util.tree_leaves` order."""
    paths, _ = jax.tree_util.tree_flatten_with_path(params)
    return ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in paths]


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
    """A parameter tree's leaves, in `jax.tree_util.tree_leaves` order, as both layouts see them."""

    index: dict[str, int]  # "a/b/c" name -> position
    sizes: list[int]
    shapes: list[tuple[int, ...]]
    dtypes: list[Any]
    treedef: Any

    @classmethod
    def of(cls, like: Params) -> _Leaves:
        leaves = jax.tree_util.tree_leaves(like)
        return cls(
            {name: i for i, name in enumerate(leaf_names(like))},
            [int(np.prod(np.shape(x))) for x in leaves],
            [np.shape(x) for x in leaves],
            [jnp.asarray(x).dtype for x in leaves],
            jax.tree_util.tree_structure(like),
        )

    def tree(self, flats: list[jax.Array]) -> Params:
        """The tree of these leaves from their flat values, in their shapes and dtypes."""
        leaves = [
            f.reshape(shape).astype(dtype) for f, shape, dtype in zip(flats, self.shapes, self.dtypes, strict=True)
        ]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _windowed(
    plan: FragmentPlan, like: Params, M: int, codec: str, block_size: int
) -> tuple[list[np.ndarray], Any, Any]:
    """Per-fragment tables and the two functions, reading and writing windows of the leaves.

    Fragment p's k-th piece of a leaf is that leaf's slot k: a window as wide as the slot's widest
    piece in any fragment. Row k of p's table gives where p's piece starts in the leaf, where in
    the fragment's vector, and its length (0: p has none).
    """
    leaves = _Leaves.of(like)
    pieces: list[dict[tuple[int, int], tuple[int, int, int]]] = []  # per fragment: slot -> piece
    for p in range(plan.num_fragments):
        mine, seen = {}, [0] * len(leaves.sizes)
        for span in plan.spans(p):
            i = leaves.index[span.name]
            mine[(i, seen[i])] = (span.start, span.offset, span.length)
            seen[i] += 1
        pieces.append(mine)
    slots = sorted({slot for mine in pieces for slot in mine})
    widths = [max(mine[slot][2] for mine in pieces if slot in mine) for slot in slots]
    tables = [np.array([mine.get(slot, (0, 0, 0)) for slot in slots], np.int32) for mine in pieces]
    pad = max(widths)  # the fragment vectors' margin: no window reaches past it

    def windows(table: jax.Array) -> Any:
        """Per slot: its leaf and width, the window's start in the leaf, where the window's values
        sit in a fragment vector padded by `pad` on both sides, and which of them are the piece's."""
        for k, ((i, _), width) in enumerate(zip(slots, widths, strict=True)):
            start, at, length = table[k, 0], table[k, 1], table[k, 2]
            begin = jnp.minimum(start, leaves.sizes[i] - width)  # the window ends inside the leaf
            offset = start - begin
            io = jnp.arange(width)
            yield i, width, begin, at - offset + pad, (io >= offset) & (io < offset + length)

    def extract(params: Params, anchor_M: jax.Array, table: jax.Array) -> tuple[jax.Array, ...]:
        flats = [x.reshape(-1).astype(jnp.float32) for x in jax.tree_util.tree_leaves(params)]
        theta = jnp.zeros(M + 2 * pad, jnp.float32)
        for i, width, begin, at, mine in windows(table):
            piece = jax.lax.dynamic_slice(flats[i], (begin,), (width,))
            here = jax.lax.dynamic_slice(theta, (at,), (width,))
            theta = jax.lax.dynamic_update_slice(theta, jnp.where(mine, piece, here), (at,))
        theta_M = theta[pad : pad + M]
        payload, scales = encode_on_device(codec, block_size, anchor_M - theta_M)
        return payload, scales, theta_M

    def swap(
        params: Params, table: jax.Array, value_M: jax.Array, ref_M: jax.Array, a: jax.Array, b: jax.Array
    ) -> Params:
        flats = [x.reshape(-1) for x in jax.tree_util.tree_leaves(params)]
        margin = jnp.zeros(pad, jnp.float32)
        value, ref = jnp.concatenate([margin, value_M, margin]), jnp.concatenate([margin, ref_M, margin])
        for i, width, begin, at, mine in windows(table):
            old = jax.lax.dynamic_slice(flats[i], (begin,), (width,)).astype(jnp.float32)
            v, r = jax.lax.dynamic_slice(value, (at,), (width,)), jax.lax.dynamic_slice(ref, (at,), (width,))
            new = jnp.where(mine, v + a * old - b * r, old).astype(leaves.dtypes[i])
            flats[i] = jax.lax.dynamic_update_slice(flats[i], new, (begin,))
        return leaves.tree(flats)

    return tables, extract, swap


def _concatenated(
    plan: FragmentPlan, like: Params, M: int, codec: str, block_size: int
) -> tuple[list[np.ndarray], Any, Any]:
    """Per-fragment index vectors into the concatenation of every parameter (padding points one
    past the end: gathered as zero, never written) and the two functions, which concatenate."""
    leaves = _Leaves.of(like)
    firsts = np.cumsum([0, *leaves.sizes[:-1]]).tolist()  # each leaf's first index in the concatenation
    total = sum(leaves.sizes)
    indices = []
    for p in range(plan.num_fragments):
        parts = [np.zeros(0, np.int32)]
        for span in plan.spans(p):
            begin = firsts[leaves.index[span.name]] + span.start
            parts.append(np.arange(begin, begin + span.length, dtype=np.int32))
        flat = np.concatenate(parts)
        index = np.full(M, total, dtype=np.int32)
        index[: flat.size] = flat
        indices.append(index)
    cuts = np.cumsum(leaves.sizes)[:-1].tolist()

    def concat(params: Params) -> jax.Array:
        return jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in jax.tree_util.tree_leaves(params)])

    def extract(params: Params, anchor_M: jax.Array, index_M: jax.Array) -> tuple[jax.Array, ...]:
        theta_M = concat(params).at[index_M].get(mode="fill", fill_value=0.0)
        payload, scales = encode_on_device(codec, block_size, anchor_M - theta_M)
        return payload, scales, theta_M

    def swap(
        params: Params, index_M: jax.Array, value_M: jax.Array, ref_M: jax.Array, a: jax.Array, b: jax.Array
    ) -> Params:
        flat = concat(params)
        theta_M = flat.at[index_M].get(mode="fill", fill_value=0.0)
        flat = flat.at[index_M].set(value_M + a * theta_M - b * ref_M, mode="drop")
        return leaves.tree(jnp.split(flat, cuts))

    return indices, extract, swap


LAYOUTS = {"windows": _windowed, "concat": _concatenated}


class FragmentOps:
    """The two device functions of one learner, for one fragment plan and one codec up.

    `layout`: how they find a fragment's values (see the module doc); None picks by the device.
    """

    def __init__(
        self,
        plan: FragmentPlan,
        like: Params,
        codec: str,
        block_size: int,
        device: Any = None,
        layout: str | None = None,
    ) -> None:
        self.plan = plan
        self.codec = get_codec(codec, block_size)
        self.codec_name, self.block_size = codec, block_size
        self.device = device or jax.devices()[0]
        self.sizes = [plan.size(p) for p in range(plan.num_fragments)]
        # A multiple of the block (and even, for int4 pairs) so the codes of a block never straddle.
        quantum = block_size if codec in ("int4", "int8") else 2
        self.M = -(-max(self.sizes) // quantum) * quantum
        self.on_host = self.device.platform == "cpu"  # vectors stay on the host: `to_device`
        self.layout = layout or ("windows" if self.on_host else "concat")
        tables, extract, swap = LAYOUTS[self.layout](plan, like, self.M, codec, block_size)
        self.tables = [self.put(table) for table in tables]  # each fragment's argument to both
        self.extract = jax.jit(extract)
        self.swap = jax.jit(swap, donate_argnums=(0,))
        self._zeros = self.put(np.zeros(self.M, np.float32))
        self._extract: Any = None  # the compiled functions: `compile`
        self._swap: Any = None
        self._compiling = threading.Lock()  # a learner compiles in a thread of its own

    def compile(self, params: Params) -> None:
        """Compile both functions for these parameters now (or load them from the persistent cache),
        once: every fragment and every later call runs these executables."""
        with self._compiling:
            if self._swap is None:
                vector, table, scalar = self._zeros, self.tables[0], np.float32(0)
                self._extract = self.extract.lower(params, vector, table).compile()
                self._swap = self.swap.lower(params, table, vector, vector, scalar, scalar).compile()

    # -- host <-> device ----------------------------------------------------------------------

    def put(self, x: np.ndarray) -> jax.Array:
        """A host array on this learner's device (committed, as every input of the jitted functions)."""
        return jax.device_put(x, self.device)

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
        `device_put` costs tens of microseconds of Python (`bench/RESULTS.md`).
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

    def to_host(self, p: int, vector_M: jax.Array) -> np.ndarray:
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

    def push(self, params: Params, p: int, anchor_M: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Dispatch the extraction of fragment p; its outputs start copying to the host at once."""
        if self._swap is None:
            self.compile(params)
        payload, scales, theta = self._extract(params, anchor_M, self.tables[p])
        payload.copy_to_host_async()
        scales.copy_to_host_async()
        return payload, scales, theta

    def write(
        self, params: Params, p: int, value_M: jax.Array, ref_M: jax.Array | None = None, a: float = 0.0, b: float = 0.0
    ) -> Params:
        """Dispatch `theta[p] <- value + a * theta[p] - b * ref`; the old parameters are donated."""
        if self._swap is None:
            self.compile(params)
        ref = self._zeros if ref_M is None else ref_M
        return self._swap(params, self.tables[p], value_M, ref, np.float32(a), np.float32(b))
