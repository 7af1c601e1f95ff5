"""The protocol between learners and the syncer: pushes and rounds, and the blocking baselines' group."""

from __future__ import annotations

from dlc.run.events.base import BLOCKING, PROTOCOL, Event, declared


@declared(PROTOCOL, "push_sent")
class PushSent(Event):
    """A learner sent a fragment's outer gradient (also the pushes made at the end of the run): from its
    `base_version` (decoupled) or for the group's `version` (blocking), at its `step` or after `steps`."""

    learner: int
    fragment: int
    seq: int
    bytes: int
    base_version: int | None = None
    version: int | None = None
    step: int | None = None
    steps: int | None = None


@declared(PROTOCOL, "push_accepted")
class PushAccepted(Event):
    """The syncer took a push; `version` is the fragment's then: it is merged in the round that makes version + 1.
    `share`: the part of the model it carries (1 for a blocking baseline's whole model)."""

    learner: int
    fragment: int
    seq: int
    base_version: int
    version: int
    bytes: int
    steps: int
    part: bool | None = None
    superseded: bool | None = None
    share: float | None = None


@declared(PROTOCOL, "push_rejected")
class PushRejected(Event):
    """The syncer refused a push, with `reason` and `detail`."""

    learner: int
    fragment: int
    seq: int
    base_version: int
    version: int
    steps: int
    reason: str
    detail: str | None = None
    share: float | None = None


@declared(PROTOCOL, "round_closed")
class RoundClosed(Event):
    """A fragment's round merged: each contributor's newest `seqs`, and `merged`, every (learner, seq) folded in,
    superseded pushes included; `lr_factors`, the learning-rate factor of each of the fragment's pieces sent
    down with it (`syncer.lr_feedback`); `retired`, the learners that had finished their steps, counted in the
    merge as learners whose models no longer move; `replayed` marks a round a restarted syncer reported for its
    predecessor."""

    fragment: int
    version: int
    contributors: list[int]
    weights: list[float]
    tokens: list[int]
    seqs: list[int]
    staleness: list[int] | None = None
    grace_s: float | None = None
    waited_s: float | None = None
    merged: list[tuple[int, int]] | None = None
    lr_factors: list[float] | None = None
    retired: list[int] | None = None
    replayed: bool = False


@declared(PROTOCOL, "push_lost")
class PushLost(Event):
    """An acceptance the restored syncer does not hold (`reason`: `syncer_died`, `run_stopped` or `round_lost`):
    the push is accepted again."""

    learner: int
    fragment: int
    seq: int
    version: int
    bytes: int
    reason: str


@declared(PROTOCOL, "round_lost")
class RoundLost(Event):
    """A logged round the restored syncer does not hold."""

    fragment: int
    version: int
    reason: str


@declared(BLOCKING, "members_admitted")
class MembersAdmitted(Event):
    """Learners admitted to the group."""

    learners: list[int]
    version: int


@declared(BLOCKING, "learner_admitted")
class LearnerAdmitted(Event):
    """A learner admitted to the group."""

    learner: int
    version: int


@declared(BLOCKING, "member_lost")
class MemberLost(Event):
    """Members lost, and why."""

    learners: list[int]
    reason: str


@declared(BLOCKING, "reconfigure")
class Reconfigure(Event):
    """The group changed: why, the pause, its members."""

    why: str
    pause_s: float
    members: list[int]


@declared(BLOCKING, "reconfigure_folded")
class ReconfigureFolded(Event):
    """A change during a pause, folded into it."""

    why: str
