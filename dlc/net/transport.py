"""The one seam every learner <-> syncer message passes through.

It counts the bytes each message carries (the codec's output: payload plus scales; headers and
Ray framing are not counted) and emulates each learner's network link when the recipe gives it
a bandwidth or a latency (`dlc.net.link`): a message then reaches its Ray actor method, or its
direct channel (`dlc.net.channel`), only when the link would have delivered it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from dlc.config.learners import LinkSpec
from dlc.core.codec import Encoded
from dlc.net.link import DelayLine, Link


class Message(Protocol):
    @property
    def payload(self) -> Encoded | None: ...  # None: a control message, counted as 0 bytes (read only: frozen)


class RemoteMethod(Protocol):
    def remote(self, *args: Any) -> Any: ...


class Transport:
    """Sends messages to Ray actor methods without waiting for them, and counts bytes.

    `link_of(i)` is the link a message to or from learner i takes (in this process's sending
    direction). An ideal link that was never impaired sends at once; any other goes through a
    delay line.
    """

    def __init__(self, link_of: Callable[[int], LinkSpec] | None = None, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.messages_sent = 0
        self._link_of = link_of or (lambda i: LinkSpec())
        self._seed = seed
        self.links: dict[int, Link] = {}
        self._line: DelayLine | None = None

    def link(self, index: int) -> Link:
        with self._lock:
            if index not in self.links:
                self.links[index] = Link(self._link_of(index), seed=self._seed * 1000 + index)
            return self.links[index]

    def immediate(self, link: int) -> bool:
        """Whether a message on learner `link`'s link goes out at once (an ideal link, never impaired)."""
        emulated = self.link(link)
        return not (emulated.spec.emulated or emulated.impaired)

    def send(self, method: RemoteMethod, message: Message, link: int | None = None) -> int:
        """`method.remote(message)` now, or when learner `link`'s link delivers it; returns the bytes counted."""
        nbytes = message.payload.nbytes if message.payload is not None else 0
        if link is None or self.immediate(link):
            method.remote(message)
        else:
            self._delay_line().send(self.link(link), nbytes, lambda: method.remote(message))
        with self._lock:
            self.bytes_sent += nbytes
            self.messages_sent += 1
        return nbytes

    def _delay_line(self) -> DelayLine:
        with self._lock:
            if self._line is None:
                self._line = DelayLine()
            return self._line

    def impair(self, link: int, factor: float | None, seconds: float) -> None:
        """Degrade learner `link`'s link by `factor` (None: cut it) for `seconds`."""
        emulated = self.link(link)
        until = self._delay_line().clock() + seconds
        if factor is None:
            emulated.cut(until)
        else:
            emulated.degrade(factor, until)

    def blocked_s(self) -> float:
        """Seconds messages spent queued behind others or a cut, over all links."""
        return sum(link.blocked_s for link in list(self.links.values()))

    def queued(self) -> int:
        """Messages sent but not yet delivered by their link."""
        return self._line.pending() if self._line is not None else 0

    def drain(self, timeout_s: float) -> bool:
        """Wait until every message has been delivered; False if some are still held after `timeout_s`."""
        return self._line.drain(timeout_s) if self._line is not None else True
