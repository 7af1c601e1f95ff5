"""What learners and the syncer of Decoupled DiLoCo send each other."""

from __future__ import annotations

from dataclasses import dataclass

from dlc.core.codec import Encoded


@dataclass(frozen=True)
class Push:
    """One outer gradient of one fragment from one learner."""

    learner: int
    fragment: int
    base_version: int
    steps: int
    tokens: int
    seq: int
    payload: Encoded
    sent_at: float


@dataclass(frozen=True)
class MergedFragment:
    """Syncer -> learner: the new global value of fragment p at version v."""

    fragment: int
    version: int
    payload: Encoded
    sent_at: float
    merged: tuple[tuple[int, int], ...] = ()  # (learner, seq) of the pushes merged: their acknowledgement
