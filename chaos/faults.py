"""What can go wrong: the fault kinds, each named with the mechanism that causes it, and one fault."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class FaultKind(Enum):
    """A kind of fault. Each member's docstring names the mechanism that injects it."""

    KILL = (
        "kill",
        "SIGKILL the learner's process, sent on its node by the run's agent there; the engine restarts it and "
        "copies state from a peer.",
    )
    STALL = (
        "stall",
        "SIGSTOP the learner's process, then SIGCONT after duration_s from a detached timer on its node.",
    )
    SLOW = "slow", "Multiply the learner's step time by factor for duration_s (a control request to the driver)."
    JOIN = "join", "A temporary learner with its own data stream joins for duration_s (a control request)."
    LEAVE = "leave", "The learner retires for good and stops pushing (a control request to the driver)."
    KILL_SYNCER = "kill_syncer", "SIGKILL the syncer's process (on the driver's node); it restarts from its checkpoint."
    DEGRADE_LINK = (
        "degrade_link",
        "Divide the learner's link bandwidth by factor and multiply its latency by factor for duration_s "
        "(a control request to the driver).",
    )
    CUT_LINK = (
        "cut_link",
        "Cut the learner's link for duration_s: messages queue and go out when it returns "
        "(a control request to the driver).",
    )
    KILL_NODE = (
        "kill_node",
        "SIGKILL every learner process on the named learner's node at once (a lost node); the engine restarts "
        "them and they copy state from healthy peers.",
    )
    PREEMPT = (
        "preempt",
        "SIGTERM the learner's process (a preemption notice, sent on its node by the run's agent there), then "
        "SIGKILL after notice_s from a detached timer if it has not left: the learner pushes the progress it has "
        "not pushed, checkpoints and leaves, and a new process (or a hot spare) takes its slot.",
    )

    def __new__(cls, value: str, mechanism: str) -> FaultKind:
        member = object.__new__(cls)
        member._value_ = value
        member.__doc__ = mechanism
        return member

    @property
    def needs_learner(self) -> bool:
        """Whether the fault acts on one existing learner (join makes a new one; the syncer is not one)."""
        return self in (
            FaultKind.KILL,
            FaultKind.STALL,
            FaultKind.SLOW,
            FaultKind.LEAVE,
            FaultKind.DEGRADE_LINK,
            FaultKind.CUT_LINK,
            FaultKind.KILL_NODE,
            FaultKind.PREEMPT,
        )

    @property
    def rate_per_learner(self) -> bool:
        """Whether its Poisson rate is per learner (kill_node's is per run: it names a node by a learner on it)."""
        return self.needs_learner and self is not FaultKind.KILL_NODE

    @property
    def has_duration(self) -> bool:
        """Whether the fault lasts a while and then undoes itself."""
        return self in (FaultKind.STALL, FaultKind.SLOW, FaultKind.JOIN, FaultKind.DEGRADE_LINK, FaultKind.CUT_LINK)

    @property
    def takes_learner_out(self) -> bool:
        """Whether the fault removes a healthy learner (the quorum guardrail watches these).

        A degraded or cut link does not: the learner keeps training and its pushes arrive late.
        """
        return self in (FaultKind.KILL, FaultKind.STALL, FaultKind.LEAVE, FaultKind.KILL_NODE, FaultKind.PREEMPT)

    @property
    def is_kill(self) -> bool:
        """Whether it ends learner processes, which are in flight until they train again in new ones."""
        return self in (FaultKind.KILL, FaultKind.KILL_NODE, FaultKind.PREEMPT)


@dataclass(frozen=True)
class Fault:
    """One fault to inject ``at_s`` seconds after the chaos clock started.

    ``duration_s`` is None for faults without one, and for a slow-down or a join that lasts until the
    run ends. ``factor`` is a slow-down's or a link degradation's, None for the other kinds. ``notice_s`` is a
    preemption's notice (SIGTERM to SIGKILL), None for the other kinds. ``origin``
    says where it came from: "timeline" (the plan named it) or "poisson" (drawn).
    """

    at_s: float
    kind: FaultKind
    learner: int | None = None
    duration_s: float | None = None
    factor: float | None = None
    origin: str = "timeline"
    notice_s: float | None = None

    @property
    def target_name(self) -> str:
        if self.kind is FaultKind.KILL_SYNCER:
            return "syncer"
        if self.kind is FaultKind.JOIN:
            return "new learner"
        if self.kind is FaultKind.KILL_NODE:
            return f"node of learner {self.learner}"
        return f"learner {self.learner}"

    def describe(self) -> str:
        """The mechanism with this fault's numbers, for logs: 'SIGSTOP, SIGCONT after 8 s'."""
        lasting = "until the run ends" if self.duration_s is None else f"for {self.duration_s:g} s"
        match self.kind:
            case FaultKind.KILL:
                return "SIGKILL"
            case FaultKind.STALL:
                return f"SIGSTOP, SIGCONT after {self.duration_s:g} s"
            case FaultKind.SLOW:
                return f"step time x{self.factor:g} {lasting}"
            case FaultKind.JOIN:
                return f"a temporary learner joins {lasting}"
            case FaultKind.LEAVE:
                return "retires for good"
            case FaultKind.KILL_NODE:
                return "SIGKILL every learner on its node"
            case FaultKind.KILL_SYNCER:
                return "SIGKILL the syncer"
            case FaultKind.DEGRADE_LINK:
                return f"link bandwidth /{self.factor:g}, latency x{self.factor:g} {lasting}"
            case FaultKind.CUT_LINK:
                return f"link cut {lasting}, messages held until it returns"
            case FaultKind.PREEMPT:
                return f"SIGTERM, SIGKILL after {self.notice_s:g} s unless it has left"
