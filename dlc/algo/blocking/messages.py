"""What learners and the barrier syncer of the blocking baselines (dp, diloco) send each other."""

from __future__ import annotations

from dataclasses import dataclass

from dlc.core.codec import Encoded


@dataclass(frozen=True)
class Contribution:
    """Learner -> syncer: a gradient (dp) or outer gradient (diloco) computed at global `version`."""

    learner: int
    version: int
    seq: int
    steps: int
    tokens: int
    payload: Encoded
    sent_at: float


@dataclass(frozen=True)
class GlobalModel:
    """Syncer -> learner: the whole global model at `version`."""

    version: int
    payload: Encoded
    sent_at: float
