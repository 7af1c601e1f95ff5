"""A learner process's start-up: its JAX backend, its compiled functions, and the seconds of each phase.

Start-up is in phases the live view shows: the process starts (the supervisor times it from the
request), JAX's backend starts, the step and the fragment functions are compiled or loaded from the
persistent compilation cache (in a thread of their own, begun as the actor is built, so a copy of
a peer's state overlaps it), the state is copied from a peer (`state_copy`), and the loop starts.
A hot spare does all of that but the copy, then idles until it takes a learner's slot.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dlc.config.schema import Recipe
from dlc.core.allocator import freeze_heap, release_freed_memory
from dlc.core.backend import BackendError, start_backend
from dlc.core.compile_cache import CompileLog, compile_key, compile_turn, enable_run_cache
from dlc.engine.devices import learner_setup

if TYPE_CHECKING:
    from dlc.algo.protocol import LearnerSync


# How long a learner waits for another that compiles the same functions before compiling them itself:
# longer than any compilation takes, so only a frozen (SIGSTOPped) compiler is not waited for.
COMPILE_WAIT_S = 600.0


def compiled_by(recipe: Recipe, index: int | None, device: dict[str, str]) -> dict[str, Any]:
    """What decides the functions a learner compiles: learners that agree on it compile the same.

    The model, the shapes of a step (its batch size, the sequence length), the optimizer, the
    algorithm and its syncer settings (fragments and codecs), and the device; a hot spare (index
    None) compiles for the learners' default batch size.
    """
    settings = recipe.learners.resolved(-1 if index is None else index)
    return {
        "model": recipe.model.model_dump(mode="json"),
        "inner": recipe.inner.model_dump(mode="json"),
        "algorithm": recipe.algorithm,
        "syncer": recipe.syncer.model_dump(mode="json"),
        "blocking": recipe.blocking.model_dump(mode="json"),
        "batch": settings.batch_size,
        "devices": settings.devices,
        "mesh": settings.mesh,
        "seq_len": recipe.learners.seq_len,
        "xla_threads": recipe.learners.xla_threads(index),
        "device": device,
    }


class Startup:
    """One learner process's start-up: the device it got, its compile thread, and `seconds` of each phase."""

    def __init__(self, recipe: Recipe, index: int | None, requested_at: float | None, constructed: float) -> None:
        # JAX's backend starts first: a GPU that fails (no CUDA plugin, out of memory) sets
        # `backend_error`, which the actor reports in one line, and nothing else is built.
        self.device: dict[str, str] = {}
        self.backend_error: str | None = None
        # Seconds of each phase, for the live view and the learner_training event; "process_s" runs
        # from the request to start this process.
        self.seconds: dict[str, Any] = {}
        self.compiled = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self.device = start_backend(
                learner_setup(recipe, index, {}).platform,
                cpu_threads=recipe.learners.xla_threads(index),
                keep_memory=recipe.learners.keep_freed_memory,
            )
        except BackendError as exc:
            who = "hot spare" if index is None else f"learner {index}"
            self.backend_error = f"{who} (pid {os.getpid()}): {exc}"
            return
        self.cache_dir = enable_run_cache(recipe.run)  # before JAX compiles anything in this process
        self.log = CompileLog(cached=recipe.run.compile_cache)
        self.turn = compile_key(compiled_by(recipe, index, self.device))
        if requested_at is not None:
            self.seconds["process_s"] = round(constructed - requested_at, 3)

    def compile(self, sync: LearnerSync, failed: Callable[[str], None]) -> None:
        """Begin compiling every function `sync`'s loop runs, in a thread; `failed` gets the traceback if it fails."""
        self._thread = threading.Thread(target=self._compile, args=(sync, failed), name="compile", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the compile thread (the loop does, before its first step)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def phase(self) -> str:
        """What compiling looks like now: XLA compiling, or only loading what the cache holds."""
        return "compiling" if self.log.compiling else "loading compiled step"

    def became_spare_learner(self) -> None:
        """A hot spare took a learner's slot: its start-up says so."""
        self.seconds = {"spare": True, **self.seconds}

    def _compile(self, sync: LearnerSync, failed: Callable[[str], None]) -> None:
        started, log = time.monotonic(), self.log
        before = (sum(log.compiled.values()), log.cache_hits)
        try:
            if self.cache_dir is None:
                sync.compile()
            else:  # after the learner that compiles the same functions first: then only a load
                with compile_turn(self.cache_dir, self.turn, COMPILE_WAIT_S) as waited:
                    self.seconds["compile_wait_s"] = round(waited, 3)
                    sync.compile()
        except Exception:
            failed(traceback.format_exc())
            return
        compiled, hits = sum(log.compiled.values()) - before[0], log.cache_hits - before[1]
        self.seconds["compile_s"] = round(time.monotonic() - started, 3)
        self.seconds["compiled_from"] = "cache" if compiled and hits == compiled else "xla" if not hits else "both"
        release_freed_memory()  # what compiling left free, which a process keeping freed memory would hold
        freeze_heap()  # start-up's objects live as long as the process: full collections skip them
        self.compiled.set()
