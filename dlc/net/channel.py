"""Direct channels between learners and the syncer: the messages of training, beside Ray.

Every Ray actor call costs its two processes about a millisecond of CPU between them, whatever it
carries (`bench/ray_calls.py`), and at one fragment a step a learner step takes three: the
syncer's request, the push and the merged fragment. A message on a socket costs about a
seventh of that. So with `syncer.channel: direct` the syncer listens on its node's address, every
learner process connects to it, and requests, pushes, merged fragments and heartbeats travel on
that one connection. Ray still starts, places, watches and restarts the processes and carries
everything else (state copies, polls, control); the transport's link emulation sits in front of
these channels as it does in front of actor calls.

A connection is served only after it proves it holds the run's key (`dlc.net.framing`); learners
get the key from the syncer through Ray. The messages of every step travel in fixed layouts, the
rest pickled (`dlc.net.wire`), and nothing is read before that proof.

Failures keep the semantics of fire-and-forget actor calls: a message to or from a process that
died is lost, never an error for the sender, and nobody waits on a frozen process. Each learner's
messages from the syncer have a queue and a thread of their own (`dlc.net.port`: a frozen learner
fills only its own socket), held until its process connects; a new member or a new incarnation gets a fresh
queue. A message the learner's socket takes whole is written on the syncer's thread that sends it
(a thread woken per message costs a busy core more than the write); the port's thread finishes
one the socket does not take, and sends what queues behind it. A message going to every member
is encoded once. A learner whose connection breaks connects again (`Uplink.connected`); pushes the
syncer never acknowledged are re-sent by the learner's protocol, as after a syncer restart.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from dlc.net import wire
from dlc.net.framing import GONE, Frame, Peer, authenticate, connection, encode_frame, hang_up
from dlc.net.port import Port


@dataclass(frozen=True)
class Hello:
    """Learner -> syncer, first on every connection: which learner's messages it carries down."""

    learner: int


@dataclass(frozen=True)
class Beat:
    """Learner -> syncer: a heartbeat, with the learner's inner step (None: it does not say)."""

    learner: int
    step: int | None


@dataclass(frozen=True)
class Barrier:
    """Learner -> syncer and back: every message the learner sent before it has been handled."""

    token: int


class Hub:
    """The syncer's end: a listener on `host`, one reader thread per learner process, one port per member.

    `handle(message)` is called with every message a learner sends but a barrier, from the reader
    thread of its connection, so one learner's messages are handled in the order it sent them.
    """

    def __init__(self, host: str, handle: Callable[[Any], None]) -> None:
        self.authkey = os.urandom(32)
        # Each connection proves the key on its own thread, so one that stalls half-way holds up no other.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family, backlog=64)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._handle = handle
        self._lock = threading.Lock()
        self._ports: dict[int, Port] = {}
        self._peers: set[Peer] = set()
        self._accepted = itertools.count()  # connections in the order they were accepted
        self._received_before = 0  # messages read from connections since ended
        self._last: tuple[Any, Frame] | None = None  # the last message framed, and its frame
        self._batches = threading.local()  # per thread: None, or each port's frames (`batch`)
        self._closed = False
        threading.Thread(target=self._accept, name="channel-accept", daemon=True).start()

    def open(self, learner: int) -> Port:
        """A fresh port for `learner` (a new member, or a new incarnation): the old one is closed."""
        port = Port(learner, self)
        with self._lock:
            old, self._ports[learner] = self._ports.get(learner), port
        if old is not None:
            old.close()
        return port

    def frame(self, message: Any) -> Frame:
        """`message` framed, once for all the ports it goes to (a merged fragment goes to every member)."""
        last = self._last
        if last is not None and last[0] is message:
            return last[1]
        frame = encode_frame(message)
        self._last = (message, frame)
        return frame

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Messages this thread sends meanwhile leave together when it ends, each port's in one
        write: a merged fragment and the next round's request then reach a learner in one read,
        with one wake of its receiving thread. Batches nest (the outermost sends)."""
        if self.batch_of_this_thread() is not None:
            yield
            return
        self._batches.ports = {}
        try:
            yield
        finally:
            ports, self._batches.ports = self._batches.ports, None
            for port, frame in ports.items():
                port.write(frame)

    def batch_of_this_thread(self) -> dict[Port, Frame] | None:
        return getattr(self._batches, "ports", None)

    @property
    def received(self) -> int:
        """Messages learners have sent up on this hub, barriers included."""
        with self._lock:
            return self._received_before + sum(peer.received for peer in self._peers)

    def port(self, learner: int) -> Port | None:
        with self._lock:
            return self._ports.get(learner)

    def drop(self, learner: int) -> None:
        """`learner` left: what is queued for it is dropped and nothing more is sent; what it sends is still heard."""
        with self._lock:
            port = self._ports.pop(learner, None)
        if port is not None:
            port.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ports, self._ports = list(self._ports.values()), {}
            peers = list(self._peers)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close alone would not
        self._listener.close()
        for port in ports:
            port.close()
        for peer in peers:
            hang_up(peer.conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # the listener was shut down
                return
            conn = connection(sock)
            order = next(self._accepted)
            threading.Thread(target=self._serve, args=(conn, order), name="channel-reader", daemon=True).start()

    def _serve(self, conn: Connection, order: int) -> None:
        peer: Peer | None = None
        port: Port | None = None
        try:
            authenticate(conn, self.authkey, listening=True)
            hello = conn.recv()
            if not isinstance(hello, Hello):
                return
            peer = Peer(conn, order)
            with self._lock:
                if self._closed:
                    return
                self._peers.add(peer)
                port = self._ports.get(hello.learner)
            if port is not None:  # a non-member's messages up are still handled; nothing goes down
                port.attach(peer)
            while True:
                message = wire.loads(conn.recv_bytes())
                peer.received += 1
                if isinstance(message, Barrier):  # everything sent before it has been handled
                    peer.send(encode_frame(message))
                else:
                    self._handle(message)
        except GONE:
            pass
        finally:
            with self._lock:
                if peer in self._peers:
                    self._peers.discard(peer)
                    self._received_before += peer.received
            if port is not None and peer is not None:  # a port is only looked up for a peer
                port.detach(peer)
            if peer is None:
                conn.close()
            else:
                peer.close()


class Uplink:
    """A learner's end: its pushes and heartbeats up, the syncer's messages down to `receive`.

    `remote(message)` sends at once on the calling thread (the learner's sender and heartbeat
    threads, never its step loop) and returns; with no connection, or a broken one, the message
    is lost. `receive` is called from a reader thread, in the order the syncer sent; it must not raise.
    """

    def __init__(self, receive: Callable[[Any], None]) -> None:
        self._receive = receive
        self._lock = threading.Lock()  # guards _conn and peer
        self._send_lock = threading.Lock()  # whole messages, one at a time
        self._conn: Connection | None = None
        self.peer: tuple[tuple[str, int], bytes] | None = None  # the syncer's address and key
        self._tokens = itertools.count()
        self._barriers: dict[int, threading.Event] = {}

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def connect(self, address: tuple[str, int], authkey: bytes, learner: int) -> None:
        """Connect as `learner` (and hang up any earlier connection); raises if the syncer cannot be reached."""
        host, port = address  # any pair: a list from a Ray answer too
        conn = connection(socket.create_connection((host, port), timeout=30))
        try:
            authenticate(conn, authkey, listening=False)
            conn.send(Hello(learner))
        except BaseException:
            conn.close()
            raise
        with self._lock:
            old, self._conn, self.peer = self._conn, conn, ((host, port), authkey)
        if old is not None:
            hang_up(old)
        threading.Thread(target=self._read, args=(conn,), name="channel-reader", daemon=True).start()

    def remote(self, message: Any) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with self._send_lock:
                conn.send_bytes(wire.dumps(message))
        except GONE:
            self._lost(conn)

    def heartbeat(self, learner: int, step: int | None) -> None:
        self.remote(Beat(learner, step))

    def barrier(self, timeout_s: float) -> None:
        """Return once the syncer has handled every message sent before.

        ConnectionError if the connection is or goes down first (those messages may be lost),
        TimeoutError if the syncer does not answer in `timeout_s`.
        """
        conn, token, done = self._conn, next(self._tokens), threading.Event()
        self._barriers[token] = done
        try:
            self.remote(Barrier(token))
            deadline = time.monotonic() + timeout_s
            while not done.wait(0.05):
                if conn is None or self._conn is not conn:
                    raise ConnectionError("the connection to the syncer went down before it confirmed them")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the syncer did not confirm the learner's last messages in {timeout_s} s")
        finally:
            self._barriers.pop(token, None)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            hang_up(conn)

    def _lost(self, conn: Connection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def _read(self, conn: Connection) -> None:
        try:
            while True:
                message = wire.loads(conn.recv_bytes())
                if isinstance(message, Barrier):
                    done = self._barriers.pop(message.token, None)
                    if done is not None:
                        done.set()
                else:
                    self._receive(message)
        except GONE:
            pass
        finally:
            self._lost(conn)
            with self._send_lock:  # not under a send on another thread
                conn.close()
