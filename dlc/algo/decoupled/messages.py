"""What learners and the syncer of Decoupled DiLoCo send each other."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlc.core.codec import CODECS, Encoded, get_codec
from dlc.net import wire


@dataclass(frozen=True)
class FragmentRequest:
    """Syncer -> learner: fragment p's round is open; push p at your next step boundary.

    Carries no payload: the transport counts it as 0 bytes, like every header.
    """

    fragment: int
    version: int  # v_p when the round opened
    sent_at: float
    payload: None = None


@dataclass(frozen=True)
class Push:
    """One outer gradient of one fragment from one learner."""

    learner: int
    fragment: int
    base_version: int
    steps: int
    tokens: int
    seq: int
    payload: Encoded
    sent_at: float
    # The sending process's incarnation of `learner` (0 for its first process, +1 per restart): a
    # new process starts from a peer's state, so its deltas never contain an earlier one's pushes.
    incarnation: int = 0
    # The learner's inner step as it sent this, when the push doubles as its heartbeat: sent at
    # once over an ideal link, and not a re-send (None otherwise: it says nothing of now).
    step: int | None = None


@dataclass(frozen=True)
class MergedFragment:
    """Syncer -> learner: the new global value of fragment p at version v.

    With `base_version` None the payload is the value itself; otherwise it is the difference from
    the value at `base_version`, which the learner must hold (a compressed downlink).
    """

    fragment: int
    version: int
    payload: Encoded
    sent_at: float
    merged: tuple[tuple[int, int], ...] = ()  # (learner, seq) of the pushes merged: their acknowledgement
    base_version: int | None = None
    lr_factors: tuple[float, ...] = ()  # syncer.lr_feedback: one a piece of the fragment (`lr_feedback`)


# -- on the direct channel (`dlc.net.wire`): fixed layouts, little-endian -------------------------

_CODEC_IDS = {name: i for i, name in enumerate(CODECS)}
_PAYLOADS = [np.dtype(get_codec(name).payload_dtype).newbyteorder("<") for name in CODECS]
_SCALES = np.dtype("<f4")
_ENCODED = struct.Struct("<BqqQQ")  # codec, length, block size, payload values, scales
_PUSH = struct.Struct("<qqqqqqqdq?")  # learner .. incarnation, sent_at, step, whether step is given
_MERGED = struct.Struct("<qqdq?QQ")  # fragment, version, sent_at, base version, whether given, pairs, factors
_REQUEST = struct.Struct("<qqd")


def _encoded_parts(enc: Any) -> list[bytes | memoryview] | None:
    codec = _CODEC_IDS.get(enc.codec) if isinstance(enc, Encoded) else None
    if codec is None or not wire.plain(enc.payload, _PAYLOADS[codec]) or not wire.plain(enc.scales, _SCALES):
        return None
    head = _ENCODED.pack(codec, enc.length, enc.block_size, enc.payload.size, enc.scales.size)
    return [head, wire.raw(enc.payload), wire.raw(enc.scales)]


def _encoded_from(data: memoryview, offset: int) -> Encoded:
    codec, length, block_size, values, scales = wire.header(_ENCODED, data[offset:])
    if codec >= len(CODECS):
        raise ValueError(f"a payload of unknown codec {codec}")
    payload, offset = wire.view(data, _PAYLOADS[codec], values, offset + _ENCODED.size)
    scale, offset = wire.view(data, _SCALES, scales, offset)
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} bytes past the end of a message")
    return Encoded(CODECS[codec], length, payload, scale, block_size)


def _push_parts(push: Push) -> list[bytes | memoryview] | None:
    payload = _encoded_parts(push.payload)
    if payload is None:
        return None
    fields = (push.learner, push.fragment, push.base_version, push.steps, push.tokens, push.seq, push.incarnation)
    given = push.step is not None
    return [_PUSH.pack(*fields, push.sent_at, push.step if given else 0, given), *payload]


def _push_from(data: memoryview) -> Push:
    learner, fragment, base_version, steps, tokens, seq, incarnation, sent_at, step, given = wire.header(_PUSH, data)
    payload = _encoded_from(data, _PUSH.size)
    step = step if given else None
    return Push(learner, fragment, base_version, steps, tokens, seq, payload, sent_at, incarnation, step)


def _merged_parts(msg: MergedFragment) -> list[bytes | memoryview] | None:
    payload = _encoded_parts(msg.payload)
    if payload is None:
        return None
    given = msg.base_version is not None
    base = msg.base_version if given else 0
    head = _MERGED.pack(msg.fragment, msg.version, msg.sent_at, base, given, len(msg.merged), len(msg.lr_factors))
    pairs = struct.pack(f"<{2 * len(msg.merged)}q", *(n for pair in msg.merged for n in pair))
    factors = struct.pack(f"<{len(msg.lr_factors)}d", *msg.lr_factors)
    return [head, pairs, factors, *payload]


def _merged_from(data: memoryview) -> MergedFragment:
    fragment, version, sent_at, base_version, given, count, n_factors = wire.header(_MERGED, data)
    pairs = struct.Struct(f"<{2 * count}q")
    flat = wire.header(pairs, data[_MERGED.size :])
    merged = tuple(zip(flat[0::2], flat[1::2], strict=True))
    factors = struct.Struct(f"<{n_factors}d")
    lr_factors = wire.header(factors, data[_MERGED.size + pairs.size :])
    payload = _encoded_from(data, _MERGED.size + pairs.size + factors.size)
    base = base_version if given else None
    return MergedFragment(fragment, version, payload, sent_at, merged, base, tuple(lr_factors))


def _request_parts(msg: FragmentRequest) -> list[bytes] | None:
    return None if msg.payload is not None else [_REQUEST.pack(msg.fragment, msg.version, msg.sent_at)]


def _request_from(data: memoryview) -> FragmentRequest:
    if len(data) != _REQUEST.size:
        raise ValueError(f"a request of {len(data)} bytes, not {_REQUEST.size}")
    return FragmentRequest(*_REQUEST.unpack(data))


wire.register(Push, 1, _push_parts, _push_from)
wire.register(MergedFragment, 2, _merged_parts, _merged_from)
wire.register(FragmentRequest, 3, _request_parts, _request_from)
