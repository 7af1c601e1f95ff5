"""How many threads XLA computes with on CPU, while every CPU stays usable by the process."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO

# Starts the CPU backend with `cpu_threads` threads, runs a matmul and prints XLA's compute threads
# and which CPUs every thread of the process may run on.
THREADS = textwrap.dedent(
    """
    import json, os, sys
    from dlc.core.backend import start_backend
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
