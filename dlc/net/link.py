"""Emulated network links between learners and the syncer.

Each learner has one link to the syncer, with a bandwidth, a latency and a jitter, and each
direction of it is a FIFO queue: a message of B bytes starts going out when the messages ahead
of it have gone (and not while the link is cut), takes 8 B / bandwidth to go out, and arrives
`latency + jitter` later, never before the message ahead of it. `Link` computes arrival times;
`DelayLine` holds messages until then and hands them on. Both take the time as an argument, so
tests drive them with a fake clock.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

import numpy as np

from dlc.config.learners import LinkSpec


class Link:
    """One direction of one link: when does a message of n bytes sent at `now` arrive?"""

    def __init__(self, spec: LinkSpec, seed: int = 0) -> None:
        self.spec = spec
        self._rng = np.random.default_rng(seed)
        self._free_at = float("-inf")  # when the last message has finished going out
        self._last_arrival = float("-inf")
        self._factor = 1.0  # degradation: transmission time and latency are multiplied by this
        self._degraded_until = float("-inf")
        self._cut_until = float("-inf")
        self.blocked_s = 0.0  # time messages spent queued behind others or a cut
        self.impaired = False  # ever degraded or cut: from then on every message goes through the queue

    def degrade(self, factor: float, until: float) -> None:
        self._factor, self._degraded_until = factor, until
        self.impaired = True

    def cut(self, until: float) -> None:
        self._cut_until = max(self._cut_until, until)
        self.impaired = True

    def arrival(self, nbytes: int, now: float) -> float:
        start = max(now, self._free_at, self._cut_until)
        factor = self._factor if start < self._degraded_until else 1.0
        bandwidth = self.spec.bandwidth_mbps
        transmit = 0.0 if bandwidth is None else 8.0 * nbytes / (bandwidth * 1e6) * factor
        self._free_at = start + transmit
        latency = self.spec.latency_ms
        if self.spec.jitter_ms > 0:
            latency += abs(float(self._rng.normal(0.0, self.spec.jitter_ms)))
        arrive = max(self._free_at + latency * factor / 1000.0, self._last_arrival)  # FIFO: no overtaking
        self._last_arrival = arrive
        self.blocked_s += start - now
        return arrive


class DelayLine:
    """Holds messages until their links deliver them; `pump(now)` hands on every one that is due.

    With `start_thread`, a thread pumps on the wall clock (`time.monotonic`). Messages of one
    link keep their order; messages of different links interleave by arrival time.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, start_thread: bool = True) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        if start_thread:
            self._thread = threading.Thread(target=self._run, name="delay-line", daemon=True)
            self._thread.start()

    def send(self, link: Link, nbytes: int, deliver: Callable[[], None]) -> float:
        """Queue `deliver` to run when a message of `nbytes` sent now arrives; returns that time."""
        with self._cond:
            arrive = link.arrival(nbytes, self.clock())
            heapq.heappush(self._heap, (arrive, next(self._order), deliver))
            self._cond.notify()
        return arrive

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def pump(self, now: float) -> int:
        """Deliver every message due by `now`, in arrival order; returns how many."""
        due = []
        with self._cond:
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap)[2])
        for deliver in due:
            deliver()
        return len(due)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued message has been delivered (end of a run); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.pending():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                wait = self._heap[0][0] - self.clock() if self._heap else None
                if wait is None or wait > 0:
                    self._cond.wait(timeout=wait)
                    continue
            self.pump(self.clock())
