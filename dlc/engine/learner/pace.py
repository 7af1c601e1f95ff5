"""How fast a learner trains: the tokens per second its loop measures, and chaos's slow-down.

The live view shows two rates per learner: `tokens_per_s` over the last few seconds (what it does
now) and `steady_tokens_per_s` since its first step (start-up, compilation and any copy excluded).
Chaos's `slow` fault stretches every step of one learner to a multiple of its natural length
for a while, as a slower or shared machine would.
"""

from __future__ import annotations

import time

WINDOW_S = 5.0  # the recent rate is measured over about the last this many seconds (at least two steps)


class Throughput:
    """A learner loop's tokens per second, recent (`rate`) and since its first step (`steady`)."""

    def __init__(self) -> None:
        self.rate = 0.0
        self.steady = 0.0
        self._first: tuple[float, int] | None = None  # (time, tokens) at the end of the first step
        self._window: list[tuple[float, int]] = []

    @property
    def started(self) -> bool:
        """Whether a step has been measured: start-up ends with the first."""
        return self._first is not None

    def measure(self, now: float, tokens: int) -> None:
        """A step ended at monotonic time `now` with `tokens` trained in all."""
        if self._first is None:
            self._first = (now, tokens)
        first_t, first_tokens = self._first
        self.steady = (tokens - first_tokens) / (now - first_t) if now > first_t else 0.0
        window = self._window
        window.append((now, tokens))
        while len(window) > 2 and now - window[0][0] > WINDOW_S:
            window.pop(0)
        self.rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]) if len(window) > 1 else 0.0


class Slowdown:
    """Chaos's `slow` fault on one learner: each step stretched to `factor` times its length until a deadline."""

    def __init__(self) -> None:
        self._factor = 1.0
        self._until = 0.0  # monotonic time

    def set(self, factor: float, seconds: float) -> None:
        self._factor, self._until = factor, time.monotonic() + seconds

    def pause_s(self, step_s: float) -> float | None:
        """How long to sleep after a step that took `step_s` of its own; None when not slowed now."""
        if self._factor > 1.0 and time.monotonic() < self._until:
            return (self._factor - 1.0) * step_s
        return None
