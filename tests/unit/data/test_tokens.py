"""Reading a prepared dataset in place: shards as one sequence, disjoint learner streams, exact
positions, fixed eval windows, and every way a dataset on disk can be refused.

The datasets here are written by hand, each token its own position in the split (uint32), so a
test can say exactly which tokens a stream read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dlc.data.manifest import MANIFEST_FILE, Manifest, ShardInfo, SplitInfo, TokenizerInfo, read_manifest
from dlc.data.tokens import EvalSpec, StreamSpec, TokenArray, TokenStream, open_dataset, token_eval_batches
from dlc.errors import UserError


def write_split(path: Path, name: str, tokens: np.ndarray, shard_tokens: int, dtype: str) -> SplitInfo:
    shards = []
    for k, start in enumerate(range(0, len(tokens), shard_tokens)):
        data = tokens[start : start + shard_tokens].astype(dtype).tobytes()
        (path / f"{name}-{k:05d}.bin").write_bytes(data)
        shards.append(
            ShardInfo(
                file=f"{name}-{k:05d}.bin",
                tokens=len(data) // np.dtype(dtype).itemsize,
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
    return SplitInfo(documents=1, tokens=len(tokens), text_bytes=2 * len(tokens), shards=shards)


def positional_dataset(path: Path, train: int = 50_000, held_out: int = 5_000, shard_tokens: int = 7_000) -> Path:
    """Token k of each split is k: the tokens a stream reads are the positions it read."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = train + held_out
    manifest = Manifest(
        dlc_version="test",
        created="2026-01-01T00:00:00Z",
        tokenizer=TokenizerInfo(spec="test", vocab_size=vocab, eos_id=0, eos_token="<eos>", sha256="0"),
        dtype="uint32",
        seed=0,
        eval_fraction=0.1,
        sources=[],
        train=write_split(path, "train", np.arange(train), shard_tokens, "uint32"),
        eval=write_split(path, "eval", np.arange(held_out), shard_tokens, "uint32"),
    )
    manifest.write(path)
    return path


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return positional_dataset(tmp_path / "ds")


def test_a_split_reads_as_one_sequence_across_its_shards(dataset):
    tokens = TokenArray(dataset, read_manifest(dataset), "train")
    assert len(tokens) == 50_000 and len(tokens.files) == 8
    for start, length in [(0, 10), (6_990, 20), (6_999, 7_002), (13_999, 2), (49_990, 10)]:
        np.testing.assert_array_equal(tokens.read(start, length), np.arange(start, start + length))


def test_streams_are_disjoint_and_spread_over_the_whole_split(dataset):
    count, block = 3, 1_000
    seen = []
    for i in range(count):
        stream = TokenStream(StreamSpec(str(dataset), i, count, block), batch_size=4, seq_len=16)
        read = np.concatenate([x.ravel() for x, _ in (stream.next_batch() for _ in range(stream.batches_per_epoch))])
        blocks = set((read // block).tolist())
        assert all(b % count == i for b in blocks)  # stream i reads blocks i, i + n, i + 2n, ...
        assert max(blocks) >= 45  # from the last shards as much as the first
        seen.append(set(read.tolist()))
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


def test_targets_are_the_inputs_shifted_by_one_token_across_block_boundaries(dataset):
    stream = TokenStream(StreamSpec(str(dataset), 1, 2, 64), batch_size=2, seq_len=100)
    x, y = stream.next_batch()
    assert x.shape == y.shape == (2, 100) and x.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    # Crossing from block 1 (tokens 64..127) into the stream's next block, 3 (192..255).
    assert x[0, 63] == 127 and x[0, 64] == 192


def test_a_stream_goes_on_exactly_from_its_position_and_wraps_into_a_new_epoch(dataset):
    spec = StreamSpec(str(dataset), 0, 2, 512)
    a = TokenStream(spec, 4, 32)
    for _ in range(7):
        a.next_batch()
    b = TokenStream(spec, 4, 32, position=a.position)
    for got, expected in zip(a.next_batch(), b.next_batch(), strict=True):
        np.testing.assert_array_equal(got, expected)
    first = TokenStream(spec, 4, 32).next_batch()
    again = TokenStream(spec, 4, 32, position=a.batches_per_epoch)
    np.testing.assert_array_equal(again.next_batch()[0], first[0])
    assert again.epoch == 1


def test_a_stream_shorter_than_one_batch_is_refused_with_the_fix(dataset):
    with pytest.raises(UserError, match="too small.*data.block_tokens"):
        TokenStream(StreamSpec(str(dataset), 5, 8, 4_096), batch_size=64, seq_len=128)


def test_eval_windows_are_fixed_and_inside_the_held_out_split(dataset):
    spec = EvalSpec(str(dataset), 2.0)
    windows = token_eval_batches(spec, batches=3, batch_size=2, seq_len=10)
    assert len(windows) == 3 and windows[0][0].shape == (2, 10)
    assert windows[0][0][0, 0] == 0 and windows[-1][1][-1, -1] == 4_999  # the first and the last token
    for (x1, y1), (x2, y2) in zip(windows, token_eval_batches(spec, 3, 2, 10), strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


# (case, damage done to a good dataset, fragments of the one error)
DAMAGE = [
    ("no-manifest", lambda p: (p / MANIFEST_FILE).unlink(), ["holds no manifest.json", "dlc prepare"]),
    ("not-json", lambda p: (p / MANIFEST_FILE).write_text("{"), ["cannot be read as JSON", "damaged"]),
    (
        "not-a-manifest",
        lambda p: (p / MANIFEST_FILE).write_text('{"rows": 3}'),
        ["damaged or not a dlc dataset manifest"],
    ),
    ("shard-shorter", lambda p: (p / "train-00002.bin").write_bytes(b"\0" * 100), ["train-00002.bin", "shorter"]),
    ("shard-missing", lambda p: (p / "eval-00000.bin").unlink(), ["eval-00000.bin", "missing"]),
    (
        "vocab-beyond-dtype",
        lambda p: _edit(p, dtype="uint16", tokenizer={"vocab_size": 70_000}),
        ["70000 does not fit uint16"],
    ),
    ("eos-outside-vocab", lambda p: _edit(p, tokenizer={"eos_id": 10**9}), ["eos_id", "outside the vocabulary"]),
    ("newer-format", lambda p: _edit(p, version=2), ["format version 2"]),
]


def _edit(path: Path, **changes) -> None:
    data = json.loads((path / MANIFEST_FILE).read_text())
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    (path / MANIFEST_FILE).write_text(json.dumps(data))


@pytest.mark.parametrize(("damage", "fragments"), [c[1:] for c in DAMAGE], ids=[c[0] for c in DAMAGE])
def test_a_damaged_dataset_is_refused_in_one_line(damage, fragments, dataset):
    damage(dataset)
    with pytest.raises(UserError) as refused:
        open_dataset(dataset)
    message = str(refused.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_a_directory_that_is_not_there_is_refused(tmp_path):
    with pytest.raises(UserError, match="is not a directory"):
        open_dataset(tmp_path / "nothing")
