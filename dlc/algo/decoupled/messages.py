"""What learners and the syncer of Decoupled DiLoCo send each other."""

from __future__ import annotations

from dataclasses import dataclass

from dlc.core.codec import Encoded


@dataclass(frozen=True)
class FragmentRequest:
    """Syncer -> learner: fragment p's round is open; push p at your next step boundary.

    Carries no payload: the transport counts it as 0 bytes, like every header.
    """

    fragment: int
    version: int  # v_p when the round opened
    sent_at: float
    payload: None = None


# A learner's seqs: incarnation k (its k-th restart) numbers its pushes from k * SEQ_STRIDE, so a
# (learner, seq) pair names one push for the whole run, also across restarts of either side.
SEQ_STRIDE = 10**9


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
    # The sending process's incarnation of `learner` (0 for its first process, +1 per restart): a
    # new process starts from a peer's state, so its deltas never contain an earlier one's pushes.
    incarnation: int = 0
    # The learner's inner step as it sent this, when the push doubles as its heartbeat: sent at
    # once over an ideal link, and not a re-send (None otherwise: it says nothing of now).
    step: int | None = None


@dataclass(frozen=True)
class MergedFragment:
    """Syncer -> learner: the new global value of fragment p at version v.

    With `base_version` None the payload is the value itself; otherwise it is the difference from
    the value at `base_version`, which the learner must hold (a compressed downlink).
    """

    fragment: int
    version: int
    payload: Encoded
    sent_at: float
    merged: tuple[tuple[int, int], ...] = ()  # (learner, seq) of the pushes merged: their acknowledgement
    base_version: int | None = None
