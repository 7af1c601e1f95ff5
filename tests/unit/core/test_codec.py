"""Outer-gradient codecs: exact bytes, hand-quantised values, error bounds."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

from dlc.core.codec import CODECS, Encoded, get_codec


def test_registry() -> None:
    assert CODECS == ("none", "bf16", "int8", "int4")
    for name in CODECS:
        assert get_codec(name).name == name
    with pytest.raises(ValueError, match="none, bf16, int8, int4"):
        get_codec("int2")


@pytest.mark.parametrize(
    ("name", "length", "block", "nbytes"),
    [
        ("none", 1000, 64, 4000),  # 4 bytes a value
        ("bf16", 1000, 64, 2000),  # 2 bytes a value
        # ceil(1000 / 64) = 16 blocks: 1000 payload bytes + 16 * 4 scale bytes.
        ("int8", 1000, 64, 1064),
        # 16 blocks: 1000 / 2 = 500 payload bytes + 16 * 4 = 64 scale bytes.
        ("int4", 1000, 64, 564),
        # ceil(1000 / 32) = 32 blocks: 500 + 32 * 4 = 628.
        ("int4", 1000, 32, 628),
        # 7 values: 1 block; ceil(7 / 2) = 4 payload bytes + 4 scale bytes.
        ("int4", 7, 64, 8),
        ("int4", 0, 64, 0),
    ],
)
def test_exact_bytes(name: str, length: int, block: int, nbytes: int) -> None:
    codec = get_codec(name, block_size=block)
    enc = codec.encode(np.linspace(-1, 1, length, dtype=np.float32))
    assert enc.nbytes == nbytes
    assert codec.encoded_nbytes(length) == nbytes
    assert codec.decode(enc).shape == (length,)


def test_int4_by_hand() -> None:
    # Block 1: absmax 1.75 -> step 1.75 / 7 = 0.25; q = [7, -2, 1, 0].
    # Block 2 (partial, 2 values): absmax 3.5 -> step 0.5; q = [7, -2].
    x = np.array([1.75, -0.5, 0.25, 0.0, 3.5, -1.0], dtype=np.float32)
    enc = get_codec("int4", block_size=4).encode(x)
    np.testing.assert_array_equal(enc.scales, [0.25, 0.5])
    # Nibbles q + 8 = [15, 6, 9, 8, 15, 6]; low nibble first:
    # 15 | 6 << 4 = 111, 9 | 8 << 4 = 137, 15 | 6 << 4 = 111.
    np.testing.assert_array_equal(enc.payload, [111, 137, 111])
    np.testing.assert_array_equal(get_codec("int4", block_size=4).decode(enc), x)


def test_int8_by_hand() -> None:
    # absmax 127 -> step 1; rint rounds halves to even: -63.5 -> -64, 0.5 -> 0.
    x = np.array([127.0, -63.5, 0.5, 0.0], dtype=np.float32)
    codec = get_codec("int8", block_size=4)
    enc = codec.encode(x)
    np.testing.assert_array_equal(enc.payload, [127, -64, 0, 0])
    np.testing.assert_array_equal(codec.decode(enc), [127.0, -64.0, 0.0, 0.0])


@pytest.mark.parametrize("name", ["int4", "int8"])
@pytest.mark.parametrize("length", [1, 63, 64, 1000, 1001])
def test_round_trip_within_half_a_step(name: str, length: int) -> None:
    rng = np.random.default_rng(length)
    # Blocks of very different magnitude, so each block's own step matters.
    x = (rng.normal(size=length) * 10.0 ** rng.integers(-4, 3, size=length)).astype(np.float32)
    codec = get_codec(name, block_size=64)
    enc = codec.encode(x)
    step = np.repeat(enc.scales, 64)[:length]
    err = np.abs(codec.decode(enc) - x)
    # Half a step, plus float32 rounding of q * step.
    assert np.all(err <= step / 2 * (1 + 1e-6) + np.abs(x) * 2**-23)


def test_zero_blocks_decode_to_zeros_without_warnings() -> None:
    x = np.zeros(130, dtype=np.float32)
    x[64] = 2.0  # only the second block is non-zero
    for name in CODECS:
        codec = get_codec(name)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = codec.decode(codec.encode(x))
        np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("name", ["int4", "int8"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_blocks_stay_visible(name: str, bad: float) -> None:
    x = np.ones(128, dtype=np.float32)
    x[70] = bad
    codec = get_codec(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = codec.decode(codec.encode(x))
    assert np.all(np.isnan(out[64:]))  # the poisoned block
    np.testing.assert_array_equal(out[:64], 1.0)  # the clean block


def test_bf16_relative_error() -> None:
    rng = np.random.default_rng(0)
    x = (rng.normal(size=4096) * 10.0 ** rng.integers(-6, 6, size=4096)).astype(np.float32)
    codec = get_codec("bf16")
    out = codec.decode(codec.encode(x))
    # 8 significant bits, round to nearest: relative error at most 2^-8.
    assert np.all(np.abs(out - x) <= np.abs(x) * 2**-8)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even 1.0;
    # 1 + 3 * 2^-9 is past halfway and rounds up to 1 + 2^-7.
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-9], dtype=np.float32)
    np.testing.assert_array_equal(codec.decode(codec.encode(ties)), [1.0, 1 + 2**-7])


@pytest.mark.parametrize("name", CODECS)
def test_encoded_pickles_and_decodes(name: str) -> None:
    codec = get_codec(name)
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    enc = pickle.loads(pickle.dumps(codec.encode(x)))
    assert isinstance(enc, Encoded)
    assert enc.codec == name and enc.length == 101
    np.testing.assert_allclose(codec.decode(enc), x, atol=3 / 7 / 2 * 1.0001)


def test_decode_rejects_mismatches() -> None:
    int4 = get_codec("int4")
    enc = int4.encode(np.ones(100, dtype=np.float32))
    with pytest.raises(ValueError, match="cannot decode"):
        get_codec("int8").decode(enc)
    short = Encoded("int4", 100, enc.payload[:-1], enc.scales, 64)
    with pytest.raises(ValueError, match="payload"):
        int4.decode(short)
    as_int8 = Encoded("int4", 100, enc.payload.view(np.int8), enc.scales, 64)
    with pytest.raises(ValueError, match="must be uint8"):
        int4.decode(as_int8)
    # A payload encoded with another block size decodes with its own.
    other = get_codec("int4", block_size=16).encode(np.arange(40, dtype=np.float32))
    np.testing.assert_allclose(int4.decode(other), np.arange(40), atol=39 / 7 / 2)
