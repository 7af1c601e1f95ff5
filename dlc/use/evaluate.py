"""A trained model's loss and bits per byte on text: the run's held-out split, a prepared dataset, or text.

The run's held-out split is read with the windows its evaluations used, so the figure equals the
run's own. Other data is read whole, in windows of learners.seq_len tokens laid end to end: a
prepared dataset's held-out split (made with the run's tokenizer), or any sources `dlc prepare`
reads (text files, JSONL, Parquet, ...), tokenized with the run's tokenizer, each document ended
by the end-of-document token where the model has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlc.core.shapes import vocab_size
from dlc.core.steps import make_eval_step
from dlc.data.manifest import MANIFEST_FILE
from dlc.data.plan import bits_per_byte, eval_bytes_per_token, eval_windows, plan_data
from dlc.data.sources import Reading, resolve_sources
from dlc.data.tokens import TokenArray, open_dataset
from dlc.errors import UserError
from dlc.run.files import is_run_dir
from dlc.use.run_model import RunModel, run_recipe, run_tokenizer

Windows = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class EvalData:
    """Batches of (inputs, targets) and the UTF-8 bytes of text each token stands for, on average."""

    name: str
    batches: Windows
    bytes_per_token: float


def held_out(model: RunModel) -> EvalData:
    """The run's held-out split, in the windows the run's evaluations read."""
    recipe = model.recipe
    plan = plan_data(recipe)
    batches = eval_windows(plan.eval, recipe.eval.batches, recipe.eval.batch_size, recipe.learners.seq_len)
    return EvalData("the run's held-out split", batches, eval_bytes_per_token(plan.eval))


def other_data(model: RunModel, paths: list[str], field: str) -> EvalData:
    """Another run's held-out split (a run directory), a prepared dataset's (a directory with
    manifest.json), or sources read and tokenized here."""
    if len(paths) == 1 and is_run_dir(Path(paths[0]).expanduser()):
        other = run_recipe(Path(paths[0]).expanduser())
        tokenizer, _ = run_tokenizer(other)
        if tokenizer.spec != model.tokenizer.spec or vocab_size(other.model) > vocab_size(model.recipe.model):
            raise UserError(
                f"--data {paths[0]!r} is a run on {tokenizer.spec!r} tokens, the model reads {model.tokenizer.spec!r} "
                "tokens: pass the text itself, which is tokenized the model's way"
            )
        plan = plan_data(other)
        batches = eval_windows(plan.eval, other.eval.batches, other.eval.batch_size, model.recipe.learners.seq_len)
        return EvalData(f"the held-out split of run {paths[0]}", batches, eval_bytes_per_token(plan.eval))
    if len(paths) == 1 and (Path(paths[0]).expanduser() / MANIFEST_FILE).is_file():
        directory, manifest = open_dataset(paths[0], "--data")
        embedded = vocab_size(model.recipe.model)
        if manifest.vocab_size > embedded:
            raise UserError(
                f"--data {paths[0]!r} holds tokens of a vocabulary of {manifest.vocab_size} "
                f"({manifest.tokenizer.spec}), more than the model's {embedded}: "
                "evaluate it with a model trained on that tokenizer, or pass the text itself"
            )
        if manifest.tokenizer.spec != model.tokenizer.spec:
            raise UserError(
                f"--data {paths[0]!r} was prepared with tokenizer {manifest.tokenizer.spec!r}, the model reads "
                f"{model.tokenizer.spec!r} tokens: pass the text itself, which is tokenized the model's way"
            )
        tokens = TokenArray(directory, manifest, "eval").read(0, manifest.eval.tokens)
        return EvalData(f"the held-out split of {paths[0]}", _windows(model, tokens), manifest.eval.bytes_per_token)
    sources = resolve_sources(paths, field)
    reading, pieces, text_bytes = Reading(), [], 0
    for source in sources:
        for text in source.documents(reading):
            if not text:
                continue
            ids = model.tokenizer.encode_batch([text])[0]
            pieces.append(np.asarray(ids, dtype=np.int32))
            if model.stop_token is not None:
                pieces.append(np.array([model.stop_token], dtype=np.int32))
            text_bytes += len(text.encode("utf-8"))
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return EvalData(", ".join(paths), _windows(model, tokens), text_bytes / max(len(tokens), 1))


def _windows(model: RunModel, tokens: np.ndarray) -> Windows:
    """Windows of seq_len + 1 tokens, each starting where the last one's inputs ended, batched."""
    seq_len, batch = model.recipe.learners.seq_len, model.recipe.eval.batch_size
    count = (len(tokens) - 1) // seq_len
    if count < 1:
        raise UserError(
            f"the data holds {len(tokens)} tokens, fewer than one window of {seq_len + 1} (learners.seq_len + 1): "
            "pass more text"
        )
    starts = np.arange(count) * seq_len
    windows = tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int32)
    return [(w[:, :-1], w[:, 1:]) for w in (windows[i : i + batch] for i in range(0, count, batch))]


def evaluate(model: RunModel, data: EvalData, progress: Callable[[int, int], Any] | None = None) -> dict[str, Any]:
    """Mean cross-entropy (nats per token) over every window, and bits per byte of the text."""
    step = make_eval_step(model.graphdef)
    total, tokens = 0.0, 0
    for i, (x, y) in enumerate(data.batches):
        total += float(step(model.params, x, y)) * x.size
        tokens += x.size
        if progress is not None:
            progress(i + 1, len(data.batches))
    loss = total / tokens
    return {
        "loss": loss,
        "bits_per_byte": bits_per_byte(loss, data.bytes_per_token),
        "tokens": tokens,
        "bytes_per_token": data.bytes_per_token,
        "data": data.name,
        "model": model.source,
    }
