"""Codecs for outer gradients sent learner -> syncer.

``none`` sends float32, ``bf16`` rounds to bfloat16 (nearest, ties to even), ``int8``
and ``int4`` quantise blocks of ``block_size`` values symmetrically around zero with one
float32 scale per block (the quantisation step, absmax / levels). int4 packs two values
per byte. Everything decodes to float32.

A block holding NaN or Inf gets a NaN scale and decodes to all NaN, so the syncer's
finiteness check still sees a bad push instead of silently quantised garbage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

CODECS: tuple[str, ...] = ("none", "bf16", "int8", "int4")


@dataclass(frozen=True)
class Encoded:
    """One encoded vector: what crosses the wire, plus what is needed to decode it."""

    codec: str
    length: int
    payload: np.ndarray
    scales: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    block_size: int = 0

    @property
    def nbytes(self) -> int:
        """Exact bytes of the arrays sent: payload plus scales."""
        return int(self.payload.nbytes + self.scales.nbytes)


class Codec(ABC):
    """Encodes a flat float vector and decodes it back to float32."""

    name: str = ""
    payload_dtype: np.dtype = np.dtype(np.float32)

    @abstractmethod
    def encode(self, x: np.ndarray) -> Encoded:
        """Encode the values of ``x`` (flattened)."""

    @abstractmethod
    def decode(self, enc: Encoded) -> np.ndarray:
        """Decode to a new flat float32 vector of ``enc.length`` values."""

    @abstractmethod
    def encoded_nbytes(self, length: int) -> int:
        """Bytes that ``encode`` of ``length`` values will produce."""

    def _check(self, enc: Encoded, payload_len: int, scales_len: int = 0) -> None:
        if enc.codec != self.name:
            raise ValueError(f"codec {self.name!r} cannot decode a {enc.codec!r} payload")
        if not isinstance(enc.payload, np.ndarray) or not isinstance(enc.scales, np.ndarray):
            raise ValueError(f"{self.name} payload and scales must be numpy arrays")
        if enc.payload.shape != (payload_len,) or enc.scales.shape != (scales_len,):
            raise ValueError(
                f"{self.name} payload of {enc.length} values needs {payload_len} "
                f"payload and {scales_len} scale entries, got {enc.payload.shape} and "
                f"{enc.scales.shape}"
            )
        if enc.payload.dtype != self.payload_dtype or enc.scales.dtype != np.float32:
            raise ValueError(
                f"{self.name} payload must be {self.payload_dtype} with float32 scales, "
                f"got {enc.payload.dtype} and {enc.scales.dtype}"
            )


def _flat32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).reshape(-1)


class Float32Codec(Codec):
    """No compression: 4 bytes per value."""

    name = "none"

    def encode(self, x: np.ndarray) -> Encoded:
        flat = _flat32(x).copy()
        return Encoded(self.name, flat.size, flat)

    def decode(self, enc: Encoded) -> np.ndarray:
        self._check(enc, enc.length)
        return np.array(enc.payload, dtype=np.float32)

    def encoded_nbytes(self, length: int) -> int:
        return 4 * length


class BFloat16Codec(Codec):
    """bfloat16, round to nearest: 2 bytes per value, relative error at most 2^-8."""

    name = "bf16"
    payload_dtype = np.dtype(np.uint16)

    def encode(self, x: np.ndarray) -> Encoded:
        # Carried as raw uint16 bits so unpickling needs no custom dtype registered.
        bits = _flat32(x).astype(ml_dtypes.bfloat16).view(np.uint16)
        return Encoded(self.name, bits.size, bits)

    def decode(self, enc: Encoded) -> np.ndarray:
        self._check(enc, enc.length)
        return enc.payload.view(ml_dtypes.bfloat16).astype(np.float32)

    def encoded_nbytes(self, length: int) -> int:
        return 2 * length


class BlockIntCodec(Codec):
    """Symmetric blockwise integers: levels -q..q with q = 2^(bits-1) - 1."""

    def __init__(self, bits: int, block_size: int = 64) -> None:
        if bits not in (4, 8):
            raise ValueError(f"bits={bits}: only 4 and 8 are supported")
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be at least 1")
        self.bits = bits
        self.block_size = block_size
        self.levels = 2 ** (bits - 1) - 1
        self.name = f"int{bits}"
        self.payload_dtype = np.dtype(np.int8 if bits == 8 else np.uint8)

    def _num_blocks(self, length: int) -> int:
        return -(-length // self.block_size)

    def _payload_len(self, length: int) -> int:
        return length if self.bits == 8 else (length + 1) // 2

    def encode(self, x: np.ndarray) -> Encoded:
        flat = _flat32(x)
        n, bs = flat.size, self.block_size
        padded = np.zeros(self._num_blocks(n) * bs, dtype=np.float32)
        padded[:n] = flat  # zero padding leaves each block's absmax unchanged
        blocks = padded.reshape(-1, bs)
        with np.errstate(invalid="ignore"):
            absmax = np.max(np.abs(blocks), axis=1) if blocks.size else np.zeros(0)
        scales = (absmax / self.levels).astype(np.float32)
        usable = np.isfinite(scales) & (scales > 0)
        scales[~np.isfinite(scales)] = np.nan
        q = np.zeros(blocks.shape, dtype=np.int8)
        # Dividing by the stored float32 step keeps decode(q) * step within step/2.
        ratio = blocks[usable] / scales[usable, None].astype(np.float64)
        q[usable] = np.clip(np.rint(ratio), -self.levels, self.levels).astype(np.int8)
        q = q.reshape(-1)[:n]
        if self.bits == 8:
            payload = q.copy()
        else:
            # Offset binary nibbles: q + 8 is in 1..15; an odd tail pads with 8 (zero).
            nibbles = np.full(2 * self._payload_len(n), 8, dtype=np.uint8)
            nibbles[:n] = (q + 8).astype(np.uint8)
            payload = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
        return Encoded(self.name, n, payload, scales, bs)

    def decode(self, enc: Encoded) -> np.ndarray:
        if enc.block_size != self.block_size and enc.codec == self.name:
            # The block size travels with the payload; decode with the sender's.
            return BlockIntCodec(self.bits, enc.block_size).decode(enc)
        n = enc.length
        self._check(enc, self._payload_len(n), self._num_blocks(n))
        if self.bits == 8:
            q = enc.payload.astype(np.float32)
        else:
            nibbles = np.empty(2 * enc.payload.size, dtype=np.int16)
            nibbles[0::2] = enc.payload & 0x0F
            nibbles[1::2] = enc.payload >> 4
            q = (nibbles[:n] - 8).astype(np.float32)
        steps = np.repeat(enc.scales, self.block_size)[:n]
        with np.errstate(invalid="ignore"):
            # 0 * NaN is NaN: a poisoned block stays visibly poisoned.
            return q * steps

    def encoded_nbytes(self, length: int) -> int:
        return self._payload_len(length) + 4 * self._num_blocks(length)


def get_codec(name: str, block_size: int = 64) -> Codec:
    """The codec called ``name`` (one of ``CODECS``)."""
    if name == "none":
        return Float32Codec()
    if name == "bf16":
        return BFloat16Codec()
    if name == "int8":
        return BlockIntCodec(8, block_size)
    if name == "int4":
        return BlockIntCodec(4, block_size)
    raise ValueError(f"unknown codec {name!r}: choose one of {', '.join(CODECS)}")
