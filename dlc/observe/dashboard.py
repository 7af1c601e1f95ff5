"""`dlc status`, drawing: a snapshot as a Rich frame, and the live loop that redraws it.

`render` is a pure function of the snapshot dict from `dlc.observe.reader.RunReader`, so tests draw
fixture snapshots on a recording console and assert on the text.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dlc.observe.console import fmt_duration, fmt_float
from dlc.observe.reader import RunReader, mean_adopt_lag
from dlc.units import format_bytes

REFRESH_S = 0.5
NARROW = 100  # columns: below this the table tightens and the syncer and loss panels stack
BLOCKS = "▁▂▃▄▅▆▇█"
STATE_STYLE = {
    "training": "green",
    "slow": "yellow",
    "stalled": "bold yellow",
    "dead": "bold red",
    "leaving": "bold magenta",
    "preempted": "magenta",
    "failed": "red",
    "restarting": "magenta",
    "rejoining": "cyan",
    "left": "dim",
    "interrupted": "yellow",
    "starting": "dim",
    "spare": "dim",
    "running": "green",
    "waiting": "cyan",
}


def meter_bytes(n: float | None, digits: int = 2) -> str:
    """A byte count as the panels show it: GiB at most, whole bytes at least, no thousands separator."""
    return format_bytes(n, digits, largest="GiB", smallest="B", grouped=False)


def sparkline(points: list[tuple[float, float]], width: int, t0: float, t1: float, lo: float, hi: float) -> str:
    """One character per time bin: the latest value at the bin's right edge, as a block height."""
    cells, j, last = [], 0, None
    for k in range(width):
        edge = t0 + (t1 - t0) * (k + 1) / width
        while j < len(points) and points[j][0] <= edge:
            last = points[j][1]
            j += 1
        if last is None:
            cells.append(" ")
        elif hi > lo:
            cells.append(BLOCKS[min(len(BLOCKS) - 1, int((last - lo) / (hi - lo) * len(BLOCKS)))])
        else:
            cells.append(BLOCKS[len(BLOCKS) // 2])
    return "".join(cells)


def render(snap: dict[str, Any], interactive: bool = False) -> RenderableType:
    """The whole frame for one snapshot; `interactive` adds the key hint of the live loop."""
    parts: list[RenderableType] = [_header(snap), Fit(lambda width: _learner_table(snap, narrow=width < NARROW))]
    if not snap["learners"]:
        parts.append(Text("  no learner has reported yet", style="dim"))
    parts.append(Fit(lambda width: _middle(snap, narrow=width < NARROW)))
    return Group(*parts, _feed_panel(snap), _footer(snap, interactive))


class Fit:
    """Builds its renderable for the width Rich gives it (narrow terminals get a tighter layout)."""

    def __init__(self, build: Callable[[int], RenderableType]) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width)


def _middle(snap: dict[str, Any], narrow: bool) -> RenderableType:
    if narrow:  # stacked: side by side, both panels would wrap every line
        return Group(_syncer_panel(snap), _loss_panel(snap))
    middle = Table.grid(expand=True, padding=(0, 1))
    middle.add_column(ratio=4)
    middle.add_column(ratio=3)
    middle.add_row(_syncer_panel(snap), _loss_panel(snap))
    return middle


def _state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, "blue"))


def _header(snap: dict[str, Any]) -> Panel:
    title = Text.assemble(
        (str(snap["run"]), "bold"), f" · {snap.get('algorithm') or '-'} · ", _state_text(snap["state"])
    )
    progress, rate, initial, goodput = (
        snap.get(k) for k in ("progress", "tokens_per_s", "eval_loss_initial", "goodput")
    )
    first = [
        f"elapsed {fmt_duration(snap.get('elapsed_s'))}",
        f"step {fmt_float(snap.get('step'), 1)}" + ("" if progress is None else f" ({progress:.0%})"),
        f"tokens {snap['tokens']:,}",
    ]
    first += [] if rate is None else [f"{rate:,.0f} tok/s"]
    # Model FLOPs utilisation where the devices' peak is known (never on a CPU: unknown, not a guess).
    first += [] if snap.get("mfu") is None else [f"MFU {snap['mfu']:.1%}"]
    first += [] if snap.get("eta_s") is None else [f"ETA {fmt_duration(snap['eta_s'])}"]
    second = [
        f"eval loss {fmt_float(snap.get('eval_loss'))}" + ("" if initial is None else f" (from {initial:.3f})"),
        f"bits/byte {fmt_float(snap.get('eval_bpb'))}",
        f"train loss {fmt_float(snap.get('train_loss'))}",
        f"goodput {'-' if goodput is None else f'{goodput:.1%}'}",
    ]
    badput = {k: v for k, v in (snap.get("badput") or {}).items() if isinstance(v, int | float) and v > 0}
    if badput:
        second.append("badput " + ", ".join(f"{k} {fmt_duration(v)}" for k, v in sorted(badput.items())))
    third = [] if not snap.get("devices") else [f"devices {snap['devices']}"]
    body = Fit(lambda width: Text("\n".join(_flow(first, width) + _flow(second, width) + _flow(third, width))))
    return Panel(body, title=title, title_align="left", subtitle=snap["run_dir"], subtitle_align="right")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _flow(items: list[str], width: int, gap: str = "   ") -> list[str]:
    """Items packed into lines of at most `width`, never split inside an item."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(gap) + len(item) <= width:
            lines[-1] += gap + item
        else:
            lines.append(item)
    return lines


def _learner_table(snap: dict[str, Any], narrow: bool = False) -> Table:
    table = Table(box=None, padding=(0, 1), collapse_padding=narrow, header_style="bold dim", pad_edge=False)
    with_goodput = any(row.get("goodput") is not None for row in snap["learners"])
    # Learners on different devices (mixed hardware): each row says which; otherwise the header does.
    with_device = len({row["device"] for row in snap["learners"] if row.get("device")}) > 1
    # Which node each learner runs on, once the learners run on more than one.
    with_node = len({row.get("node") for row in snap["learners"] if row.get("node")}) > 1
    columns = ["id", "state", "step", "tokens", "tok/s", "loss", "last push", "stale", "restarts", "rejected"]
    columns += ["device"] if with_device else []
    with_mfu = any(row.get("mfu") is not None for row in snap["learners"])
    extra = (*(["goodput"] if with_goodput else []), *(["mfu"] if with_mfu else []), *(["node"] if with_node else []))
    for name in (*columns, *extra):
        # The state is what a glance looks for: never cut it.
        width = max(len(name), 10) if name == "state" else len(name)
        table.add_column(name, justify="left" if name in ("state", "node") else "right", no_wrap=True, min_width=width)
    for row in snap["learners"]:
        age, goodput, stale, rate = (row.get(k) for k in ("last_push_age_s", "goodput", "staleness", "tokens_per_s"))
        table.add_row(
            str(row["id"]),
            _state_cell(row),
            str(row["step"]),
            f"{row['tokens']:,}",
            "-" if rate is None else f"{rate:,.0f}",
            fmt_float(row.get("loss")),
            "-" if age is None else fmt_duration(age) if age >= 60 else f"{age:.1f}s",
            "-" if stale is None else str(stale),
            str(row["restarts"]),
            str(row["rejected"]),
            *([short_device(row.get("device"))] if with_device else []),
            *(["-" if goodput is None else f"{goodput:.1%}"] if with_goodput else []),
            *([_percent(row.get("mfu"))] if with_mfu else []),
            *([row.get("node") or "-"] if with_node else []),
        )
    for row in snap.get("spares", []):
        blank = ["-"] * (len(columns) - 2 + len(extra))
        table.add_row(Text(str(row["id"]), style="dim"), _state_cell(row), *blank)
    return table


def short_device(label: str | None) -> str:
    """A device label fit for a table cell: 'gpu: H100 80GB HBM3', 'cpu'."""
    return "-" if not label else label.replace(": NVIDIA ", ": ")


def _state_cell(row: dict[str, Any]) -> Text:
    """The state and, while a learner starts, what it is doing and for how long so far:
    "restarting: starting process 2.1s", "starting: loading compiled step 0.8s", "spare: ready"."""
    text = _state_text(row["state"])
    phase = row.get("phase")
    if phase and row["state"] in ("starting", "spare", "restarting", "rejoining") and phase != row["state"]:
        seconds = row.get("phase_s")
        timed = phase != "ready" and isinstance(seconds, int | float)
        text.append(f": {phase}" + (f" {seconds:.1f}s" if timed else ""), style="dim")
    return text


def _syncer_panel(snap: dict[str, Any]) -> Panel:
    s, dp = snap["syncer"], snap["dp_equivalent"]
    rejections = s["rejections"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(rejections.items()))
    quorum = "-" if s.get("quorum") is None else s["quorum"]
    grace = fmt_float(s.get("grace_window_s"), 2)
    lines = [
        f"rounds closed {s['rounds_closed']:,}   quorum {quorum}   grace window {grace} s",
        f"contributors/round {fmt_float(s.get('mean_contributors'), 2)}   healthy {_ids(s.get('healthy'))}",
        f"merge lag {fmt_float(mean_adopt_lag(snap.get('learners') or []), 2)} steps, push to adoption",
        f"rejected {sum(rejections.values())}" + (f" ({reasons})" if reasons else ""),
        f"sent up {meter_bytes(s['bytes_up'])} ({meter_bytes(s.get('bytes_up_per_s'), 1)}/s)",
        f"sent down {meter_bytes(s['bytes_down'])} ({meter_bytes(s.get('bytes_down_per_s'), 1)}/s)",
    ]
    each_way = dp.get("bytes_each_way")
    if each_way is None:
        lines.append("data-parallel equivalent: - (the run recorded no parameter count)")
    else:
        up, down = s["bytes_up"], s["bytes_down"]
        lines.append(f"data-parallel: {meter_bytes(each_way)} each way")
        if up and down:
            both, each = 2 * each_way / (up + down), (each_way / up, each_way / down)
            lines.append(f"  {both:,.0f}x ours in all (up {each[0]:,.0f}x, down {each[1]:,.0f}x)")
        elif up:
            lines.append(f"  {each_way / up:,.0f}x our up")
    return Panel("\n".join(lines), title="syncer", title_align="left")


def _ids(values: Any) -> str:
    return ",".join(str(v) for v in values) if isinstance(values, list) and values else "-"


class LossChart:
    """Eval and mean train loss as sparklines, as wide as the space Rich gives it."""

    def __init__(self, history: dict[str, list[tuple[float, float]]]) -> None:
        self.series = [("eval ", history["eval"], "magenta"), ("train", history["train"], "yellow")]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        points = [p for _, pts, _ in self.series for p in pts]
        t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
        lo, hi = min(v for _, v in points), max(v for _, v in points)
        width = max(8, options.max_width - 17)  # name, a space, the chart, " 5.43→3.10"
        body = Text()
        for name, pts, style in self.series:
            line = sparkline([(t, v) for t, v in pts], width, t0, t1, lo, hi) if pts else " " * width
            ends = f" {pts[0][1]:.2f}→{pts[-1][1]:.2f}" if pts else " -"
            body.append(f"{name} ").append(line, style=style).append(ends + "\n")
        span = fmt_duration(t1 - t0)
        body.append(f"      0:00{' ' * max(1, width - 4 - len(span))}{span}", style="dim")
        yield body


def _loss_panel(snap: dict[str, Any]) -> Panel:
    history = snap["loss_history"]
    points = [v for series in history.values() for _, v in series]
    if not points:
        return Panel(Text("no losses logged yet", style="dim"), title="loss", title_align="left")
    return Panel(
        LossChart(history), title=f"loss over time ({min(points):.2f} to {max(points):.2f})", title_align="left"
    )


PHASE_STYLE = {"injected": "red", "detected": "yellow", "recovered": "green", "first_push": "green", "refused": "dim"}


def _feed_panel(snap: dict[str, Any]) -> Panel:
    lines: list[Text] = []
    for fault in snap["faults"]:
        t = fault.get("t")
        stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "--:--:--"
        extras = "  ".join(
            f"{k}={v:g}"
            for k, v in fault.items()
            if k not in ("t", "learner") and isinstance(v, int | float) and not isinstance(v, bool)
        )
        phase = str(fault.get("phase", ""))
        line = Text(f"{stamp}  {str(fault.get('fault', '?')):<12} {str(fault.get('target', '-')):<10} ")
        line.append(f"{phase:<12}", style=PHASE_STYLE.get(phase, ""))
        line.append(f" {fault.get('detail', '')}  {extras}".rstrip())
        lines.append(line)
    if not snap["faults"]:
        lines.append(Text("no faults recorded", style="dim"))
    if snap.get("error"):
        lines.append(Text(f"run {snap['state']}: {str(snap['error']).splitlines()[0]}", style="bold red"))
    body = Text("\n").join(lines)
    body.no_wrap, body.overflow = True, "ellipsis"  # one line per entry: the feed keeps its height
    return Panel(body, title="faults and recoveries", title_align="left")


def _footer(snap: dict[str, Any], interactive: bool) -> Text:
    text = Text()
    for warning in snap["warnings"]:
        text.append(f"! {warning}\n", style="yellow")
    age = snap.get("status_age_s")
    if snap["live"]:
        text.append(f"updated {age:.1f}s ago" + (" · q or Ctrl-C quits" if interactive else ""), style="dim")
    elif snap.get("updated_at") is not None:
        text.append(
            f"last update {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snap['updated_at']))}", style="dim"
        )
    text.rstrip()
    return text


# -- the live loop -----------------------------------------------------------------------------


@contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """Yields read(timeout) -> typed keys. Puts a terminal in cbreak mode, restores it on exit."""
    if not sys.stdin.isatty():

        def wait(timeout: float) -> str:
            time.sleep(timeout)
            return ""

        yield wait
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # keys arrive one at a time; Ctrl-C still raises KeyboardInterrupt

    def read(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 64).decode(errors="ignore") if ready else ""

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def make_console() -> Console:
    """Rich's own on a terminal; 120 columns when piped (unless COLUMNS says otherwise)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=120)
    return console


def show(path: Path, once: bool = False, console: Console | None = None) -> None:
    """Print one frame (`once`, or when stdout is not a terminal), or redraw until q or Ctrl-C."""
    console = console or make_console()
    reader = RunReader(path)
    if once or not console.is_terminal:
        console.print(render(reader.snapshot()))
        return
    try:
        with _keys() as read_keys, Live(render(reader.snapshot(), True), console=console, auto_refresh=False) as live:
            while "q" not in read_keys(REFRESH_S).lower():
                live.update(render(reader.snapshot(), True), refresh=True)
    except KeyboardInterrupt:
        pass
