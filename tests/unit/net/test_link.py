"""Link emulation under a fake clock: delay = latency + 8 B / bandwidth, FIFO, cuts and degradations."""

import numpy as np
import pytest

from dlc.algo.decoupled.messages import MergedFragment
from dlc.config.learners import LinkSpec
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.net.link import DelayLine, Link
from dlc.net.transport import Transport
from tests.fakes import FakeClock

MB = 1_000_000


def test_a_message_arrives_after_latency_plus_transmission():
    link = Link(LinkSpec(bandwidth_mbps=8.0, latency_ms=30.0))
    # 1 MB over 8 Mbit/s: 1 s on the wire, then 30 ms of latency.
    assert link.arrival(MB, now=10.0) == pytest.approx(11.030)


def test_messages_on_one_link_queue_behind_each_other():
    link = Link(LinkSpec(bandwidth_mbps=8.0, latency_ms=30.0))
    first = link.arrival(MB, now=0.0)
    second = link.arrival(MB, now=0.5)  # the wire is busy until 1.0: it starts then
    third = link.arrival(1000, now=5.0)  # the wire is idle again: no queueing
    assert (first, second, third) == pytest.approx((1.030, 2.030, 5.031))
    assert link.blocked_s == pytest.approx(0.5)


def test_jitter_never_reorders_messages():
    link = Link(LinkSpec(bandwidth_mbps=None, latency_ms=10.0, jitter_ms=50.0), seed=3)
    arrivals = [link.arrival(100, now=t * 0.001) for t in range(200)]
    assert arrivals == sorted(arrivals)
    assert min(a - t * 0.001 for t, a in enumerate(arrivals)) >= 0.010


def test_a_cut_holds_messages_until_it_ends_and_a_degradation_slows_them():
    link = Link(LinkSpec(bandwidth_mbps=8.0, latency_ms=0.0))
    link.cut(until=3.0)
    assert link.arrival(MB, now=1.0) == pytest.approx(4.0)  # waits for the cut, then 1 s on the wire
    link.degrade(10.0, until=20.0)
    assert link.arrival(MB, now=10.0) == pytest.approx(20.0)  # 10x the transmission time
    assert link.arrival(MB, now=30.0) == pytest.approx(31.0)  # over: back to normal


def test_delay_line_delivers_on_the_fake_clock_in_order():
    clock = FakeClock()
    line = DelayLine(clock, start_thread=False)
    fast = Link(LinkSpec(bandwidth_mbps=80.0))
    slow = Link(LinkSpec(bandwidth_mbps=8.0, latency_ms=100.0))
    got = []
    line.send(slow, MB, lambda: got.append("slow-1"))  # arrives at 1.1
    line.send(fast, MB, lambda: got.append("fast"))  # arrives at 0.1
    line.send(slow, 10, lambda: got.append("slow-2"))  # behind slow-1 on its link
    assert line.pump(0.05) == 0 and got == []
    clock.now = 0.1
    assert line.pump(clock.now) == 1 and got == ["fast"]
    assert line.pump(1.0999) == 0
    assert line.pump(1.2) == 2 and got == ["fast", "slow-1", "slow-2"]


def test_transport_sends_on_ideal_links_at_once_and_queues_emulated_ones():
    recipe = Recipe.model_validate(
        {"learners": {"count": 2, "overrides": [{"index": 1, "bandwidth_mbps": 1.0, "latency_ms": 50.0}]}}
    )
    transport = Transport(lambda i: recipe.learners.resolved(i).link)
    got = []

    class Method:
        def remote(self, message):
            got.append(message.fragment)

    payload = get_codec("none").encode(np.zeros(1000, np.float32))  # 4000 B: 32 ms at 1 Mbit/s
    assert transport.send(Method(), MergedFragment(0, 1, payload, 0.0), link=0) == 4000
    assert got == [0]  # learner 0's link is ideal
    transport.send(Method(), MergedFragment(1, 1, payload, 0.0), link=1)
    assert got == [0] and transport.queued() == 1
    assert transport.drain(timeout_s=5.0)
    assert got == [0, 1] and transport.bytes_sent == 8000


def test_recipe_link_fields_and_overrides():
    recipe = Recipe.model_validate(
        {
            "learners": {
                "count": 3,
                "bandwidth_mbps": 100.0,
                "latency_ms": 20.0,
                "overrides": [{"index": 2, "bandwidth_mbps": 5.0, "jitter_ms": 4.0}],
            }
        }
    )
    assert recipe.learners.resolved(0).link == LinkSpec(100.0, 20.0, 0.0)
    assert recipe.learners.resolved(2).link == LinkSpec(5.0, 20.0, 4.0)
    assert recipe.learners.resolved(9).link == LinkSpec(100.0, 20.0, 0.0)  # a joiner: the defaults
    assert not Recipe().learners.resolved(0).link.emulated
