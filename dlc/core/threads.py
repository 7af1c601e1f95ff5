"""How many CPU threads XLA computes with in a process: its flags, and the CPUs it sees as it starts.

Several learner processes often share a few cores; each computing on one thread costs less CPU
per step than each spreading its step over every core. XLA reads its flags at the first
`import jax` and sizes its thread pools when its client starts, so both are set here, before then.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def limit_xla_threads(threads: int) -> None:
    """XLA's flags for `threads` CPU threads, so several learner processes can share a few cores.

    Only effective before the first `import jax` in this process. The flags keep Eigen's own
    threading off; the size of XLA's thread pools is set where the backend starts
    (`dlc.core.backend.start_backend(cpu_threads=...)`, through `cpus_seen`).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        eigen = "true" if threads > 1 else "false"
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={threads}".strip()
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def cpus_seen(count: int | None) -> Iterator[None]:
    """While inside, this process may run on only `count` of its CPUs; afterwards every thread of it,
    those started inside included, may run on all of them again.

    XLA sizes its CPU thread pools by the CPUs a process may run on when its client starts; the
    flags that used to limit them no longer do. Without this a learner on a 2-core machine runs
    its step on two threads, which buys nothing when four learners share the cores and costs an
    eighth more CPU per step, measured on a 2-core VM. Linux only; elsewhere XLA keeps its default.
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
