"""What the engine may ask of an algorithm: the learner's side, the syncer's side, its traffic.

The engine's loops (learner actor, syncer actor, driver, supervisor) only use these, and the
vocabulary both sides share (how a learner's pushes are numbered across its restarts, why a push
is refused: what a syncer's journal may record); each algorithm's package implements them. Kept
apart from the implementations so a reader sees the seam in one page.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from dlc.algo.counters import SyncCounters
from dlc.run import events

# A learner's seqs: incarnation k (its k-th restart, numbered by the engine) numbers its pushes from
# k * SEQ_STRIDE, so a (learner, seq) pair names one push for the whole run, across restarts of either side.
SEQ_STRIDE = 10**9


class Reject(StrEnum):
    """Why a push was not folded in."""

    DUPLICATE = "duplicate"  # (learner, seq) seen before, or contained in a newer push
    MALFORMED = "malformed"  # bad fragment index, length, codec, counters or version
    NONFINITE = "nonfinite"  # NaN or Inf after decoding
    STALE = "stale"  # current version - base_version > max_staleness
    NORM_OUTLIER = "norm_outlier"  # norm far from the fragment's recent accepted norms


class LearnerSync(Protocol):
    """A learner's side of synchronisation; `step` is one step of its loop (train, then send or
    receive what is due)."""

    pushes: int
    adopted: int
    discarded_steps: float  # whole-model inner steps of progress adoptions threw away (goodput: wasted)
    seq: int  # the next message's sequence number; the engine starts each incarnation apart
    incarnation: int  # which process of this learner index this is (0, then +1 per restart)
    idle: Callable[[], object] | None  # called now and then while blocked (what it returns is ignored)
    # When a message last told the syncer this learner lives (time.monotonic; -inf: its messages
    # never do): the engine's heartbeat thread stays quiet for an interval after it.
    beat_at: float

    @property
    def waiting_s(self) -> float: ...  # time the loop spent blocked on the network or on other learners
    def step(self, stop: threading.Event) -> list[events.Event]: ...
    def receive(self, message: Any) -> None: ...
    def compile(self) -> None: ...  # every jitted function the loop runs, before it runs
    def start_background(self) -> None: ...  # the actor's loop: send and receive off its thread
    def push_outstanding(self) -> list[events.Event]: ...  # end of run: the events of the pushes made
    def unpushed_steps(self) -> float: ...
    def adopt_lag_steps(self) -> float | None: ...  # mean steps from a push to adopting its merge; None: none yet
    def reconnect(self, push: Any) -> int: ...
    def state(self) -> tuple[dict[str, Any], dict[str, Any]]: ...
    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None: ...
    def resume_from_global(self, fragments: list[np.ndarray], versions: list[int]) -> None: ...  # after a resume
    def adopt_peer(self, fragments: list[np.ndarray], versions: list[int]) -> None: ...
    def adopt_global(self, fragments: list[np.ndarray], versions: list[int]) -> None: ...
    def peer_view(self) -> tuple[list[np.ndarray], list[int]]: ...


class Syncer(Protocol):
    """The syncer's side: takes learners' messages, merges them, sends the global state back.

    Not thread-safe: the syncer actor calls it under one lock. `deliver(learner, message)` and the
    clock are given at construction; `journal`, when set, receives a record per state change that
    `replay` can re-apply after a restart from the last checkpoint.
    """

    counters: SyncCounters  # rounds closed, bytes each way: what its status reports
    journal: Callable[[dict[str, Any]], None] | None

    def join(self, learner: int, holds_initial: bool = True) -> None: ...  # False: its state is unknown
    def rejoin(self, learner: int) -> None: ...  # a new incarnation of `learner`
    def leave(self, learner: int) -> None: ...
    def retire(self, learner: int) -> None: ...  # it trained all its steps; the syncer holds its every push
    def heartbeat(self, learner: int, step: int | None = None) -> None: ...  # step: where it is
    def excuse(self, seconds: float) -> None: ...  # it did not run for `seconds`: silence then is nobody's
    def push(self, message: Any) -> None: ...
    def tick(self) -> int: ...  # close what may close now; returns how many closed
    def next_tick_in(self) -> float: ...  # seconds until a tick may have work that no message brings
    def flush(self) -> int: ...  # end of run: close everything holding a message
    def journal_snapshot(self) -> dict[str, Any]: ...  # what a checkpoint lacks: the next journal's first record
    def replay(self, record: dict[str, Any]) -> bool: ...
    def versions(self) -> list[int]: ...
    def next_seqs(self) -> dict[int, int]: ...  # per learner, the lowest seq above every one seen
    def global_fragments(self) -> list[np.ndarray]: ...  # copies
    def global_params(self, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
    def fingerprint(self) -> str: ...
    def status(self) -> dict[str, Any]: ...
    def drain_events(self) -> list[events.Event]: ...
    def state(self) -> tuple[dict[str, Any], dict[str, Any]]: ...
    def load(self, tree: dict[str, Any], meta: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Traffic:
    """What an algorithm sends, decided once from the recipe: the engine and `dlc bandwidth` both ask."""

    fragments: int  # messages the model is cut into
    interval_steps: int  # inner steps between two sends of the same fragment
    up_codec: str  # learner -> syncer
    down_codec: str  # syncer -> learner
    sends: bool = True  # False: the learners never send anything
