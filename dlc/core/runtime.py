"""Process set-up that must happen before JAX is imported."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def limit_xla_threads(threads: int) -> None:
    """XLA's flags for `threads` CPU threads, so several learner processes can share a few cores.

    Only effective before the first `import jax` in this process. The flags keep Eigen's own
    threading off; the size of XLA's thread pools is set where the backend starts
    (`start_backend(cpu_threads=...)`).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        eigen = "true" if threads > 1 else "false"
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={threads}".strip()
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# Whether this process's allocator keeps what it frees (`keep_freed_memory`): a setting of the whole
# process, as the allocator's own is.
_keeping = False
# glibc's number of malloc arenas, read once, when a process starts: "1" puts every thread on the
# main heap, the one `keep_freed_memory` can make keep what it frees (`dlc.engine.devices` starts the
# learners and the evaluator with it).
ARENA_VAR = "MALLOC_ARENA_MAX"


def keep_freed_memory() -> bool:
    """Make this process's allocator keep the memory it frees for reuse; True if it now does.

    XLA on CPU allocates each step's temporaries as one block of tens of megabytes. glibc's
    malloc serves a block that large with a fresh mapping and unmaps it when it is freed, so
    every step faults in, page by page, zeroed memory it used the step before: about 10,000 page
    faults and a third of a tiny learner's step (`bench/RESULTS.md`). With mappings off and the
    heap never trimmed, the block stays in the heap and the next step reuses it. What the process
    frees it keeps until `release_freed_memory` hands it back. glibc only (Linux); elsewhere
    nothing changes.

    Only the main heap is kept whole. A thread other than the main one allocates from an arena of
    its own, made of 64 MB heaps; a block that does not fit the arena's current heap gets a heap
    mapped for it, which glibc unmaps when the block is freed, whatever the settings here. That is
    XLA's thread in a learner, whose arena also holds what the learner's other threads allocate:
    its temporaries' block faulted in afresh at every step still, hundreds of pages a step more
    with the protocol's threads than without (`bench/RESULTS.md`). A process started with
    MALLOC_ARENA_MAX=1 (`ARENA_VAR`) has one arena, the main heap, for every thread.
    """
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    # Both: with mappings off, trimming the heap would still hand the freed block back.
    global _keeping
    _keeping = bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
    return _keeping


def release_freed_memory() -> bool:
    """Hand what this process has freed so far back to the kernel, now (glibc's `malloc_trim`).

    For a process that keeps freed memory (`keep_freed_memory`), after work that leaves much of it
    free: compiling leaves over a hundred megabytes, which the process would otherwise hold until
    it exits (a tiny learner on one core then trains in 380 MiB, against 502 for one that does not
    keep freed memory; `bench/RESULTS.md`). True if it ran; in a process that does not keep freed
    memory it does nothing, as its allocator hands memory back by itself.
    """
    malloc_trim = _glibc("malloc_trim") if _keeping else None
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


def freeze_heap(collect: bool = True) -> None:
    """Leave every object alive now out of the cyclic garbage collector's passes from here on.

    A learner process holds ~260k objects once it has started (JAX, Ray, orbax, its model, its
    compiled step), nearly all of them for its whole life. A full collection walks every one of
    them with the GIL held: 130 ms of CPU on a shared core, during which each thread of the process
    stands still. In a tiny run one came in each learner's first checkpoint, which then took twice
    as long as the same checkpoint under `algorithm=none` (`bench/RESULTS.md`). Frozen objects are
    never walked again: one that dies is still freed by its reference count, but a cycle of them
    never is, so freeze only what lives as long as the process. `collect` frees what is garbage
    first, so that no dead cycle (one holding device buffers, say) is kept for the life of the
    process; without it (right after the imports, when there is next to none) the freeze costs
    nothing.
    """
    if collect:
        gc.collect()
    gc.freeze()


def allocator() -> str:
    """How this process's allocator treats what it frees, for the run log: 'kept, one arena' (as
    learners run by default), 'kept' (per-thread arenas may still hand some back), or 'returned'."""
    if not _keeping:
        return "returned"
    return "kept, one arena" if os.environ.get(ARENA_VAR) == "1" else "kept"


def _glibc(name: str) -> Any:
    """The C library's function `name` in this process, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


# -- the device a process trains on ------------------------------------------------------------


class BackendError(Exception):
    """JAX could not start on the device this process was placed on; the message is one line with the fix."""


def device_label(platform: str, device_kind: str) -> str:
    """How a device is shown: 'gpu: NVIDIA H100 80GB HBM3', 'cpu'."""
    return platform if device_kind.lower() == platform else f"{platform}: {device_kind}"


def backend_fix(error: str, share_field: str = "learners.num_gpus") -> str:
    """What to do about a GPU backend that failed to start, from its error message."""
    if "OUT_OF_MEMORY" in error or "out of memory" in error.lower():
        return (
            f"the GPU's memory is taken: raise {share_field} so fewer processes share a GPU, or stop what else "
            "holds the GPU's memory"
        )
    return (
        "install JAX's CUDA plugin for your jax on every node (pip install -e '.[cuda]', or '.[cuda13]' for "
        f"CUDA 13 drivers), or set {share_field}=0 to run on CPU"
    )


@contextlib.contextmanager
def _cpus_seen(count: int | None) -> Iterator[None]:
    """While inside, this process may run on only `count` of its CPUs; afterwards every thread of it,
    those started inside included, may run on all of them again.

    XLA sizes its CPU thread pools by the CPUs a process may run on when its client starts; the
    flags that used to limit them no longer do. Without this a learner on a 2-core machine runs
    its step on two threads, which buys nothing when four learners share the cores and costs an
    eighth more CPU per step (`bench/RESULTS.md`). Linux only; elsewhere XLA keeps its default.
    """
    if count is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = os.sched_getaffinity(0)
    if count >= len(allowed):
        yield
        return
    os.sched_setaffinity(0, sorted(allowed)[:count])
    try:
        yield
    finally:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), allowed)


def start_backend(
    platform: str, share_field: str = "learners.num_gpus", cpu_threads: int | None = None, keep_memory: bool = True
) -> dict[str, str]:
    """Start JAX's backend in this process and check it is on `platform` (gpu or cpu).

    Returns the platform, the device kind, their label and what the allocator does with freed
    memory (`allocator`). Raises BackendError with the backend's own first line and the fix
    (naming `share_field`, the recipe field that asked for the GPU) when JAX fails to start, or
    starts elsewhere: JAX falls back to CPU when no GPU plugin is installed. On CPU,
    `cpu_threads` is how many threads XLA computes with (None: XLA's own, one per CPU). With
    `keep_memory` the process's allocator keeps what it frees from here on (`keep_freed_memory`).
    """
    import jax

    if keep_memory:
        keep_freed_memory()
    try:
        with _cpus_seen(cpu_threads if platform == "cpu" else None):
            device = jax.devices()[0]
    except Exception as exc:  # RuntimeError from a plugin; anything else is as fatal here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BackendError(
            f"JAX could not start on its {platform}: {first}; {backend_fix(first, share_field)}"
        ) from None
    if device.platform != platform:
        wanted = "reserved a GPU" if platform == "gpu" else "reserved no GPU"
        raise BackendError(
            f"it {wanted} but JAX started on {device.platform} ({device.device_kind}); "
            + (backend_fix("", share_field) if platform == "gpu" else "unset JAX_PLATFORMS in the workers' environment")
        )
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device": device_label(device.platform, device.device_kind),
        "allocator": allocator(),
    }


# -- the persistent compilation cache ----------------------------------------------------------

# Size at which JAX starts evicting the least recently used entries. Setting any size also makes
# JAX take a file lock around every read and write of the cache (see `enable_compilation_cache`).
CACHE_MAX_BYTES = 8 * 1024**3
_CACHE_SUFFIX, _ATIME_SUFFIX, _LOCK_FILE = "-cache", "-atime", ".lockfile"


def compilation_cache_dir(configured: str) -> Path:
    """The cache directory a recipe names, with ~ and environment variables expanded."""
    return Path(os.path.expandvars(os.path.expanduser(configured)))


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

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            with self._lock:
                self.compiled[str(kwargs.get("fun_name", "?"))] += 1
                self.seconds += duration
                self.compiling = not self._cached

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            with self._lock:
                self.cache_hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.compiling = True

    def close(self) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)
