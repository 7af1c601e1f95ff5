"""What the round book holds per fragment and per learner: rounds open and closed, pushes merged, seqs seen.

The open round and its entries, the result of a closed round, the last merged push of each
anchor, and each learner's seqs seen. Plain state with the times passed in, and the one rule an
entry keeps itself (`Entry.superseded_by`); the rules that fill it (validation, netting against
what was merged) are the round book's (`dlc.algo.decoupled.rounds`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dlc.algo.decoupled.guards import quorum_needed
from dlc.algo.decoupled.messages import Push
from dlc.core.codec import Encoded


class MergedPush(NamedTuple):
    """A learner's last merged push of one fragment, still encoded."""

    base_version: int
    incarnation: int
    seq: int
    payload: Encoded


@dataclass
class Entry:
    """One part of a learner's contribution to a round: its pushes from one anchor, folded into one."""

    push: Push  # the latest push; its delta is cumulative from its anchor
    delta: np.ndarray
    arrived_at: float
    steps: int
    tokens: int
    seqs: tuple[int, ...]  # every push folded into this entry: the latest and those it superseded

    @property
    def anchor(self) -> tuple[int, int, int]:
        """Entries with equal anchors hold cumulative deltas from one starting point."""
        return (self.push.learner, self.push.base_version, self.push.incarnation)

    def superseded_by(self, new: Entry) -> Entry:
        """The newer cumulative delta replaces this one's; counters add (reset per send)."""
        return Entry(
            new.push,
            new.delta,
            self.arrived_at,
            self.steps + new.steps,
            self.tokens + new.tokens,
            self.seqs + new.seqs,
        )


class Round:
    """The current round of one fragment: each learner's parts, one per anchor.

    It collects pushes from the moment the previous round closed, but may only close once the
    syncer has opened it (asked the learners for the fragment): ``opened_at`` is then set, and
    ``answers`` records when each learner's first push after that arrived.
    """

    def __init__(self, fragment: int) -> None:
        self.fragment = fragment
        self.entries: dict[int, list[Entry]] = {}
        self.opened_at: float | None = None
        self.answers: dict[int, float] = {}

    @property
    def learners(self) -> frozenset[int]:
        """Learners with a push in this round."""
        return frozenset(self.entries)

    def quorum_at(self, needed: int) -> float | None:
        """When the ``needed``-th learner answered, or None if not yet."""
        if needed < 1:
            return None
        arrivals = sorted(self.answers.values())
        return arrivals[needed - 1] if len(arrivals) >= needed else None

    def deadline(self, healthy: Collection[int], quorum: int, window_s: float) -> float | None:
        """When the round may close without more pushes; None while not open or short of quorum.

        Every healthy learner having pushed closes it at once (deadline -inf).
        """
        if self.opened_at is None:
            return None
        reached = self.quorum_at(quorum_needed(quorum, healthy))
        if reached is None:
            return None
        if set(healthy) <= self.answers.keys():
            return -math.inf
        return reached + window_s


@dataclass(frozen=True)
class RoundResult:
    """A closed round: what to merge, and how it went."""

    fragment: int
    version: int  # v_p after this round; the merged fragment carries it
    learners: tuple[int, ...]
    seqs: tuple[int, ...]  # each contributor's newest push merged (it holds or follows the earlier ones)
    merged_seqs: tuple[tuple[int, ...], ...]  # each contributor's every push folded in, oldest first
    deltas: tuple[np.ndarray, ...]  # float32, the sum of its parts, each net of anything merged before
    tokens: tuple[int, ...]
    steps: tuple[int, ...]
    staleness: tuple[int, ...]  # version before the round - the oldest base_version of its parts
    opened_at: float
    quorum_at: float | None
    closed_at: float
    grace_window_s: float  # the window allowed when it closed
    waited_s: float  # grace actually used: close - quorum


class SeqLog:
    """Seqs seen from one learner: a contiguous floor plus the ones above it.

    The floor starts just below the first seq seen, so memory stays small on long
    runs; a seq below a learner's first one counts as seen (transports that keep
    per-sender order, like Ray actor calls, never deliver one).
    """

    def __init__(self, first: int, floor: int | None = None) -> None:
        self.floor = first - 1 if floor is None else floor
        self.above: set[int] = set()
        self.last = first

    def seen(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above

    def add(self, seq: int) -> None:
        self.above.add(seq)
        self.last = max(self.last, seq)
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
