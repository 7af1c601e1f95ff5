"""A learner's place in the run, as the supervisor keeps it: its actor, snapshot and any recovery.

The recovery is the one under way when its process died; `dlc.engine.supervision.recovery` brings it back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recovery:
    """A learner being brought back: restarting -> (awaiting peer: one that trains has not answered
    lately) -> rejoining (copying state) -> registering (with the syncer) -> awaiting its first push."""

    phase: str
    actor: Any
    ref: Any
    died_at: float
    restarted_at: float | None = None
    peer: int | None = None
    spare: bool = False  # a hot spare took the slot over
    data_position: int = 0  # where the learner had got to in its own stream: the new process goes on from there
    attempts: int = 1  # processes started for this recovery (one died with its node: another is tried)
    step: int = 0  # the dead process's last reported step: where a start from the global model goes on


@dataclass
class LearnerSlot:
    handle: Any
    stream: Any  # ObjectRef of the learner's byte stream
    view: dict[str, Any] = field(default_factory=dict)
    override: str | None = None  # dead / restarting / rejoining / stalled / left, over the learner's own state
    last_seen: float = field(default_factory=time.monotonic)
    poll: Any = None
    recovery: Recovery | None = None
    awaiting_first_push: float | None = None  # wall time of the death, until a push is accepted
    death_fault: str = "kill"  # what ended its process last, as chaos calls it: kill, kill_node or preempt
    leave_at: float | None = None  # a joined learner retires at this monotonic time
    ticked_at: float = field(default_factory=time.monotonic)  # the ledger has filed time up to here
    # Of the learner's own counters of time its loop was blocked (waiting_s, checkpoint_s) and of
    # progress its adoptions discarded (discarded_steps), what the ledger has filed; a new process
    # counts from zero.
    blocked_filed: dict[str, float] = field(default_factory=dict)
    finished: bool = False
