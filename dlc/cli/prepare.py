"""`dlc prepare`: tokenize text once into a prepared dataset (`dlc.data.prepare.prepare`), with a progress bar."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.progress import TaskID

    from dlc.data.manifest import Manifest
    from dlc.data.prepare import Progress


def prepare_command(
    sources: Annotated[
        list[str],
        typer.Argument(
            help="What to read, in order: text files (one document each), .jsonl/.jsonl.gz/.json.gz (one per line), "
            ".parquet (one per row), directories (their files, recursively), globs ('data/**/*.jsonl'), "
            "a saved Hugging Face dataset directory, hf:NAME[:SPLIT] from the hub, or stdlib "
            "(the Python standard library's sources).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Directory to write the dataset into: new, empty, or an unfinished prepare's."
        ),
    ],
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            help="bytes (a token per UTF-8 byte, 257 in all), bpe:N (a byte-level BPE of N tokens trained on "
            "the training split), or a path to a Hugging Face tokenizer.json or a directory holding one.",
        ),
    ] = "bytes",
    field: Annotated[
        str, typer.Option("--field", help="The JSON field, Parquet column or dataset column holding the text.")
    ] = "text",
    eval_fraction: Annotated[
        float,
        typer.Option("--eval-fraction", help="Share of documents held out for evaluation, chosen by document."),
    ] = 0.02,
    seed: Annotated[int, typer.Option("--seed", help="Chooses which documents are held out.")] = 0,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Processes that tokenize. Default: one per CPU. The output is the same for any count.",
            show_default=False,
        ),
    ] = None,
    shard_tokens: Annotated[
        int, typer.Option("--shard-tokens", help="Tokens per shard file; the last shard of a split holds the rest.")
    ] = 2**26,
    eos: Annotated[
        str | None,
        typer.Option(
            "--eos",
            help="The end-of-document token of a tokenizer given as a path. Default: its tokenizer_config.json's "
            "eos_token, else the first of <|endoftext|>, </s>, <eos>, <|end_of_text|> it has.",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the prepared dataset --out holds (it is removed first).")
    ] = False,
) -> None:
    """Tokenize text once into a prepared dataset: token shards, tokenizer.json and manifest.json in --out."""
    from dlc.data.prepare import prepare

    started = time.monotonic()
    with PrepareProgress() as display:
        try:
            manifest = prepare(
                sources,
                out,
                tokenizer=tokenizer,
                field=field,
                eval_fraction=eval_fraction,
                seed=seed,
                workers=workers,
                shard_tokens=shard_tokens,
                eos=eos,
                overwrite=overwrite,
                on_progress=display.update,
            )
        except KeyboardInterrupt:
            display.stop()
            typer.echo(f"interrupted: nothing was kept in {out}", err=True)
            raise typer.Exit(130) from None
    typer.echo(summary(manifest, out, time.monotonic() - started))


def summary(manifest: Manifest, out: Path, wall_s: float) -> str:
    """What a prepare made: documents and tokens per split, the tokenizer, the time and the rate."""
    from dlc.units import format_bytes

    text = manifest.train.text_bytes + manifest.eval.text_bytes
    rate = format_bytes(text / max(wall_s, 1e-9), smallest="B")
    lines = [
        f"prepared {out}: {format_bytes(text, smallest='B')} of text from {len(manifest.sources)} source(s) "
        f"in {wall_s:.1f} s ({rate}/s)",
        f"  {'split':<6}{'documents':>12}{'tokens':>16}{'bytes/token':>13}{'shards':>8}",
    ]
    for name in ("train", "eval"):
        split = manifest.split(name)
        lines.append(
            f"  {name:<6}{split.documents:>12,}{split.tokens:>16,}{split.bytes_per_token:>13.2f}{len(split.shards):>8}"
        )
    tok = manifest.tokenizer
    lines.append(
        f"  tokenizer {tok.spec}: {tok.vocab_size:,} tokens, end of document {tok.eos_token!r} = {tok.eos_id}, "
        f"stored as {manifest.dtype}"
    )
    lines.append(
        f"  {manifest.replaced_characters:,} undecodable character(s) replaced by U+FFFD, "
        f"{manifest.skipped_documents:,} empty document(s) skipped"
    )
    return "\n".join(lines)


class PrepareProgress:
    """A rich progress bar on a terminal (a task per phase); one line per phase otherwise."""

    _DESCRIPTIONS = {"bpe": "BPE sample", "merges": "BPE merges", "tokenize": "tokenizing"}

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.console = Console(stderr=True)
        self.bar = Bar(
            TextColumn("{task.description:<16}"),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[amount]:>21}"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
        self.step: str | None = None  # a phase, or "merges": the BPE's training after its sample is read
        self.task: TaskID | None = None
        self.step_started = 0.0

    def __enter__(self) -> PrepareProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.bar.stop()

    def update(self, progress: Progress) -> None:
        from dlc.cli.options import format_count
        from dlc.units import format_bytes

        step = "merges" if progress.phase == "bpe" and progress.done >= progress.total else progress.phase
        if step != self.step:
            if self.task is not None:  # the step before is over
                total = self.bar.tasks[self.task].total or 1
                self.bar.update(self.task, total=total, completed=total)
                if step == "merges":  # the sample's last count comes with the merges' start
                    self.bar.update(self.task, amount=f"{format_bytes(progress.done)} / {format_bytes(progress.total)}")
            self.step, self.step_started = step, time.monotonic()
            description = self._DESCRIPTIONS[step]
            if step == "tokenize" and progress.workers > 1:
                description += f" ({progress.workers} workers)"
            measure = None if step == "merges" else progress.total  # the merges have no measure: a pulse
            self.task = self.bar.add_task(description, total=measure, amount="", rate="")
            if not self.console.is_terminal:
                what = {"bpe": " of training text to read", "merges": "", "tokenize": " of sources"}[step]
                self.console.print(description + (f": {format_bytes(progress.total)}{what}" if what else ""))
        assert self.task is not None
        if step == "merges":
            return
        elapsed = max(time.monotonic() - self.step_started, 1e-9)
        rate = f"{format_bytes(progress.text_bytes / elapsed)}/s"
        if step == "tokenize":
            rate += f", {format_count(progress.tokens / elapsed)} tok/s"
        self.bar.update(
            self.task,
            completed=progress.done,
            amount=f"{format_bytes(progress.done)} / {format_bytes(progress.total)}",
            rate=rate,
        )
