"""What a long-lived worker process keeps of the memory it frees: glibc's heap, and Python's collector.

A learner steps the same compiled function thousands of times and holds the same objects for its
whole life. By default glibc hands each step's large temporaries back to the kernel and faults them
in again the next step, and Python's collector keeps walking objects that never die; both cost a
tiny learner a large share of its CPU (with freed memory kept, one trains 1.45x as fast on a
2-core VM). The switches here keep the one and leave the other alone. glibc only (Linux);
elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from typing import Any

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
    faults and a third of a tiny learner's step, measured on a 2-core VM. With mappings off and the
    heap never trimmed, the block stays in the heap and the next step reuses it. What the process
    frees it keeps until `release_freed_memory` hands it back. glibc only (Linux); elsewhere
    nothing changes.

    Only the main heap is kept whole. A thread other than the main one allocates from an arena of
    its own, made of 64 MB heaps; a block that does not fit the arena's current heap gets a heap
    mapped for it, which glibc unmaps when the block is freed, whatever the settings here. That is
    XLA's thread in a learner, whose arena also holds what the learner's other threads allocate:
    its temporaries' block faulted in afresh at every step still, hundreds of pages a step more
    with the protocol's threads than without, measured on a 2-core VM. A process started with
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
    keep freed memory, on a 2-core VM). True if it ran; in a process that does not keep freed
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
    as long as the same checkpoint under `algorithm=none`, measured on a 2-core VM. Frozen objects are
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
