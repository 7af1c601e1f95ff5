"""Process set-up that must happen before JAX is imported."""

from __future__ import annotations

import os


def limit_xla_threads(threads: int) -> None:
    """Keep XLA to `threads` CPU threads so several learner processes can share a few cores.

    Only effective before the first `import jax` in this process.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        eigen = "true" if threads > 1 else "false"
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={threads}".strip()
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
