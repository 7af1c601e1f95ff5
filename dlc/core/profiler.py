"""A JAX profiler trace of a few of a learner's steps (the recipe's `profile` section).

The trace is what `jax.profiler.start_trace` writes: `<directory>/plugins/profile/<time>/`, which
TensorBoard's profile plugin reads (`tensorboard --logdir <directory>`), with a
`perfetto_trace.json.gz` beside it for https://ui.perfetto.dev.
"""

from __future__ import annotations

from pathlib import Path


class StepProfiler:
    """Traces a learner's steps `first` to `last` (its step counter once each has finished: step 1 is
    the first step), from the start of step `first` to the end of step `last`. A learner resumed past
    `last` traces nothing; one resumed between them traces from where it is."""

    def __init__(self, directory: Path, first: int, last: int) -> None:
        self.directory = directory
        self.first, self.last = first, last
        self.active = False
        self.done = False

    def tick(self, step: int) -> bool:
        """Called before each step with the learner's step so far, and once more when it stops
        stepping; True when it has just finished the trace."""
        import jax

        if not self.active and not self.done and self.first - 1 <= step < self.last:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self.active = True
        elif self.active and step >= self.last:
            return self.close()
        return False

    def close(self) -> bool:
        """Stop a trace under way (the run ended inside the range); True if there was one."""
        if not self.active:
            return False
        import jax

        jax.profiler.stop_trace()
        self.active, self.done = False, True
        return True
