"""A learner's record of the merged fragments it received: what a difference sent down starts from.

The syncer sends a fragment as a difference from the version it last sent this learner
(`dlc.algo.decoupled.downlink`). Messages may overtake one another on the way, so a difference
whose base has not arrived waits here until it has; a whole value starts the chain anew. Only
version 0, the initial parameters, is known without receiving it: after a copy from a peer no
version is, and differences wait for the next whole value.

Not thread-safe: the learner calls it under its lock (deliveries come from a receiving thread).
"""

from __future__ import annotations

import numpy as np

from dlc.algo.decoupled.messages import MergedFragment
from dlc.core.codec import get_codec


class ReceivedFragments:
    """Per fragment, the newest global value received (version, host value) or None when none is known,
    and the differences parked until their base arrives."""

    def __init__(self, anchors: list[np.ndarray], versions: list[int]) -> None:
        self.held: list[tuple[int, np.ndarray] | None] = []
        self.parked: dict[int, dict[int, MergedFragment]] = {}  # fragment -> base version -> message
        self.start_from(anchors, versions)

    def start_from(self, anchors: list[np.ndarray], versions: list[int]) -> None:
        """Forget what was received: only version 0, the initial parameters, is sure to be what a
        downlink by difference starts from; other versions arrive whole first."""
        self.held = [(0, a) if v == 0 else None for a, v in zip(anchors, versions, strict=True)]
        self.parked.clear()

    def forget(self) -> None:
        """No version of any fragment is known (the learner copied a peer's parameters)."""
        self.held = [None] * len(self.held)
        self.parked.clear()

    def resolve(self, msg: MergedFragment) -> list[tuple[int, np.ndarray]]:
        """The global values (version, value) this message makes known, in version order: none
        when it is a difference whose base has not arrived yet (it waits for it), and more than
        one when it was the base differences parked here were waiting for."""
        p = msg.fragment
        out = []
        following: MergedFragment | None = msg
        while following is not None:
            msg = following
            codec = get_codec(msg.payload.codec, msg.payload.block_size or 64)
            held = self.held[p]
            if msg.base_version is None:
                # An older value overtaken by a newer one: keep the newer. The same version sent
                # whole again (by a restarted syncer) replaces what is held: it is what that syncer's
                # next differences start from.
                if held is not None and msg.version < held[0]:
                    break
                value = codec.decode(msg.payload)
            else:
                if held is None or held[0] != msg.base_version:
                    if held is None or msg.base_version > held[0]:  # its base is still on the way
                        self.parked.setdefault(p, {})[msg.base_version] = msg
                    break
                value = held[1] + codec.decode(msg.payload)
            self.held[p] = (msg.version, value)
            out.append((msg.version, value))
            parked = self.parked.get(p, {})
            for base in [b for b in parked if b < msg.version]:  # bases this value superseded
                del parked[base]
            following = parked.pop(msg.version, None)
        return out
