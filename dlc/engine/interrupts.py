"""What Ctrl-C or SIGTERM does to `dlc train`: interrupt a start, ask a training run to stop, never cut its end short.

A run interrupted ends with the shell's code for the signal: 130 for Ctrl-C (SIGINT), 143 for the
SIGTERM a scheduler sends before it takes the machine away (Kubernetes, Slurm, a spot VM's notice).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

EXIT_INTERRUPTED = 128 + signal.SIGINT
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The start was interrupted, or a second signal cut the end short; `exit_code` is the signal's."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def exit_code_of(exc: KeyboardInterrupt) -> int:
    """The shell's exit code for an interrupt: its signal's, or Ctrl-C's for a plain KeyboardInterrupt."""
    return exc.exit_code if isinstance(exc, Interrupted) else EXIT_INTERRUPTED


class Interrupts:
    """What Ctrl-C (SIGINT) and SIGTERM do to `dlc train`, from the start of the cluster to its stop;
    both do the same, and the first one's signal gives the exit code (`exit_code`).

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
        self.signum: int | None = None  # the first signal that asked to stop
        self._mode = "starting"  # starting | training | held
        self._previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int:
        """The shell's code for the signal that stopped the run (130 if none did)."""
        return EXIT_INTERRUPTED if self.signum is None else 128 + self.signum

    def __enter__(self) -> Interrupts:
        self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}
        self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def claim(self) -> None:
        """Take the signals back after `ray.init`, which sets its own SIGTERM handler (a bare
        `sys.exit`) and, under it, the core worker's failure-signal dump."""
        for signum in SIGNALS:
            signal.signal(signum, self._handle)

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if self.final else previous)
        sys.unraisablehook = self._previous_hook

    def training(self) -> None:
        """The run trains: the next Ctrl-C asks for a clean stop. One that came while it started and
        was swallowed on its way out (a library that clears a pending exception, never reaching
        `_unraisable`) asks for it now: reaching here with a signal seen means nothing raised it."""
        self._mode = "training"
        if self.signum is not None:
            self.requested = True

    def hold(self) -> None:
        self._mode = "held"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
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
            raise Interrupted(self.signum)

    def _unraisable(self, unraisable: Any) -> None:
        """An interrupt raised where Python cannot raise it (a garbage collection callback, as JAX
        has) is printed and dropped: while starting, deliver the Ctrl-C again, to land elsewhere."""
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._previous_hook(unraisable)
        elif self._mode == "starting":  # from another thread, a moment later: out of the callback
            threading.Timer(0.01, self._deliver_again).start()

    def _deliver_again(self) -> None:
        """Send the dropped signal again, if the run still starts: once it trains, `training` has
        asked for the stop already, and a second signal would cut it short."""
        if self._mode == "starting":
            os.kill(os.getpid(), self.signum or signal.SIGINT)
