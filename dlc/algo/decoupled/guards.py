"""The syncer's judgements about time and size: quorum, the grace window, norm outliers.

Pure functions and small stateful estimators with no clock of their own: callers pass times in.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Collection


def quorum_needed(quorum: int, healthy: Collection[int]) -> int:
    """Pushes a round needs: K, or every healthy learner when fewer, but at least 1.

    Waiting for K when fewer than K learners are healthy would block the fragment
    until one returns; a round cannot close empty.
    """
    return max(1, min(quorum, len(healthy)))


class GraceWindow:
    """``window_s = max(0, gamma * (tau * step_time - quorum_time - sync_time))``.

    Each term is an EMA (weight ``ema`` on the newest value, the first value taken
    as is). Until a step time is seen the window is 0: close at quorum. Step-time
    samples above 4x the current EMA are clipped so one stall cannot blow it up,
    while a lasting slowdown still moves it within a few samples.
    """

    def __init__(
        self,
        gamma: float = 0.5,
        tau: int = 2,
        ema: float = 0.1,
        step_time_s: float | None = None,
    ) -> None:
        if not 0 <= gamma <= 1 or tau < 0 or not 0 < ema <= 1:
            raise ValueError(f"grace window: gamma={gamma}, tau={tau}, ema={ema}")
        self.gamma, self.tau, self.ema = gamma, tau, ema
        self.step_time_s = step_time_s
        self.quorum_time_s: float | None = None
        self.sync_time_s: float | None = None

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.ema * (new - old)

    def observe_step(self, seconds: float) -> None:
        """One learner step took ``seconds``."""
        if self.step_time_s is not None:
            seconds = min(seconds, 4 * self.step_time_s)
        self.step_time_s = self._mix(self.step_time_s, max(0.0, seconds))

    def observe_quorum(self, seconds: float) -> None:
        """A round's first answer waited ``seconds`` for quorum."""
        self.quorum_time_s = self._mix(self.quorum_time_s, max(0.0, seconds))

    def observe_sync(self, seconds: float) -> None:
        """A round took ``seconds`` from close to the merged fragment being sent."""
        self.sync_time_s = self._mix(self.sync_time_s, max(0.0, seconds))

    def window_s(self) -> float:
        """How long to wait after quorum for more pushes."""
        if self.step_time_s is None:
            return 0.0
        slack = self.tau * self.step_time_s - (self.quorum_time_s or 0.0) - (self.sync_time_s or 0.0)
        return max(0.0, self.gamma * slack)


class NormOutlier:
    """Flags an update whose norm per step is far above the fragment's recent ones.

    Works on log(norm / steps) of the last ``window`` finite pushes of one fragment: reject
    when ``value - median > max(z_max * 1.4826 * MAD, log(min_ratio))``, i.e. more than
    ``z_max`` robust standard deviations above and never within ``min_ratio`` times the
    median. Per step, because a push's norm grows with the steps it covers. Only large
    norms are rejected: a small update is harmless, and norms fall by an order of magnitude
    as the learning rate decays. Rejected norms enter the history too, so a lasting shift
    (the end of learning-rate warm-up) becomes the new normal within a window instead of
    locking a fragment out for good. Nothing is flagged before ``warmup`` norms.
    """

    def __init__(
        self,
        warmup: int = 5,
        window: int = 20,
        z_max: float = 6.0,
        min_ratio: float = 32.0,
    ) -> None:
        if warmup < 1 or window < warmup or z_max <= 0 or min_ratio <= 1:
            raise ValueError(f"norm outlier: warmup={warmup}, window={window}, z_max={z_max}, min_ratio={min_ratio}")
        self.warmup, self.z_max, self.min_ratio = warmup, z_max, min_ratio
        self._logs: deque[float] = deque(maxlen=window)

    def check(self, norm_per_step: float) -> str | None:
        """Why ``norm_per_step`` is an outlier, or None when it is fine."""
        if len(self._logs) < self.warmup or norm_per_step <= 0:
            return None
        # Plain floats: NumPy's median costs ten times as much on a window this small, and the
        # syncer asks for every push.
        median = statistics.median(self._logs)
        band = max(
            self.z_max * 1.4826 * statistics.median(abs(x - median) for x in self._logs),
            math.log(self.min_ratio),
        )
        if math.log(norm_per_step) - median <= band:
            return None
        return (
            f"norm per step {norm_per_step:.3g} vs median {math.exp(median):.3g}: "
            f"more than {math.exp(band):.3g}x larger"
        )

    def add(self, norm_per_step: float) -> None:
        """Record a finite norm per step (accepted or not)."""
        if norm_per_step > 0:
            self._logs.append(math.log(norm_per_step))
