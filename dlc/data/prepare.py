"""`dlc prepare`: text in, a prepared token dataset out (shards, tokenizer.json, manifest.json last).

The corpus streams through in batches of documents: nothing holds it whole. Documents are numbered
0, 1, 2, ... across the sources in order (empty ones skipped and counted), and document i is held out
for evaluation when a fixed hash of (seed, i) falls below `eval_fraction`, so the split depends on the
documents and the seed alone. Tokenization runs in a pool of spawned workers; batches go out and come
back in order, so the output is the same byte for byte whatever the number of workers.

A prepare that fails or is interrupted removes what it wrote; one that is killed leaves no
manifest.json, so nothing that `read_manifest` accepts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np

from dlc import __version__
from dlc.data.encoding import Encoded, encode, encode_in_worker, start_worker
from dlc.data.manifest import (
    MANIFEST_FILE,
    TOKENIZER_FILE,
    Manifest,
    ShardInfo,
    SourceInfo,
    SplitInfo,
    SplitName,
    TokenizerInfo,
    dtype_for,
)
from dlc.data.sources import Reading, Source, resolve_sources
from dlc.data.tokenizer import EOS_TOKEN, Tokenizer, load_tokenizer, parse_spec, train_bpe
from dlc.errors import UserError
from dlc.units import MIB

DEFAULT_SHARD_TOKENS = 2**26
DEFAULT_BPE_SAMPLE_BYTES = 64 * MIB
BATCH_TEXT_BYTES = MIB  # a batch of documents sent to a worker: about this much text
BATCH_DOCUMENTS = 1024  # or this many documents
# What a prepare writes: an unfinished one's leftovers are these, and nothing else is ever removed.
_OURS = re.compile(rf"^(?:(?:train|eval)-\d{{5,}}\.bin|{re.escape(TOKENIZER_FILE)}|\.{re.escape(MANIFEST_FILE)}\.tmp)$")

Phase = Literal["bpe", "tokenize"]


@dataclass(frozen=True)
class Progress:
    """Where a prepare is, for a progress bar: `done` of `total` in the current phase.

    `bpe` reads the BPE's training text (`done`, `total`: text bytes, up to the sample size) and then
    trains it; `tokenize` reads every source (`done`, `total`: bytes of the sources' sizes).
    """

    phase: Phase
    done: int
    total: int
    text_bytes: int  # UTF-8 bytes of the documents read so far in this phase
    tokens: int  # tokens written so far
    workers: int = 1  # processes tokenizing


ProgressCallback = Callable[[Progress], None]


def held_out(seed: int, index: int, eval_fraction: float) -> bool:
    """Whether document `index` belongs to the eval split: BLAKE2b of "seed:index" as a number in [0, 1)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < eval_fraction


def prepare(
    sources: list[str],
    out: str | Path,
    *,
    tokenizer: str = "bytes",
    field: str = "text",
    eval_fraction: float = 0.02,
    seed: int = 0,
    workers: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    eos: str | None = None,
    bpe_sample_bytes: int = DEFAULT_BPE_SAMPLE_BYTES,
    overwrite: bool = False,
    on_progress: ProgressCallback | None = None,
) -> Manifest:
    """Tokenize `sources` into a prepared dataset in `out`; return its manifest.

    `tokenizer` is `bytes`, `bpe:N` or a path to a tokenizer.json (or a directory holding one);
    `eos` names a path tokenizer's end-of-document token. A BPE is trained on the training split's
    documents only, in a first pass that stops after `bpe_sample_bytes` of their text.
    `workers` processes tokenize (default: the CPUs this process may use; 1, or the bytes tokenizer:
    this process alone). They are spawned: a script that calls this needs `if __name__ == "__main__":`.
    `on_progress` is called after every batch of documents, from this thread.
    """
    if not 0 < eval_fraction < 0.5:
        raise UserError(f"--eval-fraction {eval_fraction} must be above 0 and below 0.5, e.g. 0.02")
    if shard_tokens < 1:
        raise UserError(f"--shard-tokens {shard_tokens} must be at least 1, e.g. {DEFAULT_SHARD_TOKENS}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers {workers} must be at least 1 (or left out: one per CPU)")
    if bpe_sample_bytes < 1:
        raise UserError(f"bpe_sample_bytes={bpe_sample_bytes} must be at least 1")
    out = Path(out).expanduser()
    spec = parse_spec(tokenizer)
    if spec.kind == "bpe" and eos is not None and not eos:
        raise UserError("--eos is empty: name the end-of-document token, e.g. '<|endoftext|>'")
    loaded = None if spec.kind == "bpe" else load_tokenizer(spec, eos)
    resolved = resolve_sources(sources, field, exclude=out)
    leftovers = _check_out(out, overwrite)

    created = not out.exists()
    run = _Run(resolved, eval_fraction, seed, on_progress)
    try:
        _remove(leftovers)
        out.mkdir(parents=True, exist_ok=True)
        tok = loaded or run.train_bpe(spec.bpe_vocab, bpe_sample_bytes, eos)
        tokenizer_json = tok.to_json().encode()
        (out / TOKENIZER_FILE).write_bytes(tokenizer_json)
        splits, sources_info = run.tokenize(tok, out, shard_tokens, _worker_count(workers, tok, run.total_bytes))
        manifest = Manifest(
            dlc_version=__version__,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            tokenizer=TokenizerInfo(
                spec=tok.spec,
                vocab_size=tok.vocab_size,
                eos_id=tok.eos_id,
                eos_token=tok.eos_token,
                sha256=hashlib.sha256(tokenizer_json).hexdigest(),
            ),
            dtype=dtype_for(tok.vocab_size),
            seed=seed,
            eval_fraction=eval_fraction,
            sources=sources_info,
            train=splits["train"],
            eval=splits["eval"],
            replaced_characters=run.replaced,
            skipped_documents=run.skipped,
        )
        manifest.write(out)
    except BaseException:
        _remove([p for p in out.iterdir() if _OURS.match(p.name)] if out.is_dir() else [])
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    return manifest


def _worker_count(requested: int | None, tok: Tokenizer, total_bytes: int) -> int:
    if tok.spec == "bytes":
        return 1  # its encoding is a copy: shipping text to workers and back costs more than it
    count = requested or _available_cpus()
    return max(1, min(count, -(-total_bytes // BATCH_TEXT_BYTES)))  # no worker without a batch to do


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# -- the output directory --------------------------------------------------------------------------


def _check_out(out: Path, overwrite: bool) -> list[Path]:
    """What to remove from `out` before writing: an unfinished prepare's leftovers, or (with
    `overwrite`) the dataset there. UserError when it holds anything a prepare does not write."""
    if not out.exists():
        return []
    if not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory: choose another --out")
    entries = sorted(out.iterdir())
    foreign = [p for p in entries if p.name != MANIFEST_FILE and not (_OURS.match(p.name) and p.is_file())]
    if (out / MANIFEST_FILE).exists() and not overwrite:
        raise UserError(
            f"--out {str(out)!r} already holds a prepared dataset ({MANIFEST_FILE}): "
            "--overwrite replaces it, or choose another --out"
        )
    if foreign:
        raise UserError(
            f"--out {str(out)!r} holds {foreign[0].name!r}, which dlc prepare did not write: "
            "choose an empty or new directory for --out"
        )
    # The manifest goes first: from then on the directory is no dataset, whatever is left.
    return sorted(entries, key=lambda p: p.name != MANIFEST_FILE)


def _remove(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# -- the passes ------------------------------------------------------------------------------------


@dataclass
class _Batch:
    texts: list[str]
    held_out: np.ndarray  # bool, per document
    source: np.ndarray  # int, per document: its source's index


@dataclass
class _SplitTotals:
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0


class _Run:
    """The passes over the sources of one prepare, and what they counted."""

    def __init__(
        self, sources: list[Source], eval_fraction: float, seed: int, on_progress: ProgressCallback | None
    ) -> None:
        self.sources = sources
        self.eval_fraction = eval_fraction
        self.seed = seed
        self.on_progress = on_progress or (lambda _: None)
        self.total_bytes = sum(s.size for s in sources)
        self.replaced = 0
        self.skipped = 0

    def _documents(self, reading: Reading) -> Generator[tuple[int, bool, str], None, None]:
        """(source index, held out, text) of each non-empty document, in order."""
        index = 0
        for number, source in enumerate(self.sources):
            with contextlib.closing(source.documents(reading)) as documents:
                for text in documents:
                    if not text:
                        reading.skipped += 1
                        continue
                    yield number, held_out(self.seed, index, self.eval_fraction), text
                    index += 1

    def train_bpe(self, vocab_size: int, sample_bytes: int, eos: str | None) -> Tokenizer:
        """A BPE trained on the first `sample_bytes` of the training split's text."""
        total = min(sample_bytes, self.total_bytes)
        sampled = 0

        def sample() -> Iterator[str]:
            nonlocal sampled
            reported = 0
            with contextlib.closing(self._documents(Reading())) as documents:
                for _, is_eval, text in documents:
                    if is_eval:
                        continue
                    text = text[: sample_bytes - sampled]
                    sampled += len(text.encode("utf-8"))
                    yield text
                    if sampled - reported >= MIB:
                        self.on_progress(Progress("bpe", min(sampled, total), total, sampled, 0))
                        reported = sampled
                    if sampled >= sample_bytes:
                        break
            self.on_progress(Progress("bpe", total, total, sampled, 0))  # read: the merges are next

        return train_bpe(sample(), vocab_size, eos or EOS_TOKEN)

    def _batches(self, reading: Reading) -> Iterator[_Batch]:
        texts: list[str] = []
        flags: list[bool] = []
        owners: list[int] = []
        size = 0
        for owner, is_eval, text in self._documents(reading):
            texts.append(text)
            flags.append(is_eval)
            owners.append(owner)
            size += len(text)
            if size >= BATCH_TEXT_BYTES or len(texts) >= BATCH_DOCUMENTS:
                yield _Batch(texts, np.array(flags), np.array(owners, dtype=np.int64))
                texts, flags, owners, size = [], [], [], 0
        if texts:
            yield _Batch(texts, np.array(flags), np.array(owners, dtype=np.int64))

    def tokenize(
        self, tok: Tokenizer, out: Path, shard_tokens: int, workers: int
    ) -> tuple[dict[SplitName, SplitInfo], list[SourceInfo]]:
        dtype = np.dtype(dtype_for(tok.vocab_size)).newbyteorder("<")
        writers = {name: _ShardWriter(out, name, dtype, shard_tokens) for name in ("train", "eval")}
        totals = {name: _SplitTotals() for name in ("train", "eval")}
        source_documents = np.zeros(len(self.sources), dtype=np.int64)
        source_tokens = np.zeros(len(self.sources), dtype=np.int64)
        reading = Reading()
        text_bytes = 0

        def take(batch: _Batch, result: Encoded) -> None:
            nonlocal text_bytes
            token_held_out = np.repeat(batch.held_out, result.lengths)
            for name, mask, docs in (
                ("train", ~token_held_out, ~batch.held_out),
                ("eval", token_held_out, batch.held_out),
            ):
                writers[name].write(result.tokens[mask])
                totals[name].documents += int(docs.sum())
                totals[name].tokens += int(result.lengths[docs].sum())
                totals[name].text_bytes += int(result.text_bytes[docs].sum())
            np.add.at(source_documents, batch.source, 1)
            np.add.at(source_tokens, batch.source, result.lengths)
            text_bytes += int(result.text_bytes.sum())
            tokens = totals["train"].tokens + totals["eval"].tokens
            self.on_progress(Progress("tokenize", reading.bytes_read, self.total_bytes, text_bytes, tokens, workers))

        try:
            if workers == 1:
                for batch in self._batches(reading):
                    take(batch, encode(tok, batch.texts, dtype))
            else:
                self._tokenize_in_pool(tok, dtype, workers, reading, take)
        finally:
            for writer in writers.values():
                writer.close()
        self.replaced, self.skipped = reading.replaced, reading.skipped
        self.on_progress(
            Progress(
                "tokenize",
                self.total_bytes,
                self.total_bytes,
                text_bytes,
                sum(t.tokens for t in totals.values()),
                workers,
            )
        )
        self._check_split(totals)
        splits: dict[SplitName, SplitInfo] = {
            name: SplitInfo(
                documents=totals[name].documents,
                tokens=totals[name].tokens,
                text_bytes=totals[name].text_bytes,
                shards=writers[name].shards,
            )
            for name in ("train", "eval")
        }
        sources = [
            SourceInfo(
                name=s.name,
                kind=s.kind,
                bytes=s.size,
                sha256=s.sha256(),
                documents=int(source_documents[i]),
                tokens=int(source_tokens[i]),
            )
            for i, s in enumerate(self.sources)
        ]
        return splits, sources

    def _tokenize_in_pool(
        self,
        tok: Tokenizer,
        dtype: np.dtype,
        workers: int,
        reading: Reading,
        take: Callable[[_Batch, Encoded], None],
    ) -> None:
        """Batches out to `workers` spawned processes, at most two each in flight, results taken in order."""
        import multiprocessing
        from concurrent.futures import Future, ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=start_worker,
            initargs=(tok.to_json(), tok.spec, tok.eos_token),
        )
        pending: deque[tuple[_Batch, Future[Encoded]]] = deque()
        try:
            for batch in self._batches(reading):
                pending.append((batch, pool.submit(encode_in_worker, batch.texts, dtype.str)))
                batch.texts = []  # the worker has them; hold no text here
                if len(pending) >= 2 * workers:
                    done, future = pending.popleft()
                    take(done, future.result())
            while pending:
                done, future = pending.popleft()
                take(done, future.result())
        except BrokenProcessPool:
            raise UserError(
                f"a tokenizing worker process ended abruptly (killed, or out of memory): prepare again with "
                f"fewer --workers than {workers} (a script calling prepare needs `if __name__ == '__main__':`)"
            ) from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _check_split(self, totals: dict[str, _SplitTotals]) -> None:
        train, held = totals["train"].documents, totals["eval"].documents
        if held == 0 or train == 0:
            which = "none was held out for eval" if held == 0 else "none was left for training"
            raise UserError(
                f"the sources hold {train + held} non-empty document(s) ({self.skipped} empty) and with "
                f"--eval-fraction {self.eval_fraction} and --seed {self.seed} {which}: add documents (a text file "
                "is one document, a JSONL line or a Parquet row is one), or change --eval-fraction or --seed"
            )


# -- shards ----------------------------------------------------------------------------------------


@dataclass
class _ShardWriter:
    """A split's shards, `split-00000.bin`, ...: a new one after every `shard_tokens` tokens."""

    out: Path
    split: SplitName
    dtype: np.dtype
    shard_tokens: int
    shards: list[ShardInfo] = dataclasses.field(default_factory=list)
    _file: IO[bytes] | None = None
    _name: str = ""
    _digest: Any = None
    _count: int = 0

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self._file is None:
                self._name = f"{self.split}-{len(self.shards):05d}.bin"
                self._file = open(self.out / self._name, "wb")
                self._digest, self._count = hashlib.sha256(), 0
            part, tokens = tokens[: self.shard_tokens - self._count], tokens[self.shard_tokens - self._count :]
            data = part.tobytes()
            self._file.write(data)
            self._digest.update(data)
            self._count += len(part)
            if self._count == self.shard_tokens:
                self._finish_shard()

    def close(self) -> None:
        if self._file is not None:
            self._finish_shard()

    def _finish_shard(self) -> None:
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk before the manifest that names it
        self._file.close()
        self._file = None
        self.shards.append(ShardInfo(file=self._name, tokens=self._count, sha256=self._digest.hexdigest()))
