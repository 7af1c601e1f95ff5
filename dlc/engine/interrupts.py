"""What Ctrl-C does to `dlc train`: interrupt a start, ask a training run to stop, never cut its end short.

A run interrupted by Ctrl-C ends with `EXIT_INTERRUPTED`, the shell's code for SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

EXIT_INTERRUPTED = 130


class Interrupts:
    """What Ctrl-C does to `dlc train`, from the start of the cluster to its stop.

    While the run starts, Ctrl-C interrupts it. Once it trains (`training`), the first Ctrl-C asks
    for a clean stop (`requested`) and a second one interrupts at once. After an interrupt, and
    while the run winds down (`hold`), Ctrl-C only says that it is stopping: the summary must be
    written and Ray's processes stopped, and a Ctrl-C that cut that short would leave them running.
    The handler found is put back at the end, or, in a process that ends with the run (`final`),
    Ctrl-C is ignored from then on: it could only turn the exit code into death by the signal while
    the interpreter exits. In the main thread only, as every signal handler.
    """

    def __init__(self, final: bool = False) -> None:
        self.requested = False
        self.final = final
        self._mode = "starting"  # starting | training | held
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN if self.final else self._previous)
        sys.unraisablehook = self._previous_hook

    def training(self) -> None:
        self._mode = "training"

    def hold(self) -> None:
        self._mode = "held"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._mode == "held":
            sys.stderr.write("still stopping: saving the run and stopping Ray's processes take a few seconds\n")
        elif self._mode == "training" and not self.requested:
            self.requested = True
        else:
            # While training, the stop was requested already: if this interrupt is lost (raised in
            # a callback that swallows it), the run still stops. While starting, nothing holds
            # until the clean-up says so: the next Ctrl-C interrupts again.
            if self._mode == "training":
                self._mode = "held"
            raise KeyboardInterrupt

    def _unraisable(self, unraisable: Any) -> None:
        """An interrupt raised where Python cannot raise it (a garbage collection callback, as JAX
        has) is printed and dropped: while starting, deliver the Ctrl-C again, to land elsewhere."""
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._previous_hook(unraisable)
        elif self._mode == "starting":  # from another thread, a moment later: out of the callback
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
