"""The one seam every learner <-> syncer message passes through.

It counts the bytes each message carries (the codec's output: payload plus scales; headers and
Ray framing are not counted) and is where link bandwidth and latency will be emulated.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from dlc.codec import Encoded


@dataclass(frozen=True)
class MergedFragment:
    """Syncer -> learner: the new global value of fragment p at version v."""

    fragment: int
    version: int
    payload: Encoded
    sent_at: float
    merged: tuple[tuple[int, int], ...] = ()  # (learner, seq) of the pushes merged: their acknowledgement


class Message(Protocol):
    payload: Encoded


class RemoteMethod(Protocol):
    def remote(self, *args: Any) -> Any: ...


class Transport:
    """Sends messages to Ray actor methods without waiting for them, and counts bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.messages_sent = 0

    def send(self, method: RemoteMethod, message: Message) -> int:
        """Fire-and-forget `method.remote(message)`; returns the bytes counted."""
        nbytes = message.payload.nbytes
        method.remote(message)
        with self._lock:
            self.bytes_sent += nbytes
            self.messages_sent += 1
        return nbytes
