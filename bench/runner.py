"""What every benchmark shares: running the real CLI, running in-process trainings in worker
processes that end with the bench (`pool`), and recording a result table in RESULTS.md.

A bench script builds `dlc train` command lines (`train_command`), runs each in a process group of
its own with its output in a log file beside the run directory (`run`, `train`), reads what chaos
logged about each kill (`kill_timings`), and writes its table into bench/RESULTS.md (`record`)
under a heading of its own, with the command, commit, machine and date, replacing the table an
earlier invocation of the same benchmark wrote there: RESULTS.md holds today's figures and git
holds their history.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal, Protocol

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
SETTLED = "## Settled questions"  # a hand-written section that stays last: new tables go before it

# A bench run from another checkout (a clean clone of the commit under test) imports that
# checkout's dlc, as the `dlc train` it starts there does, not the one installed in the environment.
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))


_T0 = time.monotonic()  # when the bench started: its progress lines count from here


def say(message: str) -> None:
    """A progress line on stderr, stamped with the bench's elapsed time."""
    elapsed = int(time.monotonic() - _T0)
    print(f"[{elapsed // 60:3d}m{elapsed % 60:02d}s] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def refusing_bad_input() -> Iterator[None]:
    """A bad option that a bench's checks refuse (dlc's UserError, raised before anything trains)
    ends the bench with one `error:` line and exit status 2, as dlc's own commands do."""
    from dlc.errors import UserError

    try:
        yield
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def numbers(
    flag: str, text: str, kind: type[int] | type[float], sign: Literal["positive", "non-negative", "any"] = "positive"
) -> list[Any]:
    """A comma-separated option's numbers, each above 0 (`sign` "positive"), at least 0 ("non-negative")
    or any; anything else is dlc's UserError, which `refusing_bad_input` turns into one line and exit 2."""
    from dlc.errors import UserError

    try:
        values = [kind(item) for item in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} {text!r}: give {kind.__name__} values separated by commas, as in {flag} 1,2") from None
    if sign == "positive" and any(not math.isfinite(v) or v <= 0 for v in values):
        raise UserError(f"{flag} {text!r}: every value must be a positive number")
    if sign == "non-negative" and any(not math.isfinite(v) or v < 0 for v in values):
        raise UserError(f"{flag} {text!r}: every value must be 0 or a positive number")
    return values


def saved_json(path: str) -> Any:
    """A bench's saved results (`--from-json`); a file that is missing or not JSON is dlc's UserError,
    which `refusing_bad_input` turns into one line and exit 2."""
    from dlc.errors import UserError

    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(
            f"--from-json {path}: cannot read it ({exc.strerror}); give a results file a run saved"
        ) from None
    except ValueError as exc:
        raise UserError(f"--from-json {path}: not a results file, it is not JSON ({exc})") from None


# ---------------------------------------------------------------------------------------------
# Running trainings in this process's workers


def workers(text: str) -> int:
    """An argparse type for `--jobs`: how many trainings at once, a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of trainings at once (a whole number, at least 1)")
    return value


def pool(jobs: int) -> ProcessPoolExecutor:
    """Worker processes for in-process trainings, `jobs` at once (spawned: jax's threads do not survive
    a fork). Each worker ends itself within a second of its bench going away, however the bench
    ended: a bench stopped with `kill` would otherwise leave its trainings running, unseen, on the
    cores the next bench measures on."""
    return ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_exit_with, initargs=(os.getpid(),))


def _exit_with(parent: int) -> None:
    """A pool worker's initializer: a thread that ends the worker once `parent` is no longer its parent."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-bench", daemon=True).start()


# ---------------------------------------------------------------------------------------------
# Running the CLI


def train_command(
    recipe: str, run_dir: Path, *overrides: str, plan: Path | None = None, fresh: bool = False
) -> list[str]:
    """`dlc train RECIPE run.dir=RUN_DIR OVERRIDES...`, from this checkout's code; of overrides that set
    one key again (a bench's defaults, then what its caller chose), the last is kept."""
    from dlc.config.load import replaced_overrides

    layered: list[str] = [f"run.dir={run_dir}"]
    for item in overrides:
        layered = replaced_overrides(layered, item)
    cmd = [sys.executable, "-m", "dlc.cli", "train", recipe, *layered]
    if fresh:  # a run directory reused from an earlier bench must not resume its checkpoints
        cmd.append("--fresh")
    return cmd + (["--chaos", str(plan)] if plan is not None else [])


class Watcher(Protocol):
    """Something that follows a running command (`proc_cpu.Sampler`) until told to stop."""

    def stop(self) -> None: ...


@dataclass
class Finished:
    """How a command ended: its exit code (None: killed past its timeout) and its seconds."""

    cmd: list[str]
    log: Path
    returncode: int | None
    wall_s: float
    watcher: Any = None  # what `run`'s watch made of the process, stopped

    def tail(self, chars: int) -> str:
        return self.log.read_text(errors="replace").strip()[-chars:] if self.log.exists() else ""

    def error(self) -> str | None:
        """None if it succeeded, else one line saying how it failed and where its log is."""
        if self.returncode == 0:
            return None
        if self.returncode is None:
            return f"timed out after {self.wall_s:.0f} s (log: {self.log})"
        return f"exit code {self.returncode} (log: {self.log}): ...{self.tail(600)}"

    def check(self) -> Finished:
        """Itself if it succeeded; else the bench stops with the command and the end of its output."""
        if self.returncode != 0:
            raise SystemExit(f"{shlex.join(self.cmd)} failed:\n{self.tail(3000)}")
        return self


def run(
    cmd: list[str],
    log: Path,
    *,
    timeout_s: float | None = None,
    progress: Callable[[float], None] | None = None,
    every_s: float = 30.0,
    watch: Callable[[int], Watcher] | None = None,
) -> Finished:
    """Run `cmd` from the repository to its end, its output in `log`; never leaves it running.

    `watch(pid)` starts following the process as soon as it exists; `progress(elapsed_s)` is
    called every `every_s` while it runs. Past `timeout_s`, or if the bench itself is interrupted,
    the command's whole process group (Ray's processes included) is stopped.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    watcher = None
    try:
        watcher = watch(proc.pid) if watch else None
        while True:
            try:
                returncode: int | None = proc.wait(timeout=every_s)
                wall_s = time.monotonic() - started
                break
            except subprocess.TimeoutExpired:
                wall_s = time.monotonic() - started
                if timeout_s is not None and wall_s > timeout_s:
                    _kill_group(proc)
                    returncode = None
                    break
                if progress is not None:
                    progress(wall_s)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        if watcher is not None:
            watcher.stop()
    return Finished(cmd, log, returncode, wall_s, watcher)


def train(recipe: str, run_dir: Path, *overrides: str, plan: Path | None = None, **how: Any) -> Finished:
    """`dlc train` into `run_dir`, its output in RUN_DIR.log beside it (`run`'s keywords in `how`)."""
    return run(train_command(recipe, run_dir, *overrides, plan=plan), log_beside(run_dir), **how)


def log_beside(run_dir: Path) -> Path:
    return run_dir.parent / f"{run_dir.name}.log"  # not with_suffix: "rate-0.5" has a dot


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the command's process group, then SIGKILL whatever is left of it."""
    for sig, grace_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):  # the leader is gone; the group may not be
            os.killpg(proc.pid, signal.SIGKILL)
        return


def kill_timings(run_dir: Path, fault: str = "kill") -> list[dict[str, float]]:
    """Every kill (or other `fault`) chaos injected in the run, in order: seconds from the injection to
    each phase after it that was seen (detected, left, restarted, state_copied, first_push), and the
    state copy's own seconds (copy_s). A fault whose learner never pushed again has no first_push."""
    from dlc.run.files import CHAOS_FILE, read_jsonl  # a line cut short by a killed process is left out

    kills: list[dict[str, float]] = []
    latest: dict[int, dict[str, float]] = {}  # each learner's last injected kill
    for entry in read_jsonl(run_dir / CHAOS_FILE)[0]:
        if entry.get("fault") != fault:
            continue
        learner = entry["learner"]
        if entry["phase"] == "injected":
            latest[learner] = {}
            kills.append(latest[learner])
        elif learner in latest and entry.get("after_s") is not None:
            latest[learner][entry["phase"]] = entry["after_s"]
            if entry["phase"] == "state_copied":
                latest[learner]["copy_s"] = entry.get("copy_s", 0.0)
    return kills


# ---------------------------------------------------------------------------------------------
# Recording a table


@dataclass(frozen=True)
class Provenance:
    """What a reader needs to measure a table again: the command, the commit, the machine, the day."""

    command: str
    commit: str
    machine: str
    date: str

    @classmethod
    def here(cls, command: str) -> Provenance:
        """`command` run now, from this checkout, on this machine."""
        return cls(command, checkout_commit(), this_machine(), time.strftime("%Y-%m-%d"))

    @classmethod
    def of(cls, meta: dict[str, Any]) -> Provenance:
        """The provenance a bench stored among its results (`dataclasses.asdict` of one)."""
        return cls(meta["command"], meta["commit"], meta["machine"], meta["date"])

    def markdown(self) -> str:
        return f"- command: `{self.command}`\n- commit: {self.commit}\n- machine: {self.machine}\n- date: {self.date}\n"


def bench_command(script: str, options: Iterable[str]) -> str:
    """`python bench/SCRIPT OPTIONS...` as a reader would type it."""
    return " ".join(["python", f"bench/{script}", *options])


def checkout_commit() -> str:
    """The checkout's commit, said to differ when its code does (RESULTS.md itself aside)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/RESULTS.md")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} with uncommitted changes" if dirty else head


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def this_machine() -> str:
    """Host, CPUs and processor, and the GPUs nvidia-smi lists (a figure on CPU says so)."""
    gpus = ""
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            listed = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            ).stdout.split("\n")
            gpus = ", ".join(name.strip() for name in listed if name.strip())
    return f"{platform.node()} ({os.cpu_count()} CPUs, {processor()}; {gpus or 'no GPU'})"


def processor() -> str:
    """The architecture, the processor's model and its widest vector extension where Linux says
    (/proc/cpuinfo). XLA compiles for them, so the same seeded run may round differently on two
    hosts, and a chaotic loss curve carries that to the end (the twin's runs moved by up to 2% a
    seed between two hosts): pair figures seed by seed on one host only."""
    arch = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return arch
    fields: dict[str, str] = {}
    for line in info.splitlines():  # the first processor's; "key<tabs>: value"
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name", "")
    flags = set(fields.get("flags", "").split())
    vector = next((name for name in ("avx512f", "avx2", "avx") if name in flags), "")
    return ", ".join(part for part in (arch, model, vector.removesuffix("f").upper()) if part)


def gap_plot(series: dict[str, list[tuple[float, list[float]]]], out: Path, title: str, xlabel: str) -> None:
    """Each series' gap to data-parallel (%) against x, log-scaled: the mean of its paired gaps, with
    their range as the error bar. `series`: label -> [(x, the gaps of the seeds as fractions), ...]."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        if not points:
            continue
        x = [at for at, _ in points]
        y = [100 * statistics.fmean(gaps) for _, gaps in points]
        below = [mean - 100 * min(gaps) for mean, (_, gaps) in zip(y, points, strict=True)]
        above = [100 * max(gaps) - mean for mean, (_, gaps) in zip(y, points, strict=True)]
        ax.errorbar(x, y, yerr=[below, above], marker="o", capsize=3, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xticks(sorted({at for points in series.values() for at, _ in points}))  # each measured x, in full
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 100 else f"{v:g}"))
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("final eval loss vs data-parallel (%)")
    ax.set_title("\n".join(textwrap.wrap(title, 56)))  # the figure's width: a longer line is cut off
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def heading(title: str, parser: argparse.ArgumentParser, args: argparse.Namespace, keyed: Iterable[str]) -> str:
    """`title`, and the options among `keyed` that differ from their defaults, as typed.

    The options keyed are those that choose what is measured (the recipe, rows, variants), so each
    such invocation keeps a table of its own; sample sizes (repeats, steps) are not keyed, and a
    newer invocation with other sample sizes replaces the table.
    """
    typed = []
    for dest in keyed:
        value = getattr(args, dest)
        if value == parser.get_default(dest):
            continue
        flag = "--" + dest.replace("_", "-")
        typed += [f"{flag} {v}" for v in value] if isinstance(value, list) else [f"{flag} {value}"]
    return f"{title} ({' '.join(typed)})" if typed else title


def record(title: str, provenance: Provenance, body: str, results: Path | str = RESULTS) -> str:
    """Print the section `## TITLE` (provenance, then `body`) and write it into `results`, in place
    of the section of that title if there is one, else before the settled questions. Returns it."""
    section = f"## {title}\n\n{provenance.markdown()}\n{body.strip()}\n"
    print(section)
    path = Path(results)
    text = path.read_text() if path.exists() else ""
    path.write_text(replace_section(text, title, section))
    return section


def replace_section(text: str, title: str, section: str) -> str:
    """`text` with its `## TITLE` section (up to the next `## ` heading) replaced by `section`, or,
    with no such section, `section` put before the settled questions (at the end without them)."""
    lines = text.splitlines(keepends=True)
    section = section.rstrip("\n") + "\n\n"
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == f"## {title}"]
    if starts:
        start = starts[0]
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:
        start = end = next((i for i, line in enumerate(lines) if line.rstrip("\n") == SETTLED), len(lines))
    before, after = "".join(lines[:start]), "".join(lines[end:])
    if before and not before.endswith("\n\n"):
        before = before.rstrip("\n") + "\n\n"
    return (before + section + after).rstrip("\n") + "\n"
