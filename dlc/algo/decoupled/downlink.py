"""What the syncer sends down: each merged fragment once to every member, whole or as a difference.

With a downlink codec that sends differences (int8, int4) the syncer keeps what the learners hold
of each fragment (the global value as sent, compression error included) and the version each
learner was last sent. A learner one version behind gets the compressed difference; one that
holds no version the syncer knows (a new process, a copy of a peer, any learner after a syncer
restart) gets the held value whole, exactly. What compression loses stays in `theta - held` and
goes down with the next round of the fragment: error feedback.

Builds messages and keeps the books; the syncer delivers them and counts their bytes.
"""

from __future__ import annotations

import numpy as np

from dlc.algo.decoupled.messages import MergedFragment
from dlc.core.codec import get_codec

# Downlink codecs that send the difference from the version the learners hold.
DIFF_CODECS = frozenset({"int8", "int4"})


class Downlink:
    """The downlink codec, what the learners hold of each fragment, and which version each was sent."""

    def __init__(self, codec: str, block_values: int, theta: list[np.ndarray]) -> None:
        self.codec = get_codec(codec, block_values)
        self.by_difference = codec in DIFF_CODECS
        self.whole_codec = get_codec("none")  # a learner that holds no known version gets the value itself
        self.held: list[np.ndarray] = []
        self.synced: dict[tuple[int, int], int] = {}  # (learner, fragment) -> version it was last sent
        self.reset(theta)

    def reset(self, theta: list[np.ndarray]) -> None:
        """What the learners hold is unknown (a syncer restart): each gets the next value whole."""
        self.synced.clear()
        self.held = [t.copy() for t in theta] if self.by_difference else []

    def holds(self, learner: int, p: int, version: int) -> None:
        """`learner` holds fragment p at `version` (the initial parameters are version 0)."""
        self.synced[(learner, p)] = version

    def forget(self, learner: int) -> None:
        """`learner` left or restarted: it holds no version known here."""
        for key in [k for k in self.synced if k[0] == learner]:
            del self.synced[key]

    def whole(
        self, learner: int, p: int, version: int, theta_p: np.ndarray, now: float, factors: tuple[float, ...] = ()
    ) -> MergedFragment:
        """Fragment p at `version` whole, for a learner that holds no version of it known here;
        `factors`: the learning-rate factors that go with it (`lr_feedback`)."""
        value = self.held[p] if self.by_difference else theta_p
        self.synced[(learner, p)] = version
        return MergedFragment(p, version, self.whole_codec.encode(value), now, lr_factors=factors)

    def round(
        self,
        p: int,
        version: int,
        theta_p: np.ndarray,
        pairs: tuple[tuple[int, int], ...],
        members: set[int],
        now: float,
        factors: tuple[float, ...] = (),
    ) -> list[tuple[int, MergedFragment]]:
        """Fragment p merged into `version` for every member, in learner order: one message
        shared by all, or with differences, one shared by those a version behind; `factors` go with it."""
        if not self.by_difference:
            message = MergedFragment(p, version, self.codec.encode(theta_p), now, pairs, lr_factors=factors)
            return [(learner, message) for learner in sorted(members)]
        diff = self.codec.encode(theta_p - self.held[p])
        self.held[p] = self.held[p] + self.codec.decode(diff)
        by_diff = MergedFragment(p, version, diff, now, pairs, base_version=version - 1, lr_factors=factors)
        whole: MergedFragment | None = None
        out = []
        for learner in sorted(members):
            if self.synced.get((learner, p)) == version - 1:
                message = by_diff
            else:  # it holds no version we know: send the value itself, exactly
                whole = whole or MergedFragment(
                    p, version, self.whole_codec.encode(self.held[p]), now, pairs, lr_factors=factors
                )
                message = whole
            self.synced[(learner, p)] = version
            out.append((learner, message))
        return out
