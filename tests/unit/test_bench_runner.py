"""A bench's training workers (`runner.pool`) end when the bench does, however it ended: a bench killed
with SIGKILL, which runs no cleanup of its own, leaves no training behind on the cores. No training
here: the bench is a small script that starts a pool, hands it a long sleep and waits. And the
benches that start a pool refuse a `--jobs` below 1 before anything else, as argparse refuses; those
that re-render saved results refuse a `--from-json` file that is missing or not JSON the same way."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

BENCH_LIKE = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    import runner

    if __name__ == "__main__":
        with runner.pool(1) as pool:
            print(pool.submit(os.getpid).result(), flush=True)  # the worker's initializer has run
            pool.submit(time.sleep, 600)
            time.sleep(600)
    """
)


def _gone(pid: int) -> bool:
    """No process `pid`, or one that has exited and waits to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes' states from /proc")
def test_a_killed_bench_leaves_no_worker_running(tmp_path):
    script = tmp_path / "bench_like.py"
    script.write_text(BENCH_LIKE)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(BENCH)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # the bench and its worker in a group of their own, killed whatever happens
    )
    try:
        worker = int(proc.stdout.readline())
        assert worker != proc.pid and not _gone(worker)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60  # a bound for a loaded host; the worker checks twice a second
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(worker), f"worker {worker} still runs after its bench was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)  # reaps it and closes its pipe


def _refused(script: str, *options: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs a bench with `options` and checks that it refused them as dlc refuses bad input: exit 2,
    no traceback."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *options], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


@pytest.mark.parametrize("script", ["quality.py", "ablate.py", "dynamics.py"])
@pytest.mark.parametrize("jobs", ["0", "-1", "two"])
def test_a_bench_refuses_jobs_below_one(script, jobs, tmp_path):
    proc = _refused(script, f"--jobs={jobs}", cwd=tmp_path)
    assert f"argument --jobs: '{jobs}' is not a number of trainings at once" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("script", "saved", "said"),
    [
        ("quality.py", None, "cannot read it (No such file or directory)"),
        ("compare.py", None, "cannot read it (No such file or directory)"),
        ("dynamics.py", None, "cannot read it (No such file or directory)"),
        ("scaling.py", None, "cannot read it (No such file or directory)"),
        ("quality.py", "{", "not a results file, it is not JSON"),
    ],
)
def test_a_bench_refuses_a_saved_file_it_cannot_read(script, saved, said, tmp_path):
    path = tmp_path / "results.json"
    if saved is not None:
        path.write_text(saved)
    proc = _refused(script, "--from-json", str(path), cwd=tmp_path)
    assert f"error: --from-json {path}: {said}" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if saved is None else ["results.json"])
