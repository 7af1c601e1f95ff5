"""The channel's bytes: the messages of every step in their fixed layouts, everything else pickled,
and what comes back equal to what went."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dlc.algo.decoupled.messages import FragmentRequest, MergedFragment, Push
from dlc.core.codec import CODECS, Encoded, get_codec
from dlc.net import wire
from dlc.net.channel import Beat


def encoded(codec: str, n: int = 200) -> Encoded:
    return get_codec(codec, 64).encode(np.random.default_rng(n).normal(size=n).astype(np.float32))


def same_encoded(a: Encoded, b: Encoded) -> None:
    assert (a.codec, a.length, a.block_size) == (b.codec, b.length, b.block_size)
    for x, y in [(a.payload, b.payload), (a.scales, b.scales)]:
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)


def round_trip(message):
    data = wire.dumps(message)
    assert data[0] != pickle.PROTO[0], "sent pickled, not in its layout"
    return wire.loads(data)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("step", [None, 0, 1234])
def test_a_push_comes_back_whole_in_every_codec(codec, step):
    push = Push(3, 7, 11, 24, 24 * 1024, 2 * 10**9 + 5, encoded(codec), 1.7e9 + 0.25, incarnation=2, step=step)
    got = round_trip(push)
    assert {k: v for k, v in vars(got).items() if k != "payload"} == {
        k: v for k, v in vars(push).items() if k != "payload"
    }
    same_encoded(got.payload, push.payload)
    assert np.array_equal(get_codec(codec).decode(got.payload), get_codec(codec).decode(push.payload))


@pytest.mark.parametrize("base_version", [None, 0, 41])
@pytest.mark.parametrize("merged", [(), ((0, 5), (3, 10**9 + 2))])
@pytest.mark.parametrize("factors", [(), (1.0, 1.4142135623730951, 1.25)])
def test_a_merged_fragment_comes_back_whole(base_version, merged, factors):
    message = MergedFragment(5, 42, encoded("int4", 1001), 123.5, merged, base_version, factors)
    got = round_trip(message)
    fields = (got.fragment, got.version, got.sent_at, got.merged, got.base_version, got.lr_factors)
    assert fields == (5, 42, 123.5, merged, base_version, factors)
    same_encoded(got.payload, message.payload)


def test_a_request_comes_back_whole():
    assert round_trip(FragmentRequest(23, 9, 4.5)) == FragmentRequest(23, 9, 4.5)


def test_nan_scales_and_an_empty_payload_travel_as_they_are():
    poisoned = Encoded("int4", 3, np.array([0x88, 0x08], np.uint8), np.array([np.nan], np.float32), 64)
    same_encoded(round_trip(Push(0, 0, 0, 1, 0, 0, poisoned, 0.0)).payload, poisoned)
    empty = Encoded("none", 0, np.zeros(0, np.float32))
    same_encoded(round_trip(Push(0, 0, 0, 1, 0, 0, empty, 0.0)).payload, empty)


def test_decoded_arrays_are_read_only_views_of_the_message():
    got = wire.loads(wire.dumps(Push(0, 1, 0, 1, 64, 0, encoded("int8"), 0.0)))
    assert not got.payload.payload.flags.writeable
    with pytest.raises(ValueError):
        got.payload.payload[0] = 1


@pytest.mark.parametrize(
    "odd",
    [
        Encoded("int4", 4, np.zeros((1, 2), np.uint8), np.ones(1, np.float32), 64),  # not 1-D
        Encoded("int4", 4, np.zeros(2, np.int64), np.ones(1, np.float32), 64),  # not its codec's dtype
        Encoded("int4", 4, np.zeros(4, np.uint8)[::2], np.ones(1, np.float32), 64),  # not contiguous
        Encoded("zstd", 4, np.zeros(2, np.uint8)),  # no such codec
        [1, 2, 3],  # not Encoded at all
    ],
)
def test_a_message_its_layout_cannot_hold_is_pickled_and_arrives_as_sent(odd):
    # Malformed pushes must still reach the syncer, which refuses them with a reason.
    push = Push(1, 2, 0, 1, 64, 9, odd, 0.0)
    data = wire.dumps(push)
    assert data[0] == pickle.PROTO[0]
    got = wire.loads(data)
    assert got.seq == 9 and type(got.payload) is type(odd)


def test_fields_a_layout_cannot_hold_are_pickled():
    push = Push(1, 2, 0, 1.5, 64, 9, encoded("int4"), 0.0)  # a float step count
    assert wire.loads(wire.dumps(push)).steps == 1.5


def test_other_messages_are_pickled():
    assert wire.loads(wire.dumps(Beat(3, None))) == Beat(3, None)
    assert wire.loads(wire.dumps({"a": 1})) == {"a": 1}


def test_bytes_cut_short_or_of_no_known_kind_are_refused():
    data = wire.dumps(Push(0, 1, 0, 1, 64, 0, encoded("int4"), 0.0))
    with pytest.raises(ValueError, match="cut short"):
        wire.loads(data[:-1])
    with pytest.raises(ValueError, match="past the end"):
        wire.loads(data + b"\0")
    with pytest.raises(ValueError, match="unknown kind"):
        wire.loads(bytes([200]) + data[1:])
    with pytest.raises(ValueError, match="empty"):
        wire.loads(b"")


def test_a_tag_is_taken_once():
    with pytest.raises(ValueError, match="taken"):
        wire.register(Beat, 1, lambda m: None, lambda d: None)
    with pytest.raises(ValueError, match="byte other than"):
        wire.register(Beat, pickle.PROTO[0], lambda m: None, lambda d: None)
