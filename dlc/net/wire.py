"""The bytes of a message on the direct channel: every step's messages in a fixed layout, the rest pickled.

A push, a merged fragment and a request cross a channel every learner step. Pickling one walks its
dataclasses and rebuilds each NumPy array through Python-level reduce functions: 90 us to pickle a
push and 62 to unpickle it when the code runs cold, as it does between two training steps, against
24 and 29 for a struct header followed by the arrays' raw bytes, measured on a 2-core VM. A
kind of message registered here (`register`) travels in such a layout: a tag byte, the kind's own
encoding, and its arrays read back with `np.frombuffer` as views of the received bytes. Anything
else, and a registered message whose arrays are not the plain 1-D little-endian ones its layout
holds, is pickled: a pickle starts with its protocol opcode (0x80), never with a tag.

Decoded arrays are read-only views of the message's bytes.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

Parts = Sequence[bytes | memoryview]  # an encoding: header and array buffers, joined when sent

_PICKLE = pickle.PROTO[0]  # the first byte of every pickle of protocol 2 or later
_encoders: dict[type, tuple[int, Callable[[Any], Parts | None]]] = {}
_decoders: dict[int, Callable[[memoryview], Any]] = {}


def register(cls: type, tag: int, encode: Callable[[Any], Parts | None], decode: Callable[[memoryview], Any]) -> None:
    """Send instances of exactly `cls` as `tag` followed by `encode(message)` (None: pickle this one);
    `decode` gets those bytes back, after the tag."""
    if not 0 < tag < 256 or tag == _PICKLE:
        raise ValueError(f"tag {tag} must be a byte other than 0 and {_PICKLE:#x}")
    if _decoders.get(tag, decode) is not decode:
        raise ValueError(f"tag {tag} is taken")
    _encoders[cls] = (tag, encode)
    _decoders[tag] = decode


def dumps(message: Any) -> bytes:
    """The bytes that carry `message`."""
    coder = _encoders.get(type(message))
    if coder is not None:
        tag, encode = coder
        try:
            parts = encode(message)
        except (struct.error, TypeError):  # a field its layout cannot hold (a test's odd message)
            parts = None
        if parts is not None:
            return b"".join([bytes((tag,)), *parts])
    return bytes(ForkingPickler.dumps(message))


def loads(data: bytes) -> Any:
    """The message `dumps` gave `data` for."""
    if not data:
        raise ValueError("an empty message")
    tag = data[0]
    if tag == _PICKLE:
        return pickle.loads(data)
    decode = _decoders.get(tag)
    if decode is None:
        raise ValueError(f"a message of unknown kind {tag}")
    return decode(memoryview(data)[1:])


def plain(array: Any, dtype: np.dtype) -> bool:
    """Whether `array` can go as its raw bytes in a layout that reads it back as 1-D `dtype`."""
    return isinstance(array, np.ndarray) and array.dtype == dtype and array.ndim == 1 and array.flags.c_contiguous


def raw(array: np.ndarray) -> memoryview:
    """The bytes of a `plain` array, without a copy."""
    return array.data.cast("B")  # memoryview(array): numpy's stubs give ndarray __buffer__ from Python 3.12 only


def view(data: memoryview, dtype: np.dtype, count: int, offset: int) -> tuple[np.ndarray, int]:
    """`count` values of `dtype` at `offset` of `data`, and the offset after them; ValueError if
    `data` is too short."""
    end = offset + count * dtype.itemsize
    if end > len(data):
        raise ValueError(f"a message cut short: {len(data)} bytes, its layout needs {end}")
    return np.frombuffer(data, dtype, count, offset), end


def header(layout: struct.Struct, data: memoryview) -> tuple[Any, ...]:
    """The fixed fields at the start of `data`; ValueError if it is too short."""
    if len(data) < layout.size:
        raise ValueError(f"a message cut short: {len(data)} bytes, its header needs {layout.size}")
    return layout.unpack_from(data)
