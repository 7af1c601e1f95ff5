"""`dlc eval`: a trained model's loss and bits per byte on its held-out split or on other text."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from dlc.cli.sample import CheckpointOption, LearnerOption, ModelArgument


def eval_command(
    run: ModelArgument = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            help="What to evaluate on (repeatable): another run directory or a prepared dataset (its held-out "
            "split), or sources as dlc prepare reads them (text files, globs, JSONL, Parquet, ...), tokenized "
            "with the run's tokenizer. Default: the run's own held-out split, in the windows its evaluations read.",
            show_default=False,
        ),
    ] = None,
    field: Annotated[str, typer.Option("--field", help="The text field of JSONL and Parquet --data.")] = "text",
    checkpoint: CheckpointOption = None,
    learner: LearnerOption = None,
) -> None:
    """Loss (nats per token) and bits per byte of a run's model; the last line of stdout is JSON."""
    from rich.console import Console
    from rich.progress import Progress

    from dlc.use.evaluate import evaluate, held_out, other_data
    from dlc.use.export import load_model

    path, model = load_model(run, checkpoint, learner)
    target = other_data(model, data, field) if data else held_out(model)
    console = Console(stderr=True)
    console.print(f"{path}: {model.source}, on {target.name}")
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("evaluating", total=len(target.batches))
        result = evaluate(model, target, lambda done, total: bar.update(task, completed=done))
    console.print(
        f"loss {result['loss']:.4f} nats/token, {result['bits_per_byte']:.4f} bits/byte "
        f"({result['tokens']:,} tokens, {result['bytes_per_token']:.2f} bytes/token)"
    )
    typer.echo(json.dumps({**result, "run": str(path)}))
