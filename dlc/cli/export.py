"""`dlc export`: a run's model as a Hugging Face checkpoint (GPT-2's or Llama's layout) with its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dlc.cli.sample import CheckpointOption, LearnerOption, RunArgument


def export_command(
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Directory to create: model.safetensors, config.json, the tokenizer."),
    ],
    run: RunArgument = None,
    checkpoint: CheckpointOption = None,
    learner: LearnerOption = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an earlier export in --out.")] = False,
) -> None:
    """Write a run's model where transformers reads it (GPT2LMHeadModel, LlamaForCausalLM); works while it trains."""
    from dlc.run.files import resolve_run
    from dlc.units import format_bytes
    from dlc.use.export import export_model
    from dlc.use.run_model import load_run_model

    path = resolve_run(run)
    model = load_run_model(path, checkpoint, learner)
    done = export_model(model, out, overwrite)
    typer.echo(f"{path}: {model.source}")
    typer.echo(
        f"exported {done.params:,} parameters ({done.tensors} tensors) as {done.architecture} with the "
        f"{model.tokenizer.spec} tokenizer to {done.path}"
    )
    for name, size in done.files.items():
        typer.echo(f"  {name:<24} {format_bytes(size)}")
