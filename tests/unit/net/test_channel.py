"""The direct channel between learners and the syncer, on real loopback sockets: order both ways,
messages held until a learner connects, a frozen learner holding up nobody, a wrong key refused,
a new incarnation's fresh queue, reconnection, and a syncer that goes away."""

from __future__ import annotations

import queue
import socket
import threading
import time
from multiprocessing.connection import AuthenticationError, Client, Pipe

import numpy as np
import pytest

from dlc.net import wire
from dlc.net.channel import Beat, Hello, Hub, Uplink
from dlc.net.framing import Peer


def until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Learner:
    """An Uplink and what reached it from the syncer."""

    def __init__(self, hub: Hub | None = None, index: int = 0) -> None:
        self.got: queue.SimpleQueue = queue.SimpleQueue()
        self.uplink = Uplink(self.got.put)
        if hub is not None:
            self.uplink.connect(hub.address, hub.authkey, index)

    def take(self, n: int) -> list:
        return [self.got.get(timeout=10) for _ in range(n)]


@pytest.fixture
def hub():
    received: list = []
    hub = Hub("127.0.0.1", received.append)
    hub.handled = received
    yield hub
    hub.close()


def test_messages_go_both_ways_in_order_and_a_barrier_follows_the_pushes(hub):
    handled: list = []

    def slow(message):  # the syncer takes its time over each push
        time.sleep(0.002)
        handled.append(message)

    slow_hub = Hub("127.0.0.1", slow)
    try:
        port = slow_hub.open(0)
        learner = Learner(slow_hub, 0)
        for i in range(50):
            learner.uplink.remote(("push", i, np.full(1000, i, np.float32)))
        learner.uplink.heartbeat(0, 7)
        learner.uplink.barrier(timeout_s=10)
        # The barrier returned only after everything sent before it was handled, in order.
        assert [m[1] for m in handled[:50]] == list(range(50))
        assert handled[50] == Beat(0, 7)
        assert slow_hub.received == 52  # the barrier too
        for i in range(50):
            port.remote(i)
        assert learner.take(50) == list(range(50))
    finally:
        slow_hub.close()


def test_messages_for_a_learner_wait_until_its_process_connects(hub):
    port = hub.open(3)
    for i in range(5):
        port.remote(i)
    assert port.pending() == 5
    learner = Learner(hub, 3)
    assert learner.take(5) == [0, 1, 2, 3, 4]


def test_a_frozen_learner_holds_up_neither_the_syncer_nor_the_other_learners(hub):
    frozen_port, port = hub.open(0), hub.open(1)
    # A learner process that connected and then froze: it never reads again.
    frozen = Client(hub.address, authkey=hub.authkey)
    frozen.send(Hello(0))
    healthy = Learner(hub, 1)
    big = np.zeros(1 << 20, np.uint8)
    started = time.monotonic()
    for _ in range(64):  # 64 MiB: far more than the frozen learner's socket holds
        frozen_port.remote(big)
    assert time.monotonic() - started < 1.0  # the caller never waits for the frozen reader
    port.remote("hello")
    assert healthy.take(1) == ["hello"]
    assert frozen_port.pending() > 0  # still stuck behind the frozen reader
    frozen.close()


def test_messages_larger_than_the_socket_takes_arrive_whole_and_in_order(hub):
    # Messages far larger than a socket takes at once, between small ones and before the echo of a
    # barrier: every write on the connection is a whole message.
    port = hub.open(0)
    learner = Learner(hub, 0)
    until(lambda: port.connected)
    big = np.arange(8 << 20, dtype=np.uint8)  # 8 MiB: more than a loopback socket takes at once
    expected = []
    for i in range(6):
        message = big + i if i % 2 else i
        port.remote(message)
        expected.append(message)
    learner.uplink.barrier(timeout_s=30)  # its echo follows the rest of the message begun before it
    for want, got in zip(expected, learner.take(6), strict=True):
        assert got == want if isinstance(want, int) else np.array_equal(got, want)
    port.remote("after")
    assert learner.take(1) == ["after"]


class Counted:
    """A message that counts how often it is pickled."""

    pickled = 0

    def __reduce__(self):
        Counted.pickled += 1
        return (Counted, ())


def test_a_message_to_every_member_is_pickled_once(hub):
    ports = [hub.open(i) for i in range(3)]
    learners = [Learner(hub, i) for i in range(3)]
    for port in ports:
        until(lambda port=port: port.connected)
    message = Counted()
    for port in ports:
        port.remote(message)
    assert all(isinstance(got, Counted) for learner in learners for got in learner.take(1))
    assert Counted.pickled == 1


def test_messages_sent_in_a_batch_leave_together_when_it_ends(hub):
    ports = [hub.open(0), hub.open(1)]
    learners = [Learner(hub, 0), Learner(hub, 1)]
    for port in ports:
        until(lambda port=port: port.connected)
    with hub.batch():
        ports[0].remote("merged")
        ports[1].remote("merged")
        ports[0].remote("request")
        with hub.batch():  # nested: the outer batch sends it
            ports[1].remote("request")
        other = threading.Thread(target=ports[1].remote, args=("from another thread",))
        other.start()
        other.join()
        assert learners[1].take(1) == ["from another thread"]  # not held by this thread's batch
        time.sleep(0.1)
        assert learners[0].got.empty() and learners[1].got.empty()
    assert learners[0].take(2) == ["merged", "request"]
    assert learners[1].take(2) == ["merged", "request"]
    with hub.batch():  # more messages than one write takes buffers (a join sends every fragment)
        for i in range(1500):
            ports[0].remote(i)
    assert learners[0].take(1500) == list(range(1500))


def test_a_connection_without_the_key_is_refused_and_nothing_it_sends_is_handled(hub):
    hub.open(0)
    with pytest.raises(AuthenticationError):
        Client(hub.address, authkey=b"not the key")
    # A client that skips the challenge altogether: its bytes are never unpickled.
    with socket.create_connection(hub.address) as raw:
        raw.sendall(b"\x00\x00\x00\x10" + b"x" * 16)
    # One that answers right is served: nothing the others sent arrived before its message.
    good = Client(hub.address, authkey=hub.authkey)
    good.send(Hello(0))
    good.send("real")
    until(lambda: hub.handled)
    assert hub.handled == ["real"]
    good.close()


def test_a_new_incarnation_gets_a_fresh_queue_and_the_old_process_nothing_more(hub):
    hub.open(0)
    old = Learner(hub, 0)
    hub.port(0).remote("for the old process")
    assert old.take(1) == ["for the old process"]
    old.uplink.close()  # the old process dies ...
    old_port = hub.port(0)
    until(lambda: not old_port.connected)
    old_port.remote("for the dead process")
    hub.open(0).remote("queued for the new one")  # ... and the supervisor rejoined learner 0 as a new process
    assert old_port.pending() == 0
    new = Learner(hub, 0)
    assert new.take(1) == ["queued for the new one"]
    time.sleep(0.2)
    assert new.got.empty() and old.got.empty()


def test_a_learner_told_to_leave_still_sends_its_last_pushes(hub):
    hub.open(0)
    learner = Learner(hub, 0)
    hub.drop(0)  # the syncer hears of the leave before the learner's last pushes
    assert hub.port(0) is None
    learner.uplink.remote("last push")
    learner.uplink.barrier(timeout_s=10)
    assert hub.handled == ["last push"]


def test_a_connection_whose_hello_is_read_late_does_not_replace_a_newer_one(hub):
    """A learner hung up and connected again before the hub read the first connection's hello: that
    connection, attached last, is hung up, and the newer one keeps the port and its messages."""
    port = hub.open(0)
    (older_end, older), (newer_end, newer) = Pipe(), Pipe()
    peers = [Peer(newer, order=2), Peer(older, order=1)]
    try:
        for peer in peers:
            port.attach(peer)
        port.remote("for the newer one")
        assert newer_end.poll(10) and wire.loads(newer_end.recv_bytes()) == "for the newer one"
        assert older_end.poll(10)
        with pytest.raises(EOFError):  # hung up, with nothing sent on it
            older_end.recv_bytes()
    finally:
        port.close()
        for end in (*peers, older_end, newer_end):
            end.close()


def test_a_learner_that_connects_again_gets_what_was_queued_meanwhile(hub):
    port = hub.open(0)
    learner = Learner(hub, 0)
    until(lambda: port.connected)  # the hub read its hello: not connected later means it saw the hang-up
    learner.uplink.close()
    until(lambda: not port.connected)
    port.remote("sent while it was away")
    learner.uplink.connect(hub.address, hub.authkey, 0)
    assert learner.take(1) == ["sent while it was away"]
    learner.uplink.remote("up again")
    until(lambda: "up again" in hub.handled)


def test_a_syncer_that_goes_away_costs_a_learner_no_error(hub):
    learner = Learner(hub, 0)
    hub.close()
    until(lambda: not learner.uplink.connected)
    learner.uplink.remote("lost")  # lost, like a call to a dead actor
    learner.uplink.heartbeat(0, 1)
    with pytest.raises(ConnectionError):
        learner.uplink.barrier(timeout_s=5)


def test_a_non_member_is_heard_but_sent_nothing(hub):
    stranger = Learner(hub, 9)  # no port: it left, or was never registered
    stranger.uplink.remote("a late push")
    until(lambda: hub.handled == ["a late push"])
    assert hub.port(9) is None and stranger.got.empty()


def test_one_stalled_handshake_holds_up_no_other_connection(hub):
    hub.open(1)
    stalled = socket.create_connection(hub.address)  # connected, never answers the challenge
    try:
        learner = Learner(hub, 1)
        hub.port(1).remote("through")
        assert learner.take(1) == ["through"]
    finally:
        stalled.close()
