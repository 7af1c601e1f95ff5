"""The persistent compilation cache: shared by processes at once, repaired after a killed writer; the
device a process starts on; what the process's allocator and garbage collector keep."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import pytest

from dlc.core.runtime import (
    ARENA_VAR,
    BackendError,
    allocator,
    device_label,
    repair_compilation_cache,
    start_backend,
)
from tests.helpers import REPO

# Compiles two functions with the cache on and prints what it compiled and what it loaded.
PROGRAM = textwrap.dedent(
    """
    import json, sys
    from dlc.core.runtime import CompileLog, enable_compilation_cache
    from pathlib import Path
    enable_compilation_cache(Path(sys.argv[1]))
    log = CompileLog()
    import jax, jax.numpy as jnp
    x = jnp.ones((64, 64))
    for k in range(2):
        jax.block_until_ready(jax.jit(lambda a, k=k: jnp.tanh(a @ a.T + k).sum())(x))
    print(json.dumps({"compiled": sum(log.compiled.values()), "hits": log.cache_hits}))
    """
)


def _start(cache: Path) -> subprocess.Popen[str]:
    # A failed read or write of the cache raises instead of warning: any torn entry fails the test.
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_RAISE_PERSISTENT_CACHE_ERRORS": "true"}
    return subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def test_processes_write_and_read_one_cache_at_once(tmp_path):
    cache = tmp_path / "xla"
    procs = [_start(cache) for _ in range(4)]  # all four miss and write the same entries at once
    try:
        outs = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, (_out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    assert len(list(cache.glob("*-cache"))) >= 2
    # A later process loads both functions instead of compiling them.
    out, err = _start(cache).communicate(timeout=240)
    later = json.loads(out.splitlines()[-1])
    assert later["compiled"] == later["hits"] >= 2, err[-2000:]  # every compilation a load


def test_repair_removes_only_entries_cut_off_mid_write(tmp_path):
    cache = tmp_path / "xla"
    cache.mkdir()
    (cache / "whole-cache").write_bytes(b"x" * 100)
    (cache / "whole-atime").write_bytes(b"t")
    (cache / "torn-cache").write_bytes(b"x" * 10)  # JAX writes the access time after the entry
    assert repair_compilation_cache(cache) == 1
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == ["whole-atime", "whole-cache"]
    assert repair_compilation_cache(tmp_path / "new") == 0 and (tmp_path / "new").is_dir()


def test_an_unusable_cache_directory_is_refused_before_the_run_directory_exists(tmp_path):
    from tests.helpers import TINY, assert_user_error, invoke

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run_dir = tmp_path / "run"
    result = invoke("train", str(TINY), f"run.dir={run_dir}", f"run.compile_cache_dir={blocker / 'xla'}")
    assert_user_error(result, "run.compile_cache_dir", "run.compile_cache=false")
    assert not run_dir.exists()


# -- the device a process starts on ---------------------------------------------------------------


def test_a_cpu_process_reports_its_device():
    device = start_backend("cpu", keep_memory=False)  # this test process's allocator stays as it is
    assert device == {"platform": "cpu", "device_kind": "cpu", "device": "cpu", "allocator": allocator()}


# Starts the CPU backend with `cpu_threads` threads, runs a matmul and prints XLA's compute threads
# and which CPUs every thread of the process may run on.
THREADS = textwrap.dedent(
    """
    import json, os, sys
    from dlc.core.runtime import start_backend
    start_backend("cpu", cpu_threads=json.loads(sys.argv[1]))
    import jax.numpy as jnp
    (jnp.ones((256, 256)) @ jnp.ones((256, 256))).block_until_ready()
    tasks = os.listdir("/proc/self/task")
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks]
    print(json.dumps({
        "xla": names.count("tf_XLAEigen"),
        "cpus": sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in tasks}),
    }))
    """
)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs Linux, 2 CPUs"
)
def test_cpu_threads_sets_how_many_threads_xla_computes_with_and_leaves_every_cpu_usable():
    def start(threads):
        out = subprocess.run(
            [sys.executable, "-c", THREADS, json.dumps(threads)], cwd=REPO, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    every = [sorted(os.sched_getaffinity(0))]
    default = start(None)  # XLA's own choice: a thread per CPU
    assert default["xla"] > 1 and default["cpus"] == every
    # One thread, as a learner sharing the cores with others wants; the process may still run on any CPU.
    assert start(1) == {"xla": 1, "cpus": every}
    assert start(len(every[0]) + 3) == default  # more than there are CPUs: XLA's own choice


# Allocates and frees a 40 MB block three times, as XLA does a step's temporaries, and prints the
# page faults of each allocation, with the allocator told to keep freed memory or not. In a thread of
# its own that already holds 30 MB (as XLA's thread in a learner does), the block is more than the
# thread's arena's first 64 MB heap has room for.
REUSE = textwrap.dedent(
    """
    import ctypes, json, resource, sys, threading
    import numpy as np
    from dlc.core.runtime import allocator, keep_freed_memory
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
    from dlc.core.runtime import keep_freed_memory, release_freed_memory
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


def test_a_process_that_reserved_a_gpu_but_got_cpu_says_how_to_fix_it():
    # This machine's JAX has no GPU backend: what a learner with num_gpus > 0 meets without the CUDA plugin.
    with pytest.raises(BackendError) as err:
        start_backend("gpu", "eval.num_gpus")
    assert str(err.value) == (
        "it reserved a GPU but JAX started on cpu (cpu); install JAX's CUDA plugin for your jax on every node "
        "(pip install -e '.[cuda]', or '.[cuda13]' for CUDA 13 drivers), or set eval.num_gpus=0 to run on CPU"
    )


def test_a_backend_that_fails_to_start_is_one_line_with_its_first_line_and_the_fix(monkeypatch):
    def out_of_memory() -> None:
        raise RuntimeError(
            "Unable to initialize backend 'cuda': INTERNAL: no supported devices found for platform CUDA: "
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory\nsecond line of the plugin's log"
        )

    monkeypatch.setattr(jax, "devices", out_of_memory)
    with pytest.raises(BackendError) as err:
        start_backend("gpu")
    message = str(err.value)
    assert "\n" not in message and "second line" not in message
    assert message.startswith("JAX could not start on its gpu: Unable to initialize backend 'cuda': ")
    assert message.endswith(
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory; the GPU's memory is taken: raise learners.num_gpus so fewer "
        "processes share a GPU, or stop what else holds the GPU's memory"
    )
    assert device_label("gpu", "NVIDIA H100 80GB HBM3") == "gpu: NVIDIA H100 80GB HBM3"
    assert device_label("cpu", "cpu") == "cpu"


# Makes a dead cycle, freezes the heap (collecting first or not), then makes another dead cycle and
# collects; prints which cycles were freed and how many objects a full collection still walks.
FREEZE = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from dlc.core.runtime import freeze_heap
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
