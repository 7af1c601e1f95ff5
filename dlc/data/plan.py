"""What a run reads, decided once by the driver: the model's vocabulary, each learner's stream, the eval windows.

Two kinds of data reach a learner through the same door (`open_stream`): a byte corpus read into
the driver's memory (data.source stdlib or text, `dlc.data.corpus`), whose per-learner arrays travel
through Ray's object store, and a prepared token dataset (data.source prepared, `dlc.data.tokens`),
of which a learner is sent only a path and its stream index.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlc.config.schema import Recipe
from dlc.data.corpus import BYTE_VOCAB, ByteStream, Split, eval_batches, load_corpus, split_corpus
from dlc.data.manifest import MANIFEST_FILE, Manifest, read_manifest
from dlc.data.tokens import EvalSpec, StreamSpec, TokenStream, local_path, open_dataset, token_eval_batches
from dlc.errors import UserError

StreamSource = np.ndarray | StreamSpec  # a learner's bytes, or where its tokens are
EvalSource = np.ndarray | EvalSpec


@dataclass(frozen=True)
class DataPlan:
    """The held-out split and one source per learner stream (learners first, then the joiners')."""

    eval: EvalSource
    streams: tuple[StreamSource, ...]
    train_tokens: int  # in the corpus or dataset, all streams together
    eval_tokens: int
    bytes_per_token: float  # of the held-out split: bits per byte = loss / ln 2 / bytes_per_token
    tokenizer: str

    @classmethod
    def of_bytes(cls, split: Split) -> DataPlan:
        """A byte corpus's split: one token per byte."""
        trained = sum(len(s) for s in split.streams)
        return cls(split.eval_bytes, split.streams, trained, len(split.eval_bytes), 1.0, "bytes")


def bits_per_byte(loss: float, bytes_per_token: float = 1.0) -> float:
    """Mean cross-entropy in nats per token as bits per byte of text: comparable across tokenizers."""
    return loss / math.log(2) / bytes_per_token


def open_stream(source: StreamSource, batch_size: int, seq_len: int, position: int = 0) -> ByteStream | TokenStream:
    if isinstance(source, StreamSpec):
        return TokenStream(source, batch_size, seq_len, position)
    return ByteStream(source, batch_size, seq_len, position)


def eval_windows(
    source: EvalSource, batches: int, batch_size: int, seq_len: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    if isinstance(source, EvalSpec):
        return token_eval_batches(source, batches, batch_size, seq_len)
    return eval_batches(source, batches, batch_size, seq_len)


def eval_bytes_per_token(source: EvalSource) -> float:
    return source.bytes_per_token if isinstance(source, EvalSpec) else 1.0


def needs_preparing(recipe: Recipe) -> bool:
    """data.prepare describes a dataset that data.path does not hold yet."""
    data = recipe.data
    if data.source != "prepared" or data.prepare is None or data.path is None:
        return False
    path = local_path(data.path)
    if (path / MANIFEST_FILE).is_file():
        _same_tokenizer(read_manifest(path), data.prepare.tokenizer, data.path)
        return False
    return True


def ensure_prepared(recipe: Recipe, on_progress: Callable[..., Any] | None = None) -> Manifest | None:
    """Prepare data.path from data.prepare when it holds no dataset yet, one process at a time; the
    manifest of what it prepared, or None when there was nothing to do."""
    data = recipe.data
    if not needs_preparing(recipe):
        return None
    assert data.path is not None and data.prepare is not None
    path = local_path(data.path)
    from filelock import FileLock

    from dlc.data.prepare import prepare

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / MANIFEST_FILE).is_file():  # another run prepared it while this one waited
            return None
        return prepare(
            data.prepare.sources,
            path,
            tokenizer=data.prepare.tokenizer,
            field=data.prepare.field,
            eval_fraction=data.eval_fraction,
            seed=recipe.run.seed,
            on_progress=on_progress,
        )


def _same_tokenizer(manifest: Manifest, wanted: str, path: str) -> None:
    """A cached dataset prepared with another tokenizer is not what data.prepare asks for."""
    if manifest.tokenizer.spec != wanted:
        raise UserError(
            f"data.path={path!r} holds a dataset prepared with tokenizer {manifest.tokenizer.spec!r}, but "
            f"data.prepare.tokenizer is {wanted!r}: point data.path at another directory, or delete it to "
            "prepare it again"
        )


def resolve_data(recipe: Recipe) -> tuple[Recipe, Manifest | None]:
    """The recipe with model.vocab_size taken from its dataset (or checked against it), and the manifest.

    A byte corpus has 256 tokens; a model may embed more than its data has (padding), never fewer.
    """
    manifest = None
    if recipe.data.source == "prepared":
        assert recipe.data.path is not None  # the recipe's own check
        _, manifest = open_dataset(recipe.data.path)
        have, where = manifest.vocab_size, f"the dataset {recipe.data.path!r} ({manifest.tokenizer.spec})"
    else:
        have, where = BYTE_VOCAB, f"data.source={recipe.data.source} (bytes)"
    wanted = recipe.model.vocab_size
    if wanted is not None and wanted < have:
        raise UserError(
            f"model.vocab_size={wanted} is smaller than the vocabulary of {where}, {have} tokens: drop "
            f"model.vocab_size to take the data's, or set it to at least {have}"
        )
    if wanted is None and manifest is not None:
        recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update={"vocab_size": have})})
    return recipe, manifest


def planned_vocab(recipe: Recipe) -> Recipe:
    """For a plan made before the run (`dlc bandwidth --recipe`): the recipe with the vocabulary its
    data will have, from the dataset when data.path holds one, else data.prepare's bpe:N (at most)."""
    data = recipe.data
    if data.source != "prepared" or recipe.model.vocab_size is not None or data.path is None:
        return recipe
    if (local_path(data.path) / MANIFEST_FILE).is_file():
        return resolve_data(recipe)[0]
    spec = data.prepare.tokenizer if data.prepare else ""
    size = int(spec[4:]) if spec.startswith("bpe:") and spec[4:].isdigit() else None
    if spec == "bytes":
        size = BYTE_VOCAB + 1  # and the end-of-document token
    if size is None:
        return recipe
    return recipe.model_copy(update={"model": recipe.model.model_copy(update={"vocab_size": size})})


def plan_data(recipe: Recipe, manifest: Manifest | None = None) -> DataPlan:
    """Every stream's source and the eval split, checked to hold at least one batch each.

    Streams: one per learner and one per learner that may join mid-run (learners.join_streams).
    """
    count = recipe.learners.count + recipe.learners.join_streams
    batch = max(recipe.learners.resolved(i).batch_size for i in range(recipe.learners.count))
    seq_len = recipe.learners.seq_len
    if recipe.data.source != "prepared":
        corpus = load_corpus(recipe.data)
        return DataPlan.of_bytes(split_corpus(corpus, recipe.data, count, recipe.run.seed, batch * (seq_len + 1) * 2))
    assert recipe.data.path is not None
    path, manifest = open_dataset(recipe.data.path) if manifest is None else (local_path(recipe.data.path), manifest)
    streams = tuple(StreamSpec(str(path), i, count, recipe.data.block_tokens) for i in range(count))
    for spec in streams:
        spec.lanes(manifest.train.tokens, batch, seq_len)  # refuses a stream shorter than one batch, now
    return DataPlan(
        EvalSpec(str(path), manifest.eval.bytes_per_token),
        streams,
        manifest.train.tokens,
        manifest.eval.tokens,
        manifest.eval.bytes_per_token,
        manifest.tokenizer.spec,
    )
