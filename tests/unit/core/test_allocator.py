"""What a process's allocator and garbage collector keep: large blocks reused, memory handed back on
request, a frozen heap left out of full collections."""

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from dlc.core.allocator import ARENA_VAR
from tests.helpers import REPO

# Allocates and frees a 40 MB block three times, as XLA does a step's temporaries, and prints the
# page faults of each allocation, with the allocator told to keep freed memory or not. In a thread of
# its own that already holds 30 MB (as XLA's thread in a learner does), the block is more than the
# thread's arena's first 64 MB heap has room for.
REUSE = textwrap.dedent(
    """
    import ctypes, json, resource, sys, threading
    import numpy as np
    from dlc.core.allocator import allocator, keep_freed_memory
    ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: a fault per 4 KiB page, whatever the kernel's setting
    mode, where = sys.argv[1:]
    kept = keep_freed_memory() if mode == "keep" else False
    faults = []
    def allocate():
        held = np.ones(7_500_000, np.float32) if where == "thread" else None
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            block = np.ones(10_000_000, np.float32)
            del block
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
    if where == "thread":
        thread = threading.Thread(target=allocate)
        thread.start()
        thread.join()
    else:
        allocate()
    print(json.dumps({"kept": kept, "allocator": allocator(), "faults": faults}))
    """
)


def reuse(mode: str, where: str = "main", arenas: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != ARENA_VAR}
    if arenas is not None:
        env[ARENA_VAR] = arenas
    argv = [sys.executable, "-c", REUSE, mode, where]
    return json.loads(subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout)


PAGES = 40_000_000 // 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_process_that_keeps_freed_memory_reuses_a_large_block_instead_of_faulting_it_in_again():
    plain, kept = reuse("plain"), reuse("keep")
    # By default every allocation maps the block afresh and faults each of its pages in again.
    assert not plain["kept"] and plain["allocator"] == "returned" and min(plain["faults"]) >= PAGES * 0.9
    # Kept: the first allocation faults the block in once; the next ones reuse it.
    assert kept["kept"] and kept["faults"][0] >= PAGES * 0.9 and max(kept["faults"][1:]) < PAGES * 0.01


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_thread_reuses_a_large_block_only_in_a_process_started_with_one_arena():
    # The thread's own arena maps a heap for the block and unmaps it when it is freed, kept or not.
    arenas = reuse("keep", "thread")
    assert arenas["allocator"] == "kept" and min(arenas["faults"]) >= PAGES * 0.9
    # With one arena (as dlc starts learners) the thread allocates from the main heap, which keeps it.
    one = reuse("keep", "thread", arenas="1")
    assert one["allocator"] == "kept, one arena"
    assert one["faults"][0] >= PAGES * 0.9 and max(one["faults"][1:]) < PAGES * 0.01


# Keeps freed memory, fills and frees 200 MB in 2 MB blocks, then hands the freed memory back;
# prints the resident MiB after freeing and after handing back.
RELEASE = textwrap.dedent(
    """
    import json
    import numpy as np
    from dlc.core.allocator import keep_freed_memory, release_freed_memory
    def rss():
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
    assert not release_freed_memory()  # nothing to do while the allocator hands memory back itself
    assert keep_freed_memory()
    blocks = [np.ones(500_000, np.float32) for _ in range(100)]
    del blocks
    kept = rss()
    assert release_freed_memory()
    print(json.dumps({"kept": kept, "released": rss()}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_memory_a_process_kept_goes_back_to_the_kernel_when_it_says_so():
    out = subprocess.run([sys.executable, "-c", RELEASE], cwd=REPO, capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout)
    assert rss["kept"] - rss["released"] >= 150  # of the 200 MB freed


# Makes a dead cycle, freezes the heap (collecting first or not), then makes another dead cycle and
# collects; prints which cycles were freed and how many objects a full collection still walks.
FREEZE = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from dlc.core.allocator import freeze_heap
    class Node:
        pass
    def dead_cycle():
        a, b = Node(), Node()
        a.b, b.a = b, a
        return weakref.ref(a)
    gc.disable()  # nothing collects but what the test asks for
    before = dead_cycle()
    walked = len(gc.get_objects())
    freeze_heap(collect=sys.argv[1] == "collect")
    after = dead_cycle()
    gc.collect()
    print(json.dumps({"before_freed": before() is None, "after_freed": after() is None,
                      "walked": walked, "walked_now": len(gc.get_objects()), "frozen": gc.get_freeze_count()}))
    """
)


@pytest.mark.parametrize("collect", [True, False])
def test_a_frozen_heap_is_left_out_of_full_collections_and_what_dies_later_is_still_freed(collect):
    argv = [sys.executable, "-c", FREEZE, "collect" if collect else "no"]
    out = json.loads(subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert out["frozen"] >= out["walked"] * 0.9  # everything alive at the freeze
    assert out["walked_now"] < out["walked"] / 20  # a full collection now walks only what came since
    assert out["after_freed"]
    # Garbage at the freeze is freed first when asked; otherwise it is kept for the process's life.
    assert out["before_freed"] is collect
