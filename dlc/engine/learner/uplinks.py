"""A learner's uplink to the syncer: how its pushes, heartbeats and end-of-run barrier reach it.

`syncer.channel` picks one of two: `ray`, where every message is a call of the syncer actor's
methods, or `direct`, one socket to the syncer's channel (`dlc.net.channel`), beside Ray. Both
offer the same small surface to the learner actor (`connect`, `push`, `heartbeat`, `barrier`), so
its loop never asks which one it has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from multiprocessing import AuthenticationError  # the class multiprocessing.connection raises; typeshed has it here
from typing import Any

import ray

from dlc.config.schema import Recipe

# Seconds a live syncer's direct channel may refuse a learner before the run fails with the reason.
UNREACHABLE_S = 30.0


class RayCalls:
    """syncer.channel=ray: the learner's messages to the syncer are calls of its actor's methods."""

    connected = True
    failure: str | None = None

    def __init__(self, syncer: Any) -> None:
        self.syncer = syncer

    @property
    def push(self) -> Any:
        return self.syncer.push

    def connect(self, syncer: Any, index: int) -> bool:
        self.syncer = syncer
        return True

    def heartbeat(self, index: int, step: int) -> None:
        self.syncer.heartbeat.remote(index, step)

    def barrier(self, timeout_s: float) -> None:
        ray.get(self.syncer.barrier.remote(), timeout=timeout_s)


class Channel:
    """syncer.channel=direct: the learner's messages go on one socket to the syncer's channel
    (`dlc.net.channel`), connected when the loop starts and again whenever it breaks."""

    def __init__(self, receive: Callable[[Any], None]) -> None:
        from dlc.net.channel import Uplink

        self.uplink = Uplink(receive)
        self._unreachable: tuple[float, str] | None = None  # since when the syncer's channel refuses, and why
        self.failure: str | None = None  # why the run must fail: a live syncer refused it for too long

    @property
    def connected(self) -> bool:
        return self.uplink.connected

    @property
    def push(self) -> Any:
        return self.uplink

    def connect(self, syncer: Any, index: int) -> bool:
        """Connect to `syncer`'s channel, unless already connected to it; False if it cannot now.

        A syncer that is dead or restarting is waited for: the supervisor hands over the next one
        (`LearnerWorker.set_syncer`). A live syncer whose channel cannot be reached for
        `UNREACHABLE_S` (a firewall between nodes) sets `failure`, which fails the run.
        """
        try:
            channel = ray.get(syncer.channel.remote(), timeout=60)
        except ray.exceptions.RayError:
            return False
        address = tuple(channel["address"])
        if self.uplink.connected and self.uplink.peer == (address, channel["authkey"]):
            return True
        try:
            self.uplink.connect(address, channel["authkey"], index)
        except (OSError, EOFError, AuthenticationError) as exc:
            since = self._unreachable[0] if self._unreachable else time.monotonic()
            self._unreachable = (since, f"{type(exc).__name__}: {exc}")
            if time.monotonic() - since > UNREACHABLE_S:
                self.failure = (
                    f"learner {index} cannot reach the syncer at {address[0]}:{address[1]} for "
                    f"{UNREACHABLE_S:.0f} s ({self._unreachable[1]}): with syncer.channel=direct every learner "
                    "connects to the syncer's node on a port it picks; open the nodes to each other, or set "
                    "syncer.channel=ray to send the messages as Ray calls"
                )
            return False
        self._unreachable = None
        return True

    def heartbeat(self, index: int, step: int) -> None:
        self.uplink.heartbeat(index, step)

    def barrier(self, timeout_s: float) -> None:
        self.uplink.barrier(timeout_s=timeout_s)


def uplink_for(recipe: Recipe, syncer: Any, receive: Callable[[Any], None]) -> RayCalls | Channel:
    """The uplink `syncer.channel` asks for; `receive` takes the syncer's messages on a direct channel
    (with channel=ray they arrive as calls of the learner actor's `deliver`)."""
    return Channel(receive) if recipe.syncer.channel == "direct" else RayCalls(syncer)
