"""Corpus, held-out split and disjoint per-learner byte streams.

The corpus is cut into fixed-size blocks, the blocks are shuffled with the run seed, the first
`eval_fraction` of them become the held-out split and the rest are dealt round-robin to the
learners' streams. So learner i never reads learner j's bytes, nobody trains on eval bytes, and
the split does not depend on file order beyond the (sorted) corpus itself.

A stream reads its bytes as `batch_size` parallel lanes; its position is the number of batches
it has served, a small integer that checkpoints and peer copies carry.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlc.config.workload import DataConfig
from dlc.errors import UserError

BYTE_VOCAB = 256  # a model trained on a byte corpus reads and predicts raw bytes

# Directories under the standard library that hold tests or third-party packages.
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files() -> list[Path]:
    """The running interpreter's standard-library sources, tests and site-packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP)
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def text_files(patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise UserError(f"data.paths entry {pattern!r} matches no file: check the path or the glob pattern")
        files.extend(Path(m) for m in matches)
    return files


def load_corpus(cfg: DataConfig) -> np.ndarray:
    """All corpus bytes as one uint8 array, files in a deterministic order."""
    files = stdlib_files() if cfg.source == "stdlib" else text_files(cfg.paths)
    chunks, total = [], 0
    for path in files:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read corpus file {str(path)!r}: {exc.strerror}") from None
        if cfg.max_corpus_bytes is not None:
            data = data[: cfg.max_corpus_bytes - total]
        chunks.append(data)
        total += len(data)
        if cfg.max_corpus_bytes is not None and total >= cfg.max_corpus_bytes:
            break
    if total == 0:
        where = "the standard library" if cfg.source == "stdlib" else f"{len(files)} file(s) of data.paths"
        raise UserError(f"the corpus is empty: {where} hold no bytes; point data.paths at text files")
    return np.frombuffer(b"".join(chunks), dtype=np.uint8)


@dataclass(frozen=True)
class Split:
    """The held-out bytes and one disjoint byte array per learner stream."""

    eval_bytes: np.ndarray
    streams: tuple[np.ndarray, ...]


def split_corpus(corpus: np.ndarray, cfg: DataConfig, num_streams: int, seed: int, min_stream_bytes: int) -> Split:
    block = cfg.block_bytes
    num_blocks = len(corpus) // block
    if num_blocks == 0:
        raise UserError(
            f"the corpus holds {len(corpus)} bytes, less than one block of data.block_bytes={block}: "
            "add text or lower data.block_bytes"
        )
    blocks = corpus[: num_blocks * block].reshape(num_blocks, block)
    order = np.random.default_rng(seed).permutation(num_blocks)
    num_eval = max(1, round(cfg.eval_fraction * num_blocks))
    train_order = order[num_eval:]
    streams = tuple(blocks[train_order[i::num_streams]].reshape(-1) for i in range(num_streams))
    shortest = min(len(s) for s in streams)
    if shortest < min_stream_bytes:
        raise UserError(
            f"the corpus is too small: {len(corpus)} bytes give each of {num_streams} learners only "
            f"{shortest} training bytes, fewer than one batch needs ({min_stream_bytes}): add text, "
            "lower learners.batch_size or learners.seq_len, or use fewer learners"
        )
    return Split(eval_bytes=blocks[np.sort(order[:num_eval])].reshape(-1), streams=streams)


class ByteStream:
    """Batches of (inputs, targets) from one learner's bytes, read as parallel lanes.

    Row b of batch k is lane b at offset k * seq_len. When a lane runs out the stream starts a
    new epoch from offset 0. `position` is the number of batches served so far.
    """

    def __init__(self, data: np.ndarray, batch_size: int, seq_len: int, position: int = 0) -> None:
        self.data = data
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.lane_len = len(data) // batch_size
        self.batches_per_epoch = (self.lane_len - 1) // seq_len
        assert self.batches_per_epoch >= 1, "split_corpus guarantees one batch per stream"
        self.position = position

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        k = self.position % self.batches_per_epoch
        starts = np.arange(self.batch_size) * self.lane_len + k * self.seq_len
        idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        window = self.data[idx].astype(np.int32)
        self.position += 1
        return window[:, :-1], window[:, 1:]

    @property
    def epoch(self) -> int:
        return self.position // self.batches_per_epoch


def eval_batches(
    eval_bytes: np.ndarray, batches: int, batch_size: int, seq_len: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed, evenly spaced windows of the held-out split: the same every evaluation."""
    count = batches * batch_size
    span = len(eval_bytes) - seq_len - 1
    if span < 0:
        raise UserError(
            f"the held-out split holds {len(eval_bytes)} bytes, fewer than one sequence of "
            f"{seq_len + 1}: raise data.eval_fraction or use a larger corpus"
        )
    starts = np.linspace(0, span, count).astype(np.int64)
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    windows = eval_bytes[idx].astype(np.int32).reshape(batches, batch_size, seq_len + 1)
    return [(w[:, :-1], w[:, 1:]) for w in windows]
