"""The persistent compilation cache: shared by processes at once, repaired after a killed writer."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dlc.core.compile_cache import repair_compilation_cache
from tests.helpers import REPO

# Compiles two functions with the cache on and prints what it compiled and what it loaded.
PROGRAM = textwrap.dedent(
    """
    import json, sys
    from dlc.core.compile_cache import CompileLog, enable_compilation_cache
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


def test_processes_that_compile_the_same_take_turns(tmp_path):
    import threading
    import time

    from dlc.core.compile_cache import compile_turn

    order: list[str] = []
    first_compiles = threading.Event()

    def compile_as(name: str, key: str) -> None:
        with compile_turn(tmp_path, key, wait_s=30) as waited:
            order.append(f"{name} start {'after waiting' if waited > 0 else 'at once'}")
            if name == "a":
                first_compiles.set()
            time.sleep(0.5)
            order.append(f"{name} end")

    first = threading.Thread(target=compile_as, args=("a", "same"))
    first.start()
    assert first_compiles.wait(10)  # a holds the turn from here until "a end"
    later = (("b", "same"), ("b2", "same"), ("c", "other"))
    others = [threading.Thread(target=compile_as, args=args) for args in later]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join()
    # b and b2 waited for a, then loaded side by side; c, which compiles something else, did not wait.
    assert order.index("b start after waiting") > order.index("a end")
    assert order.index("b2 start after waiting") > order.index("a end")
    assert order.index("b2 start after waiting") < order.index("b end")
    assert order.index("b start after waiting") < order.index("b2 end")
    assert order.index("c start at once") < order.index("a end")


def test_a_turn_not_given_back_is_waited_for_only_so_long(tmp_path):
    import filelock

    from dlc.core.compile_cache import compile_turn

    held = filelock.FileLock(tmp_path / "compile-k.lock")
    held.acquire()  # a frozen compiler's turn: another process's lock, as far as this one can tell
    try:
        with compile_turn(tmp_path, "k", wait_s=0.3) as waited:
            assert 0.3 <= waited < 2
    finally:
        held.release()
