"""Plain helpers and constants shared by several test modules: the real CLI in a subprocess and
in-process, end-to-end run control, the dashboard's learner table, and the chaos tests' plans
without guardrails (the fakes they run on are in tests/fakes.py).

Test modules import these from here, never from one another or from conftest. Nothing here may
import JAX or Ray at import time: conftest imports this module before any test limits XLA's threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

from chaos.controller import Controller
from chaos.plan import Plan, plan_from_dict
from dlc.config.schema import Recipe
from tests.fakes import FakeTarget, SleepingClock

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny.yaml"
# Overrides for a worker built in the test process: without them its start-up would point this
# process's JAX cache at the user's shared ~/.cache/dlc/xla, where a learner an end-to-end test kills
# mid-write leaves a torn entry, and JAX warns (an error here) when it reads one.
IN_PROCESS = ("run.compile_cache=false",)

# End-to-end runs of the 4-learner tiny recipe use this many steps per learner.
STEPS = "run.max_steps=300"


# -- the CLI ---------------------------------------------------------------------------------------


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `dlc ARGS` in a fresh interpreter, as a user would (`env`: variables added to ours; a
    PYTHONPATH there comes before the repository's)."""
    added = env or {}
    paths = [added["PYTHONPATH"], str(REPO)] if "PYTHONPATH" in added else [str(REPO)]
    return subprocess.run(
        [sys.executable, "-m", "dlc.cli", *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **added, "PYTHONPATH": os.pathsep.join(paths)},
    )


def visible_gpus() -> int:
    """NVIDIA GPUs this machine shows (nvidia-smi -L), without importing JAX."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def invoke(*args: str) -> Any:
    """Run `dlc ARGS` in this process with typer's CliRunner; `.stdout` and `.stderr` are kept apart.

    os.environ is restored afterwards (`dlc train` sets XLA_FLAGS before it fails on bad input).
    """
    from typer.testing import CliRunner

    from dlc.cli.app import app

    with mock.patch.dict(os.environ):
        return CliRunner().invoke(app, list(args))


def assert_user_error(result: Any, *fragments: str) -> None:
    """Exit code 2, no traceback anywhere in the output, and every fragment on stderr.

    `result` is run_cli's CompletedProcess or invoke's click Result: both have .stdout and .stderr.
    """
    code = result.returncode if isinstance(result, subprocess.CompletedProcess) else result.exit_code
    assert code == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in result.stderr


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root`: "dir", or the file's size and SHA-256 (what "nothing changed" compares)."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = "dir" if path.is_dir() else f"{path.stat().st_size} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return out


# -- end-to-end runs -------------------------------------------------------------------------------


def free_metrics_port() -> int:
    """A free port below the kernel's ephemeral range, so no process is handed it before the run binds it."""
    import random
    import socket

    for port in random.sample(range(20000, 30000), 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 30000")


class MetricsScraper:
    """Scrapes http://127.0.0.1:PORT/metrics every `every_s` seconds while a run goes on, as Prometheus
    would, and keeps dlc's samples of each scrape: {(name, labels without Ray's): value}."""

    RAY_LABELS = frozenset({"Component", "NodeAddress", "SessionName", "Version", "WorkerId"})

    def __init__(self, port: int, every_s: float = 2.0) -> None:
        import threading

        self.url = f"http://127.0.0.1:{port}/metrics"
        self.every_s = every_s
        self.scrapes: list[dict[tuple[str, frozenset], float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MetricsScraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        while not self._stop.wait(self.every_s):
            try:
                text = urllib.request.urlopen(self.url, timeout=5).read().decode()
            except OSError:
                continue  # not up yet, or gone
            samples = {
                (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in self.RAY_LABELS)): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name.startswith("ray_dlc_")
            }
            if samples:
                self.scrapes.append(samples)

    def values(self, name: str, **labels: str) -> list[float]:
        """The series' value in each scrape that has it, in order."""
        want = set(labels.items())
        out = []
        for scrape in self.scrapes:
            found = [v for (n, ls), v in scrape.items() if n == name and want <= ls]
            if found:
                out.append(sum(found))
        return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_train(*args: str) -> subprocess.Popen[str]:
    """`dlc train ARGS` in its own session, so `kill_tree` can take Ray's processes with it."""
    return subprocess.Popen(
        [sys.executable, "-m", "dlc.cli", "train", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the driver's whole process group (Ray's helpers included), if anything is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if json.loads((run_dir / "status.json").read_text())["step"] >= step:
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"run did not reach step {step}")


# -- the dashboard's learner table -----------------------------------------------------------------


def row(text: str, learner: int) -> list[str]:
    """The learner table's row for `learner`, split into cells."""
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [str(learner)])


def cells(text: str, learner: int) -> dict[str, str]:
    """The learner table's row for `learner` by column name."""
    header = next(line for line in text.splitlines() if line.split()[:2] == ["id", "state"])
    return dict(zip(header.replace("last push", "last_push").split(), row(text, learner), strict=True))


# -- chaos: a fake target, plans without guardrails, a run directory's status ------------


def bare_plan(**fields: Any) -> Plan:
    """A plan with no guardrail in the way unless a test sets one."""
    base = {"warmup_s": 0, "min_gap_s": 0, "max_concurrent": 100}
    return plan_from_dict({**base, **fields})


def run_plan(plan: Plan, target: FakeTarget, clock: SleepingClock) -> Controller:
    """Run a controller for `plan` against the fake `target` on the fake `clock`, to the end."""
    controller = Controller(plan, target, clock=clock, sleep=clock.sleep, poll_s=0.5)
    controller.run()
    return controller


def write_status(run: Path, learner_pids: dict[int, int], syncer_pid: int | None = None, **extra: Any) -> None:
    """A running run's status.json that names the learners' (and the syncer's) pids, written atomically."""
    status = {
        "state": "running",
        "updated_at": time.time(),
        "learners": [{"id": i, "pid": pid, "state": "training", "step": 3} for i, pid in learner_pids.items()],
        "syncer": {"quorum": 2, "pid": syncer_pid},
        **extra,
    }
    tmp = run / ".status.json.tmp"
    tmp.write_text(json.dumps(status))
    os.replace(tmp, run / "status.json")


def marked_storage(run_dir: Path) -> dict[str, str]:
    """What the driver hands its actors about the run's storage, for a worker driven in-process: the
    directory, and the token of a start whose marker it holds."""
    from dlc.run.storage import RunStorage

    return {"location": str(run_dir), "token": RunStorage(str(run_dir)).mark()}


def twin_recipe(learners=2, **syncer) -> Recipe:
    """A recipe small enough to step in-process by the hundred: width 32, one layer, P = H = 4."""
    return Recipe.model_validate(
        {
            "run": {"max_steps": 40, "seed": 0},
            "model": {"width": 32, "num_layers": 1, "num_heads": 2, "context_len": 32},
            "data": {"max_corpus_bytes": 300_000, "block_bytes": 1024},
            "learners": {"count": learners, "batch_size": 8, "seq_len": 32},
            "inner": {"lr": 3e-3, "warmup_steps": 5},
            "syncer": {"fragments": 4, "sync_interval_steps": 4, "overlap_steps": 1, **syncer},
            "eval": {"batches": 2, "batch_size": 8},
        }
    )


def run_started(run_dir: Path) -> Any:
    """A `run_started` record for a run directory a test writes by hand (the driver's first event)."""
    from dlc.run import events

    return events.RunStarted(
        run_dir=str(run_dir),
        storage=str(run_dir),
        algorithm="decoupled",
        learners=4,
        data=None,
        tokenizer="bytes",
        train_tokens=100_000,
        eval_tokens=10_000,
        eval_bytes_per_token=1.0,
        resumed=False,
    )
