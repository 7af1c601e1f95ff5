"""Faults and the run's recovery from each, and the chaos that injects them."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

from dlc.run.events.base import CHAOS, FAULTS, Event, declared

C = TypeVar("C", bound="Chaos")


@declared(FAULTS, "learner_died")
class LearnerDied(Event):
    """A learner's process died (step and data position as last reported)."""

    learner: int
    step: int | None
    data_position: int
    pid: int | None


@declared(FAULTS, "learner_restarted")
class LearnerRestarted(Event):
    """A new process (or a hot spare, `spare`) took the slot."""

    learner: int
    after_s: float
    pid: int
    spare: bool = False


@declared(FAULTS, "learner_rejoined")
class LearnerRejoined(Event):
    """It copied a healthy peer's state and rejoined, in `copy_s`; no `peer` (and no `copy_s`): none was healthy,
    it took the syncer's global model."""

    learner: int
    peer: int | None
    step: int
    data_position: int
    copy_s: float | None = None


@declared(FAULTS, "learner_recovered")
class LearnerRecovered(Event):
    """Its first accepted push after a fault; `fault`: what ended its process (`kill`, `kill_node` or `preempt`;
    null in a run of a dlc before it was recorded)."""

    learner: int
    after_s: float
    fault: str | None = None


@declared(FAULTS, "learner_preempted")
class LearnerPreempted(Event):
    """It left on a notice (`reason` SIGTERM or node draining), with the `fragments` it pushed, `leave_s` from the
    notice."""

    learner: int
    reason: str | None
    fragments: int | None
    leave_s: float | None
    unpushed_steps: float
    step: int | None
    data_position: int
    pid: int | None


@declared(FAULTS, "node_draining")
class NodeDraining(Event):
    """A node is being drained, and its learners."""

    node: str
    node_id: str
    learners: list[int]
    deadline_in_s: float | None


@declared(FAULTS, "learner_stalled")
class LearnerStalled(Event):
    """A learner stopped answering (its heartbeats stopped)."""

    learner: int
    silent_s: float


@declared(FAULTS, "learner_thawed")
class LearnerThawed(Event):
    """A stalled learner answers again."""

    learner: int
    silent_s: float


@declared(FAULTS, "learner_slowed")
class LearnerSlowed(Event):
    """Chaos slowed a learner's steps by `factor` (no `duration_s`: until the run ends)."""

    learner: int
    factor: float
    duration_s: float | None


@declared(FAULTS, "link_degraded")
class LinkDegraded(Event):
    """Chaos degraded a learner's link."""

    learner: int
    factor: float
    duration_s: float


@declared(FAULTS, "link_cut")
class LinkCut(Event):
    """Chaos cut a learner's link."""

    learner: int
    duration_s: float


@declared(FAULTS, "learner_joining")
class LearnerJoining(Event):
    """A temporary learner joins (no `duration_s`: until the run ends)."""

    learner: int
    duration_s: float | None


@declared(FAULTS, "learner_left")
class LearnerLeft(Event):
    """A learner retired for good."""

    learner: int


@declared(FAULTS, "learner_lost")
class LearnerLost(Event):
    """Dead, and no live node can hold it: not restarted."""

    learner: int
    reason: str


@declared(FAULTS, "restart_retried")
class RestartRetried(Event):
    """A new process died with its node before it was ready."""

    learner: int
    error: str


@declared(FAULTS, "state_copy_retried")
class StateCopyRetried(Event):
    """The peer being copied died: it copies again."""

    learner: int
    peer: int | None
    error: str


@declared(FAULTS, "node_killed")
class NodeKilled(Event):
    """Every learner on a node killed at once."""

    node: str | None
    node_id: str
    learners: list[int]
    pids: list[int]


@declared(FAULTS, "syncer_died")
class SyncerDied(Event):
    """The syncer's process died."""


@declared(FAULTS, "syncer_restarted")
class SyncerRestarted(Event):
    """The syncer is back from its checkpoint and journal; the learners re-sent what it lost. Its fragments'
    `versions` and the rounds it restored are missing when it restored nothing."""

    after_s: float
    resent_pushes: int
    versions: list[int] | None = None
    checkpoint_rounds: int | None = None
    journal_rounds: int | None = None
    rounds_closed: int | None = None


@declared(CHAOS, "chaos")
class Chaos(Event):
    """A copy of each chaos.jsonl line: a fault injected, refused or planned (`dry_run`), or what the run did
    after it (`phase`)."""

    catalog_fields: ClassVar[str] = (
        "`fault` string, `target` string, `learner` integer or null, `phase` string, `detail` string, `duration_s` "
        "number, and any other field of its chaos.jsonl line"
    )
    fault: str  # in chaos.jsonl's order
    target: str | None = None
    learner: int | None = None
    phase: str
    detail: str | None = None
    duration_s: float | None = None
    more: dict[str, Any] = dataclasses.field(default_factory=dict)  # the line's other fields

    @classmethod
    def of(cls: type[C], line: dict[str, Any]) -> C:
        """The copy of a chaos.jsonl line; its `t` is left out (the copy is stamped when it is written)."""
        return cls.from_record({k: v for k, v in line.items() if k != "t"})

    @classmethod
    def from_record(cls: type[C], record: dict[str, Any]) -> C:
        named = {f.name for f in dataclasses.fields(cls)} - {"more"}
        more = {k: v for k, v in record.items() if k not in named and k != "kind"}
        return super().from_record({**{k: v for k, v in record.items() if k in named}, "more": more})

    def fields(self) -> dict[str, Any]:
        """The line as chaos.jsonl has it: its own fields, where it has them, and the rest."""
        own = {k: v for k, v in super().fields().items() if k != "more" and v is not None}
        return {**own, **self.more}


@declared(CHAOS, "chaos_started")
class ChaosStarted(Event):
    """A chaos plan started in the run (`dlc train --chaos`)."""

    plan: str


@declared(CHAOS, "chaos_finished")
class ChaosFinished(Event):
    """The chaos plan ended: the faults it fired and refused, by kind, and why it stopped."""

    fired: dict[str, int]
    refused: dict[str, int]
    stopped_because: str | None


@declared(CHAOS, "control_ignored")
class ControlIgnored(Event):
    """A request the driver could not carry out, and why."""

    request: dict[str, Any]
    reason: str
