"""Tables the commands print: Rich on a terminal, aligned plain text otherwise."""

from __future__ import annotations

import sys

import typer


def print_table(title: str, header: list[str], rows: list[list[str]], footer: str = "") -> None:
    """A Rich table on a terminal, tab-free aligned plain text otherwise."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console = Console()
        console.print(table)
        if footer:
            console.print(footer, style="dim", highlight=False)
        return
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    typer.echo(title)
    for row in [header, *rows]:
        typer.echo(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    if footer:
        typer.echo(footer)
