"""The syncer's end of one learner's direct channel: its messages down, in order, the sender never waiting.

`dlc.net.channel.Hub` opens one port per member.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

from dlc.net.framing import GONE, Frame, Peer, hang_up


class Hub(Protocol):
    """What a port uses of the hub that opened it (`dlc.net.channel.Hub`)."""

    def frame(self, message: Any) -> Frame: ...
    def batch_of_this_thread(self) -> dict[Port, Frame] | None: ...


class Port:
    """The syncer's messages to one learner, in order, never waiting on the caller's thread.

    `remote(message)` returns at once (the shape of a Ray method, so the transport can hold it
    behind an emulated link). The message is written on the caller's thread when the learner's
    socket takes it whole; otherwise the port's own thread finishes it, waiting as long as the
    learner takes to read, and sends what queued behind it. Messages wait until the learner's
    process connects; when its connection breaks they wait for the next one, until the port is
    closed.
    """

    def __init__(self, learner: int, hub: Hub) -> None:
        self.learner = learner
        self._hub = hub
        self._queue: deque[Frame] = deque()
        self._cond = threading.Condition()
        self._peer: Peer | None = None
        self._newest = -1  # the order of the newest connection attached
        self._writing = False  # a thread is writing one of this port's messages
        self._closed = False
        threading.Thread(target=self._run, name=f"port-{learner}", daemon=True).start()

    def remote(self, message: Any) -> None:
        frame = self._hub.frame(message)
        batch = self._hub.batch_of_this_thread()
        if batch is not None:  # it leaves with the batch (`Hub.batch`)
            batch.setdefault(self, []).extend(frame)
        else:
            self.write(frame)

    def write(self, frame: Frame) -> None:
        """Write `frame` (one message or several) now if the socket takes it, else queue it."""
        with self._cond:
            if self._closed:
                return
            peer = self._peer
            if peer is None or self._writing or self._queue:
                self._queue.append(frame)
                self._cond.notify()
                return
            self._writing = True
        try:
            begun = peer.start(frame)
        except GONE:  # lost; the next messages wait for a new connection
            begun = True
            self.detach(peer)
        with self._cond:
            self._writing = False
            if not begun:
                self._queue.appendleft(frame)
            if self._queue or peer.rest:  # the port's thread finishes what the socket did not take
                self._cond.notify()

    def attach(self, peer: Peer) -> None:
        """From now on messages go to `peer` (a learner process that connected, or connected again).

        A connection older than one attached already is hung up instead: its reader thread read its
        hello late, after the learner had hung it up and connected again, and messages sent to it
        would be lost (or it would hang up the live one)."""
        with self._cond:
            stale = peer.order < self._newest
            if not stale:
                old, self._peer, self._newest = self._peer, peer, peer.order
                self._cond.notify()
        if stale:
            hang_up(peer.conn)
        elif old is not None and old is not peer:
            hang_up(old.conn)

    def close(self) -> None:
        """Drop what is queued and send nothing more: the learner left, or a new incarnation replaces
        it. Its connection stays up: a learner told to leave still sends its last pushes."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._peer = None
            self._cond.notify()

    def detach(self, peer: Peer) -> None:
        """`peer`'s connection ended: hold messages for the next one."""
        with self._cond:
            if self._peer is peer:
                self._peer = None

    @property
    def connected(self) -> bool:
        return self._peer is not None

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (
                    self._peer is None or self._writing or not (self._queue or self._peer.rest)
                ):
                    self._cond.wait()
                if self._closed:
                    return
                peer, frame = self._peer, self._queue.popleft() if self._queue else []
                assert peer is not None  # the wait ends on a peer, or on closing
                self._writing = True
            sent = peer.send(frame)  # the rest of a message begun on a caller's thread first
            with self._cond:
                self._writing = False
            if not sent:  # lost; the next messages wait for a new connection
                self.detach(peer)
