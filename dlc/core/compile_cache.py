"""The persistent compilation cache shared by every process of a run, and a count of what each compiled.

A learner that restarts, or a later run of the same recipe, loads its compiled functions instead of
compiling them again. Many processes share one directory at once, so the cache is written under
JAX's file lock and repaired before a run of what a killed writer left behind. Learners that would
compile the same functions take turns (`compile_turn`): the first compiles and fills the cache, the
others then load from it, instead of all compiling the same thing at once on the same cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlc.config.job import RunConfig

# Size at which JAX starts evicting the least recently used entries. Setting any size also makes
# JAX take a file lock around every read and write of the cache (see `enable_compilation_cache`).
CACHE_MAX_BYTES = 8 * 1024**3
_CACHE_SUFFIX, _ATIME_SUFFIX, _LOCK_FILE = "-cache", "-atime", ".lockfile"


def compilation_cache_dir(configured: str) -> Path:
    """The cache directory a recipe names, with ~ and environment variables expanded."""
    return Path(os.path.expandvars(os.path.expanduser(configured)))


def enable_run_cache(run: RunConfig) -> Path | None:
    """Turn on the cache a run's recipe names in this process (before JAX compiles anything), unless
    run.compile_cache is off; returns its directory, or None."""
    if not run.compile_cache:
        return None
    directory = compilation_cache_dir(run.compile_cache_dir)
    enable_compilation_cache(directory)
    return directory


def enable_compilation_cache(directory: Path) -> None:
    """Load compiled functions from `directory` and store new ones there, in this process.

    Every learner of a run, and later runs, share the directory, so several processes read and
    write it at once (JAX issue #22718: with no size limit JAX writes entries in place, unlocked,
    and a reader can load half a file). With a size limit, JAX holds an exclusive file lock around
    each read and write, so no process ever sees another's entry half written; what a write
    interrupted by a kill leaves behind is removed by `repair_compilation_cache`. Every function is
    cached, however fast it compiled: a learner that restarts wants all of them.
    """
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def repair_compilation_cache(directory: Path) -> int:
    """Remove entries a killed process left half written; returns how many.

    JAX writes an entry's access-time file only after the entry itself, under the cache's file
    lock: an entry with no access-time file was cut off mid-write (JAX would keep reading the torn
    file and compiling anew, forever). Taken under the same lock, so no writer is mid-entry.
    """
    import filelock

    directory.mkdir(parents=True, exist_ok=True)
    removed = 0
    with filelock.FileLock(directory / _LOCK_FILE, timeout=60):
        for entry in directory.glob(f"*{_CACHE_SUFFIX}"):
            key = entry.name[: -len(_CACHE_SUFFIX)]
            if not (directory / f"{key}{_ATIME_SUFFIX}").exists():
                entry.unlink(missing_ok=True)
                removed += 1
    return removed


def prepare_compilation_cache(configured: str) -> dict[str, Any]:
    """Before a run: create the shared cache and repair it, or refuse with the fix."""
    from dlc.errors import UserError

    directory = compilation_cache_dir(configured)
    try:
        removed = repair_compilation_cache(directory)
    except OSError as exc:
        raise UserError(
            f"cannot use run.compile_cache_dir={configured!r}: {exc.strerror or exc}; "
            "point it at a writable directory or set run.compile_cache=false"
        ) from None
    return {"dir": str(directory), "torn_entries_removed": removed}


def compile_key(what: dict[str, Any]) -> str:
    """A short name for a set of functions to compile: the same for every process that compiles the same."""
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def compile_turn(directory: Path, key: str, wait_s: float) -> Iterator[float]:
    """Let the first process that compiles what `key` names compile it alone: yields the seconds waited.

    Among the processes sharing `directory`, the first to ask compiles at once and fills the cache;
    each other one waits until it is done, then finds every function in the cache and loads it,
    beside the others that waited (a load takes a second or two: no turn is needed for it). The
    turn is an OS file lock, so a process that dies while compiling passes it on; one that is
    frozen (SIGSTOP) is waited for at most `wait_s`, after which the waiting process goes on.
    """
    import filelock

    asked = time.monotonic()
    lock = filelock.FileLock(directory / f"compile-{key}.lock")
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:  # another process compiles it now: wait for it, then load
        with contextlib.suppress(filelock.Timeout):
            lock.acquire(timeout=wait_s)
            lock.release()
        yield time.monotonic() - asked
        return
    try:
        yield 0.0
    finally:
        lock.release()


class CompileLog:
    """Counts, in this process, the functions XLA compiled and those loaded from the cache."""

    def __init__(self, cached: bool = True) -> None:
        import jax

        self.compiled: Counter[str] = Counter()  # function name -> compilations or cache loads
        self.cache_hits = 0
        self.seconds = 0.0
        # True while XLA compiles (a cache miss, or any compilation with no cache): a cache hit
        # only loads.
        self.compiling = not cached
        self._cached = cached
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            with self._lock:
                self.compiled[str(kwargs.get("fun_name", "?"))] += 1
                self.seconds += duration_secs
                self.compiling = not self._cached

    def _on_event(self, event: str, **kwargs: str | int) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            with self._lock:
                self.cache_hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.compiling = True

    def close(self) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)
