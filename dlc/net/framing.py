"""Messages on one TCP connection: framing, writes that never wait, hang-ups, the key handshake.

The syncer's and the learners' ends of a direct channel (`dlc.net.channel`) speak through these.
A message is framed as `multiprocessing.connection.Connection.send_bytes` frames it, so either end
may read it with `Connection.recv_bytes`; its bytes are `dlc.net.wire`'s.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from multiprocessing import AuthenticationError  # the class multiprocessing.connection raises; typeshed has it here
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from dlc.net import wire

# Errors of a connection that closed, broke or was hung up on: the peer is gone.
GONE = (EOFError, OSError, ValueError, AuthenticationError)


def connection(sock: socket.socket) -> Connection:
    """A blocking TCP socket as a message connection; small messages leave at once (no Nagle delay)."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Connection(sock.detach())


def hang_up(conn: Connection) -> None:
    """Shut the connection down both ways, waking any thread blocked on it; its reader closes it."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed or never connected
        pass


Frame = list[memoryview]  # a message as `Connection.recv_bytes` reads it: a header, then its bytes
# The most buffers one sendmsg takes (a batch of many messages is written in several calls).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def encode_frame(message: Any) -> Frame:
    """`message` as `dlc.net.wire` writes it, framed as `multiprocessing.connection.Connection.send_bytes` frames it."""
    body = wire.dumps(message)
    n = len(body)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return [memoryview(header), memoryview(body)]


def authenticate(conn: Connection, authkey: bytes, listening: bool) -> None:
    """Both ends prove they hold the run's key (the HMAC challenge of `multiprocessing.connection`),
    the listening end challenging first; AuthenticationError when the other end does not."""
    if listening:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
    else:
        answer_challenge(conn, authkey)
        deliver_challenge(conn, authkey)


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


class Peer:
    """One learner process's connection as the syncer holds it: whole messages, one writer at a time.

    A message either goes whole (`send`, waiting as long as the socket does) or begins without
    waiting (`start`): then whatever the socket did not take is the connection's `rest`, which
    must be written before anything else is.
    """

    def __init__(self, conn: Connection, order: int = 0) -> None:
        self.conn = conn
        self.order = order  # when the syncer accepted it: a learner's later connection is a larger one
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
        except GONE:
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
                sent = self._sock.sendmsg(frame[:IOV_MAX], [], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                sent = 0
            self.rest = _after(frame, sent)
            return True
        finally:
            self._lock.release()

    def _write_all(self, frame: Frame) -> None:
        while frame:
            frame = _after(frame, self._sock.sendmsg(frame[:IOV_MAX], [], socket.MSG_NOSIGNAL))

    def close(self) -> None:
        with self._lock:  # not under a send on another thread
            self.conn.close()
            self._sock.close()
