"""A prepared dataset read in place: its shards memory-mapped, each learner's disjoint share, eval windows.

The training split is cut into blocks of `data.block_tokens` tokens and dealt in turn: stream i of n
reads blocks i, i + n, i + 2n, ... So every learner reads from the whole corpus (all its sources,
not one learner per file), no two learners read the same token, a learner that joins mid-run gets
a stream index nobody has read, and nothing but the dataset's path passes through the driver: each
learner opens the shards itself and the page cache holds what it has read.

A stream reads its blocks as `batch_size` parallel lanes, like the byte stream
(`dlc.data.corpus.ByteStream`), and its position is the number of batches served: a small integer
that checkpoints, resumes and peer copies carry, from which the next batch is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlc.data.manifest import Manifest, SplitName, read_manifest
from dlc.errors import UserError


class TokenArray:
    """One split's token sequence: its shards concatenated, memory-mapped on first read."""

    def __init__(self, path: Path, manifest: Manifest, split: SplitName) -> None:
        info = manifest.split(split)
        self.files = [path / shard.file for shard in info.shards]
        self.dtype = np.dtype(manifest.dtype).newbyteorder("<")
        self.ends = np.cumsum([shard.tokens for shard in info.shards], dtype=np.int64)
        self._maps: list[np.memmap | None] = [None] * len(self.files)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def _shard(self, k: int) -> np.memmap:
        mapped = self._maps[k]
        if mapped is None:
            mapped = self._maps[k] = np.memmap(self.files[k], dtype=self.dtype, mode="r")
        return mapped

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as int32, across shard boundaries."""
        out = np.empty(length, dtype=np.int32)
        done = 0
        k = int(np.searchsorted(self.ends, start, side="right"))
        while done < length:
            first = int(self.ends[k - 1]) if k else 0
            offset = start + done - first
            take = min(length - done, int(self.ends[k]) - first - offset)
            out[done : done + take] = self._shard(k)[offset : offset + take]
            done += take
            k += 1
        return out


def check_shards(path: Path, manifest: Manifest) -> None:
    """Every shard the manifest lists is there with exactly its tokens' bytes, or one UserError."""
    itemsize = np.dtype(manifest.dtype).itemsize
    for split in ("train", "eval"):
        for shard in manifest.split(split).shards:
            file = path / shard.file
            expected = shard.tokens * itemsize
            try:
                size = file.stat().st_size
            except OSError:
                raise UserError(
                    f"the dataset {str(path)!r} lists shard {shard.file} but it is missing: the dataset is "
                    "incomplete; prepare it again with `dlc prepare`"
                ) from None
            if size != expected:
                shorter = "shorter" if size < expected else "longer"
                raise UserError(
                    f"shard {str(file)!r} holds {size} bytes, {shorter} than the {expected} bytes ({shard.tokens} "
                    f"{manifest.dtype} tokens) its manifest says: the dataset is damaged; prepare it again"
                )


def local_path(path: str | Path, what: str = "data.path") -> Path:
    """A dataset's directory as an absolute local path: file:///abs/path is one, other URLs are refused."""
    text = str(path)
    if text.startswith("file://"):
        text = text.removeprefix("file://")
    elif "://" in text:
        raise UserError(
            f"{what}={text!r} is a URL: learners memory-map a prepared dataset, so it must be a local path or one "
            "every node mounts at the same place (NFS, a parallel filesystem): copy it there and point at the copy"
        )
    return Path(text).expanduser().resolve()


def open_dataset(path: str | Path, what: str = "data.path") -> tuple[Path, Manifest]:
    """The dataset's absolute directory and its manifest, its shards checked."""
    directory = local_path(path, what)
    manifest = read_manifest(directory, what)
    check_shards(directory, manifest)
    if not manifest.train.tokens:
        raise UserError(f"the dataset {str(directory)!r} has no training tokens: prepare it from more text")
    if not manifest.eval.tokens:
        raise UserError(f"the dataset {str(directory)!r} has no held-out split: prepare it with --eval-fraction > 0")
    return directory, manifest


@dataclass(frozen=True)
class StreamSpec:
    """Where learner stream `index` of `count` reads: a few numbers and a path, all a learner is sent."""

    path: str
    index: int
    count: int
    block_tokens: int

    def blocks(self, total_tokens: int) -> int:
        """How many whole blocks of the training split this stream owns."""
        num_blocks = total_tokens // self.block_tokens
        return len(range(self.index, num_blocks, self.count))

    def lanes(self, total_tokens: int, batch_size: int, seq_len: int) -> tuple[int, int]:
        """(tokens per lane, batches per epoch) of this stream read as `batch_size` lanes; UserError
        when it holds less than one batch."""
        length = self.blocks(total_tokens) * self.block_tokens
        lane_len = length // batch_size
        batches_per_epoch = max(0, (lane_len - 1) // seq_len)
        if batches_per_epoch < 1:
            raise UserError(
                f"the dataset {self.path!r} is too small: {total_tokens} training tokens in blocks of "
                f"data.block_tokens={self.block_tokens} give learner stream {self.index} of {self.count} "
                f"{length} tokens, fewer than one batch needs ({batch_size * (seq_len + 1)}): prepare more "
                "text, lower data.block_tokens, learners.batch_size or learners.seq_len, or use fewer learners"
            )
        return lane_len, batches_per_epoch


@dataclass(frozen=True)
class EvalSpec:
    """The held-out split of the dataset at `path`, with its UTF-8 bytes per token (for bits per byte)."""

    path: str
    bytes_per_token: float


class TokenStream:
    """Batches of (inputs, targets) from one learner's blocks of a prepared dataset.

    The stream's tokens are its blocks laid end to end; row b of batch k is lane b at offset
    k * seq_len, and a lane that runs out starts its next epoch from offset 0. `position` is the
    number of batches served so far.
    """

    def __init__(self, spec: StreamSpec, batch_size: int, seq_len: int, position: int = 0) -> None:
        path = Path(spec.path)
        self.tokens = TokenArray(path, read_manifest(path), "train")
        self.spec = spec
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.lane_len, self.batches_per_epoch = spec.lanes(len(self.tokens), batch_size, seq_len)
        self.position = position

    def _read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of this stream, gathered from its blocks."""
        block, spec = self.spec.block_tokens, self.spec
        parts = []
        while length > 0:
            k, offset = divmod(start, block)
            take = min(length, block - offset)
            parts.append(self.tokens.read((spec.index + k * spec.count) * block + offset, take))
            start, length = start + take, length - take
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        k = self.position % self.batches_per_epoch
        window = np.stack(
            [self._read(b * self.lane_len + k * self.seq_len, self.seq_len + 1) for b in range(self.batch_size)]
        )
        self.position += 1
        return window[:, :-1], window[:, 1:]

    @property
    def epoch(self) -> int:
        return self.position // self.batches_per_epoch


def token_eval_batches(
    spec: EvalSpec, batches: int, batch_size: int, seq_len: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed, evenly spaced windows of the held-out split: the same every evaluation."""
    path = Path(spec.path)
    tokens = TokenArray(path, read_manifest(path), "eval")
    span = len(tokens) - seq_len - 1
    if span < 0:
        raise UserError(
            f"the held-out split of {spec.path!r} holds {len(tokens)} tokens, fewer than one sequence of "
            f"{seq_len + 1}: prepare it with a larger --eval-fraction or from more text"
        )
    starts = np.linspace(0, span, batches * batch_size).astype(np.int64)
    windows = np.stack([tokens.read(int(s), seq_len + 1) for s in starts]).reshape(batches, batch_size, seq_len + 1)
    return [(w[:, :-1], w[:, 1:]) for w in windows]
