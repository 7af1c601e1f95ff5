"""`dlc sample`: text from a trained model, streamed to the terminal as it is generated."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dlc.errors import UserError

if TYPE_CHECKING:
    from dlc.data.tokenizer import Tokenizer


# The model a command reads from a run directory (or an export): `dlc sample`, `dlc eval` and `dlc export` share these.
RunArgument = Annotated[
    Path | None,
    typer.Argument(help="Run directory. Default: the most recently updated run under ./runs.", show_default=False),
]
ModelArgument = Annotated[
    Path | None,
    typer.Argument(
        help="Run directory, or a directory dlc export wrote. Default: the most recently updated run under ./runs.",
        show_default=False,
    ),
]
CheckpointOption = Annotated[
    int | None,
    typer.Option("--checkpoint", help="Which checkpoint (its step). Default: the newest.", show_default=False),
]
LearnerOption = Annotated[
    int | None,
    typer.Option(
        "--learner", help="Learner I's own model. Default: the global model the syncer holds.", show_default=False
    ),
]


def sample_command(
    run: ModelArgument = None,
    prompt: Annotated[
        str,
        typer.Option(
            "--prompt",
            "-p",
            help="Text to continue. Default: the start of a document (a prepared dataset's end-of-document "
            "token; a newline for a byte corpus).",
        ),
    ] = "",
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens to generate at most.")] = 200,
    temperature: Annotated[
        float,
        typer.Option("--temperature", "-t", help="Sampling temperature; 0 is greedy (the likeliest token)."),
    ] = 0.8,
    top_k: Annotated[
        int | None,
        typer.Option("--top-k", help="Sample among the k likeliest tokens only. Default: all.", show_default=False),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="The same seed gives the same text.")] = 0,
    checkpoint: CheckpointOption = None,
    learner: LearnerOption = None,
) -> None:
    """Generate text from a run's model, with the run's tokenizer; works while the run trains."""
    import math

    if max_tokens < 1:
        raise UserError(f"--max-tokens={max_tokens} must be at least 1")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise UserError(f"--temperature={temperature} must be a finite number, 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise UserError(f"--top-k={top_k} must be at least 1 (or left out: every token)")
    if seed < 0:
        raise UserError(f"--seed={seed} must be 0 or more")

    from dlc.core.decode import generate
    from dlc.use.export import load_model

    path, model = load_model(run, checkpoint, learner)
    context = model.recipe.model.context_len
    if prompt:
        ids = [int(i) for i in model.tokenizer.encode_batch([prompt])[0]]
    else:
        ids = [model.stop_token] if model.stop_token is not None else [ord("\n")]
    if len(ids) >= context:
        raise UserError(
            f"--prompt is {len(ids)} tokens, and the model reads {context} (model.context_len) with room for one "
            "more: shorten the prompt"
        )
    typer.echo(f"{path}: {model.source} ({model.tokenizer.spec}), up to {max_tokens} tokens", err=True)
    stream = TextStream(model.tokenizer)
    sys.stdout.write(prompt)
    sys.stdout.flush()
    cfg = model.recipe.model
    for token in generate(cfg, model.params, ids, max_tokens, temperature, top_k, seed, model.stop_token):
        stream.add(token)
    stream.close()


class TextStream:
    """New tokens to stdout as text, as soon as they decode to whole characters.

    A byte-level token may end inside a multi-byte character: the text of everything after the
    prompt is decoded again at every token, and trailing replacement characters (an incomplete
    character so far) wait until the bytes after them arrive, or the end.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = 0

    def add(self, token: int) -> None:
        self.ids.append(token)
        self._write(self.tokenizer.decode(self.ids).rstrip("\ufffd"))

    def close(self) -> None:
        self._write(self.tokenizer.decode(self.ids) if self.ids else "")
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _write(self, text: str) -> None:
        if len(text) > self.shown:
            sys.stdout.write(text[self.shown :])
            sys.stdout.flush()
            self.shown = len(text)
