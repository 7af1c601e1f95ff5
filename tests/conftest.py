"""Pytest set-up: one XLA thread per process, and the fixtures several test modules share.

Plain helpers and constants live in tests/helpers.py.
"""

from __future__ import annotations

import gc
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import STEPS, TINY, run_cli

# Before any test imports JAX: several processes share 2 cores in CI.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every event a test's run writes is checked against its record's field types (dlc/run/events/): one
# written with a field of the wrong type fails the run (inherited by the processes tests start).
os.environ["DLC_CHECK_EVENTS"] = "1"


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests build the same tiny models again and again: a JAX compilation cache for this process,
    empty at the start of each session, makes every compile after the first a load (measured: a
    third off the unit tests). Set in this process only, not in the environment: the processes a
    test starts keep the cache their recipe names, or none."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


@pytest.fixture(autouse=True)
def _heap_unfrozen() -> Iterator[None]:
    """A learner or syncer worker built in this process freezes its heap, as it does in its own
    actor process (`dlc.core.allocator.freeze_heap`): the test process's goes back under the
    collector after each test."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture
def tiny_recipe() -> Path:
    return TINY


@pytest.fixture(scope="session")
def calm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fault-free 4-learner run of tiny, shared by the engine checks and as the chaos baseline."""
    run_dir = tmp_path_factory.mktemp("calm") / "run"
    result = run_cli("train", str(TINY), f"run.dir={run_dir}", STEPS, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[Any]]]:
    """Start processes that are killed and reaped at teardown, whatever the test did."""
    procs: list[subprocess.Popen[Any]] = []

    def start(args: list[str], **kw: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(args, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # SIGKILL ends a stopped process too
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


E2E = Path(__file__).parent / "e2e"


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Where pytest-xdist is not installed (a GPU machine with only the packed packages), the
    options pyproject.toml gives it are accepted and the suite runs in one process."""
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist", "pytest-xdist is not installed: the suite runs in one process")
    group.addoption("--numprocesses", dest="numprocesses", help="ignored without pytest-xdist")
    group.addoption("--maxprocesses", dest="maxprocesses", help="ignored without pytest-xdist")
    group.addoption("--dist", dest="dist", help="ignored without pytest-xdist")


@pytest.hookimpl(tryfirst=True)  # before xdist names each test by its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The end-to-end tests (tests/e2e/) start real runs, clusters and learner processes and check
    what they did in time (heartbeats, restarts, notices): pytest-xdist runs them one after another
    on one worker, so no two of them share the cores, while the other workers take every other test
    beside them. Those marked `untimed`, whose checks do not depend on the pace of the cores, go
    with the other tests: the timed ones alone are the longest worker's load. A module that names an
    `XDIST_GROUP` goes to one worker whole (one costly module fixture, made once). The marker only
    exists with pytest-xdist: without it (a GPU machine's packed packages) nothing is marked."""
    if not config.pluginmanager.has_plugin("xdist"):
        return
    for item in items:
        if item.path.is_relative_to(E2E) and item.get_closest_marker("untimed") is None:
            item.add_marker(pytest.mark.xdist_group("e2e"))
        elif group := getattr(getattr(item, "module", None), "XDIST_GROUP", None):
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    """pytest 9.2 derives a test's id from its collection address, which pytest-xdist 3.8's loadgroup cannot
    rename: it would group nothing, and the timed end-to-end tests would share the cores, each failing in
    turn on its timing. Stop before any runs, saying so."""
    xdist_used = config.pluginmanager.has_plugin("xdist") and config.getvalue("dist") == "loadgroup"
    if hasattr(config, "workerinput") or not xdist_used:
        return
    from importlib.metadata import version

    xdist = version("pytest-xdist")
    if pytest.version_tuple[:2] >= (9, 2) and tuple(int(part) for part in xdist.split(".")[:2]) <= (3, 8):
        pytest.exit(
            f"pytest {pytest.__version__} with pytest-xdist {xdist} does not group the timed "
            "end-to-end tests onto one worker: install the versions pyproject.toml's test extra allows "
            "(pip install -e '.[test]')",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
