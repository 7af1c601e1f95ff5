"""Direct channels between learners and the syncer: the messages of training, beside Ray.

Every Ray actor call costs its two processes about a millisecond of CPU between them, whatever it
carries (`bench/ray_calls.py`), and at one fragment a step a learner step takes three: the
syncer's request, the push and the merged fragment. A message on a socket costs about a
seventh of that. So with `syncer.channel: direct` the syncer listens on its node's address, every
learner process connects to it, and requests, pushes, merged fragments and heartbeats travel on
that one connection. Ray still starts, places, watches and restarts the processes and carries
everything else (state copies, polls, control); the transport's link emulation sits in front of
these channels as it does in front of actor calls.

A connection is served only after it proves it holds the run's key (the HMAC challenge of
`multiprocessing.connection`); learners get the key from the syncer through Ray. The messages of
every step travel in fixed layouts, the rest pickled (`dlc.net.wire`), and nothing is read before
that proof.

Failures keep the semantics of fire-and-forget actor calls: a message to or from a process that
died is lost, never an error for the sender, and nobody waits on a frozen process. Each learner's
messages from the syncer have a queue and a thread of their own (a frozen learner fills only its
own socket), held until its process connects; a new member or a new incarnation gets a fresh
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
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import (
    AuthenticationError,
    Connection,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

from dlc.net import wire

# Errors of a connection that closed, broke or was hung up on: the peer is gone.
_GONE = (EOFError, OSError, ValueError, AuthenticationError)


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


def _connection(sock: socket.socket) -> Connection:
    """A blocking TCP socket as a message connection; small messages leave at once (no Nagle delay)."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Connection(sock.detach())


def _hang_up(conn: Connection) -> None:
    """Shut the connection down both ways, waking any thread blocked on it; its reader closes it."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed or never connected
        pass


Frame = list[memoryview]  # a message as `Connection.recv_bytes` reads it: a header, then its bytes
# The most buffers one sendmsg takes (a batch of many messages is written in several calls).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _frame(message: Any) -> Frame:
    """`message` as `dlc.net.wire` writes it, framed as `multiprocessing.connection.Connection.send_bytes` frames it."""
    body = wire.dumps(message)
    n = len(body)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return [memoryview(header), memoryview(body)]


def _after(frame: Frame, sent: int) -> Frame:
    """What is left of `frame` once its first `sent` bytes are written."""
    rest = []
    for buf in frame:
        if sent >= len(buf):
            sent -= len(buf)
        else:
            rest.append(buf[sent:])
            sent = 0
    return rest


class _Peer:
    """One learner process's connection as the syncer holds it: whole messages, one writer at a time.

    A message either goes whole (`send`, waiting as long as the socket does) or begins without
    waiting (`start`): then whatever the socket did not take is the connection's `rest`, which
    must be written before anything else is.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))  # for writes that must not wait
        self._lock = threading.Lock()
        self.rest: Frame = []
        self.received = 0  # messages read from it (by its reader thread alone)

    def send(self, frame: Frame) -> bool:
        """Write the rest of a message begun, then `frame` (nothing when empty); False if the
        connection is gone (the message is lost, like a call to a dead actor)."""
        try:
            with self._lock:
                self._write_all(self.rest)
                self.rest = []
                self._write_all(frame)
            return True
        except _GONE:
            return False

    def start(self, frame: Frame) -> bool:
        """Write what the socket takes of `frame` now, never waiting; the remainder becomes `rest`.

        False when nothing was begun: another write holds the connection or a rest is pending.
        OSError if the connection is gone.
        """
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self.rest:
                return False
            try:
                sent = self._sock.sendmsg(frame[:_IOV_MAX], [], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                sent = 0
            self.rest = _after(frame, sent)
            return True
        finally:
            self._lock.release()

    def _write_all(self, frame: Frame) -> None:
        while frame:
            frame = _after(frame, self._sock.sendmsg(frame[:_IOV_MAX], [], socket.MSG_NOSIGNAL))

    def close(self) -> None:
        with self._lock:  # not under a send on another thread
            self.conn.close()
            self._sock.close()


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
        self._peer: _Peer | None = None
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
        except _GONE:  # lost; the next messages wait for a new connection
            begun = True
            self.detach(peer)
        with self._cond:
            self._writing = False
            if not begun:
                self._queue.appendleft(frame)
            if self._queue or peer.rest:  # the port's thread finishes what the socket did not take
                self._cond.notify()

    def attach(self, peer: _Peer) -> None:
        """From now on messages go to `peer` (a learner process that connected, or connected again)."""
        with self._cond:
            old, self._peer = self._peer, peer
            self._cond.notify()
        if old is not None and old is not peer:
            _hang_up(old.conn)

    def close(self) -> None:
        """Drop what is queued and send nothing more: the learner left, or a new incarnation replaces
        it. Its connection stays up: a learner told to leave still sends its last pushes."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._peer = None
            self._cond.notify()

    def detach(self, peer: _Peer) -> None:
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
                self._writing = True
            sent = peer.send(frame)  # the rest of a message begun on a caller's thread first
            with self._cond:
                self._writing = False
            if not sent:  # lost; the next messages wait for a new connection
                self.detach(peer)


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
        self._peers: set[_Peer] = set()
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
        frame = _frame(message)
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
            _hang_up(peer.conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # the listener was shut down
                return
            conn = _connection(sock)
            threading.Thread(target=self._serve, args=(conn,), name="channel-reader", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        peer = port = None
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
            hello = conn.recv()
            if not isinstance(hello, Hello):
                return
            peer = _Peer(conn)
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
                    peer.send(_frame(message))
                else:
                    self._handle(message)
        except _GONE:
            pass
        finally:
            with self._lock:
                if peer in self._peers:
                    self._peers.discard(peer)
                    self._received_before += peer.received  # type: ignore[union-attr]
            if port is not None:
                port.detach(peer)  # type: ignore[arg-type]
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
        conn = _connection(socket.create_connection(tuple(address), timeout=30))
        try:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
            conn.send(Hello(learner))
        except BaseException:
            conn.close()
            raise
        with self._lock:
            old, self._conn, self.peer = self._conn, conn, (tuple(address), authkey)
        if old is not None:
            _hang_up(old)
        threading.Thread(target=self._read, args=(conn,), name="channel-reader", daemon=True).start()

    def remote(self, message: Any) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            with self._send_lock:
                conn.send_bytes(wire.dumps(message))
        except _GONE:
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
            _hang_up(conn)

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
        except _GONE:
            pass
        finally:
            self._lost(conn)
            with self._send_lock:  # not under a send on another thread
                conn.close()
