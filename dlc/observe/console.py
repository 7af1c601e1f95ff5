"""What the `dlc train` driver shows while it runs: a live panel on a TTY, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from dlc.units import MIB


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_float(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class ProgressView:
    """Renders status snapshots. Use as a context manager around the training loop."""

    def __init__(self, console: Console | None = None, log_every_steps: int = 50) -> None:
        self.console = console or Console(stderr=True)
        self.live_mode = self.console.is_terminal and sys.stderr.isatty()
        self.log_every_steps = log_every_steps
        self._live: Live | None = None
        self._last_logged_step = -1

    def __enter__(self) -> ProgressView:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def message(self, text: str) -> None:
        """A one-off line (a checkpoint, a resume) above the live panel, or in the log."""
        if self._live is not None:
            self._live.console.print(text, highlight=False)
        else:
            print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def update(self, snap: dict[str, Any]) -> None:
        if self._live is not None:
            self._live.update(self._render(snap))
            return
        step = snap.get("step", 0)
        if step // self.log_every_steps != self._last_logged_step // self.log_every_steps:
            self._last_logged_step = step
            print(self._line(snap), file=sys.stderr, flush=True)

    @staticmethod
    def _line(snap: dict[str, Any]) -> str:
        return (
            f"[{time.strftime('%H:%M:%S')}] step {snap.get('step', 0)}"
            f" tokens {snap.get('tokens', 0):,} loss {fmt_float(snap.get('train_loss'))}"
            f" eval_loss {fmt_float(snap.get('eval_loss'))} eval_bpb {fmt_float(snap.get('eval_bpb'))}"
            f" throughput(tok/s) {snap.get('tokens_per_s', 0):,.0f} eta {fmt_duration(snap.get('eta_s'))}"
        )

    @staticmethod
    def _render(snap: dict[str, Any]) -> Group:
        head = Table.grid(padding=(0, 2))
        for _ in range(6):
            head.add_column()
        done = snap.get("progress", 0.0)
        filled = int(24 * done)
        bar = "[green]" + "━" * filled + "[/green][dim]" + "━" * (24 - filled) + "[/dim]"
        head.add_row(
            f"[bold]{snap.get('run', '')}[/bold] ({snap.get('algorithm', '')})",
            f"{bar} {done:5.1%}",
            f"elapsed {fmt_duration(snap.get('elapsed_s'))}",
            f"ETA {fmt_duration(snap.get('eta_s'))}",
            "",
            "",
        )
        head.add_row(
            f"step [cyan]{snap.get('step', 0)}[/cyan]",
            f"tokens {snap.get('tokens', 0):,}",
            f"loss [yellow]{fmt_float(snap.get('train_loss'))}[/yellow]",
            f"eval loss [magenta]{fmt_float(snap.get('eval_loss'))}[/magenta]",
            f"bpb {fmt_float(snap.get('eval_bpb'))}",
            f"{snap.get('tokens_per_s', 0):,.0f} tok/s",
        )
        learners = Table(box=None, padding=(0, 2), header_style="bold dim")
        for column in ("learner", "state", "step", "tokens", "tok/s", "loss", "last push"):
            learners.add_column(column, justify="right" if column not in ("state",) else "left")
        for row in snap.get("learners", []):
            age = row.get("last_push_age_s")
            learners.add_row(
                str(row.get("id")),
                str(row.get("state")),
                str(row.get("step", 0)),
                f"{row.get('tokens', 0):,}",
                f"{row.get('tokens_per_s', 0):,.0f}",
                fmt_float(row.get("loss")),
                "-" if age is None else f"{age:.1f}s ago",
            )
        sync = snap.get("syncer") or {}
        rejected = sum((sync.get("rejections") or {}).values())
        syncer_line = (
            f"syncer: {sync.get('rounds_closed', 0)} rounds, "
            f"{sync.get('mean_contributors', 0):.2f} contributors/round, "
            f"grace {sync.get('grace_window_s', 0):.2f}s, quorum {sync.get('quorum', '-')}, rejected {rejected}, "
            f"up {sync.get('bytes_up', 0) / MIB:.2f} MiB, down {sync.get('bytes_down', 0) / MIB:.2f} MiB"
        )
        return Group(head, learners, syncer_line)
