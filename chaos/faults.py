"""What can go wrong: each fault kind described once, and one fault.

A kind's `Spec` is the one place that says what it does and how it is set: its mechanism, what it
targets, whether it takes a healthy learner out or ends processes, the plan keys it reads (its Poisson
rate, duration, factor, notice) with their defaults and meanings, the `dlc chaos` option of each, and
the `Target` call that carries it out. The plan's fields and aliases (`chaos.plan`), `dlc chaos`'s
options, the plan reference and the controller's dispatch are all read from the specs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

Target = Literal["learner", "node", "syncer", "new"]


@dataclass(frozen=True)
class Setting:
    """One plan key of a kind: its default, its meaning in the plan reference, and its other spellings."""

    key: str
    default: float
    description: str
    alias: str  # a name people reach for, answered with a did-you-mean
    option: str | None = None  # the `dlc chaos` option that overrides it
    help: str | None = None  # that option's help; a non-rate's gets "(default: the plan's, else N)" added
    meaning: str = ""  # what a timeline entry's value means for this kind ("step-time multiplier")


@dataclass(frozen=True)
class Spec:
    """One fault kind, described once."""

    name: str
    mechanism: str
    # learner: one existing learner; node: every learner on a learner's node (its rate is run-wide);
    # syncer: the syncer; new: a learner that joins.
    target: Target
    rate: Setting
    # Its words in logs, from the fault's numbers: {duration}, {factor}, {notice}, {lasting}.
    describe: str
    # The Target method that carries it out, then the Fault fields it is called with, in order.
    carried_by: tuple[str, ...]
    factor: Setting | None = None
    duration: Setting | None = None
    notice: Setting | None = None
    takes_out: bool = False  # removes a healthy learner (the quorum guardrail watches these)
    kills: bool = False  # ends learner processes, in flight until they train again in new ones
    until_end: str | None = None  # why a timeline entry of a lasting kind may not last until the run ends
    summary: str = ""  # the plan summary's words after the rate, from the plan's settings

    @property
    def required(self) -> tuple[str, ...]:
        """The Fault fields it is carried out with that must be given: the plan fills in every default,
        and only a lasting kind that may run to the end goes without a duration."""
        optional = {"duration_s"} if self.until_end is None else set()
        return tuple(field for field in self.carried_by[1:] if field not in optional)


def _rate(
    name: str, what: str, per_learner: bool = True, option: str | None = None, help: str | None = None
) -> Setting:
    per = "per_learner_per_min" if per_learner else "per_min"
    return Setting(f"{name}_{per}", 0.0, what, alias=f"{name}_rate", option=option, help=help)


class FaultKind(Enum):
    """A kind of fault. Each member's docstring names the mechanism that injects it."""

    _value_: str
    spec: Spec

    KILL = Spec(
        "kill",
        "SIGKILL the learner's process, sent on its node by the run's agent there; the engine restarts it and "
        "copies state from a peer.",
        target="learner",
        rate=_rate(
            "kill",
            "Poisson rate of kills, per learner per minute.",
            option="--kill-rate",
            help="SIGKILLs per learner per minute (Poisson).",
        ),
        describe="SIGKILL",
        carried_by=("kill", "learner"),
        takes_out=True,
        kills=True,
    )
    STALL = Spec(
        "stall",
        "SIGSTOP the learner's process, then SIGCONT after duration_s from a detached timer on its node.",
        target="learner",
        rate=_rate(
            "stall",
            "Poisson rate of stalls, per learner per minute.",
            option="--stall-rate",
            help="Stalls (SIGSTOP) per learner per minute (Poisson).",
        ),
        duration=Setting(
            "stall_for_s",
            10.0,
            "How long a stall freezes its learner.",
            alias="stall_for",
            option="--stall-for",
            help="Seconds a stall lasts",
        ),
        describe="SIGSTOP, SIGCONT after {duration:g} s",
        carried_by=("stall", "learner", "duration_s"),
        takes_out=True,
        until_end="a stall cannot last until_end (the learner would stay frozen): give duration_s",
        summary=" for {duration:g} s",
    )
    SLOW = Spec(
        "slow",
        "Multiply the learner's step time by factor for duration_s (a control request to the driver).",
        target="learner",
        rate=_rate(
            "slow",
            "Poisson rate of slow-downs, per learner per minute.",
            option="--slow-rate",
            help="Slow-downs per learner per minute (Poisson).",
        ),
        factor=Setting(
            "slow_factor",
            3.0,
            "A slow-down multiplies its learner's step time by this.",
            alias="slow_factor",
            option="--slow-factor",
            help="Step-time multiplier of a slow-down",
            meaning="step-time multiplier",
        ),
        duration=Setting(
            "slow_for_s",
            30.0,
            "How long a slow-down lasts.",
            alias="slow_for",
            option="--slow-for",
            help="Seconds a slow-down lasts",
        ),
        describe="step time x{factor:g} {lasting}",
        carried_by=("slow", "learner", "factor", "duration_s"),
        summary=" x{factor:g} for {duration:g} s",
    )
    JOIN = Spec(
        "join",
        "A temporary learner with its own data stream joins for duration_s (a control request).",
        target="new",
        rate=_rate("join", "Poisson rate of temporary learners joining, per minute.", per_learner=False),
        duration=Setting("join_for_s", 60.0, "How long a joined learner stays before it retires.", alias="join_for"),
        describe="a temporary learner joins {lasting}",
        carried_by=("join", "duration_s"),
        summary=" for {duration:g} s",
    )
    LEAVE = Spec(
        "leave",
        "The learner retires for good and stops pushing (a control request to the driver).",
        target="learner",
        rate=_rate("leave", "Poisson rate at which a learner retires for good, per learner per minute."),
        describe="retires for good",
        carried_by=("leave", "learner"),
        takes_out=True,
    )
    KILL_SYNCER = Spec(
        "kill_syncer",
        "SIGKILL the syncer's process (on the driver's node); it restarts from its checkpoint.",
        target="syncer",
        rate=_rate("kill_syncer", "Poisson rate of syncer kills, per minute.", per_learner=False),
        describe="SIGKILL the syncer",
        carried_by=("kill_syncer",),
    )
    DEGRADE_LINK = Spec(
        "degrade_link",
        "Divide the learner's link bandwidth by factor and multiply its latency by factor for duration_s "
        "(a control request to the driver).",
        target="learner",
        rate=_rate(
            "degrade_link",
            "Poisson rate of link degradations, per learner per minute.",
            option="--degrade-link-rate",
            help="Link degradations per learner per minute (Poisson).",
        ),
        factor=Setting(
            "degrade_link_factor",
            10.0,
            "A link degradation divides its learner's link bandwidth by this and multiplies its latency by this.",
            alias="link_factor",
            option="--link-factor",
            help="A degraded link's bandwidth is divided, its latency multiplied, by this",
            meaning="bandwidth divisor and latency multiplier",
        ),
        duration=Setting("degrade_link_for_s", 30.0, "How long a link degradation lasts.", alias="degrade_link_for"),
        describe="link bandwidth /{factor:g}, latency x{factor:g} {lasting}",
        carried_by=("degrade_link", "learner", "factor", "duration_s"),
        until_end="a degrade_link cannot last until_end: give duration_s, or set learners.bandwidth_mbps and "
        "learners.latency_ms in the recipe for a thin link all run long",
        summary=" x{factor:g} for {duration:g} s",
    )
    CUT_LINK = Spec(
        "cut_link",
        "Cut the learner's link for duration_s: messages queue and go out when it returns "
        "(a control request to the driver).",
        target="learner",
        rate=_rate(
            "cut_link",
            "Poisson rate of link cuts, per learner per minute.",
            option="--cut-link-rate",
            help="Link cuts per learner per minute (Poisson).",
        ),
        duration=Setting(
            "cut_link_for_s",
            10.0,
            "How long a link cut lasts; messages queue meanwhile and go out when it ends.",
            alias="cut_link_for",
        ),
        describe="link cut {lasting}, messages held until it returns",
        carried_by=("cut_link", "learner", "duration_s"),
        until_end="a cut_link cannot last until_end (its messages would never arrive): give duration_s",
        summary=" for {duration:g} s",
    )
    KILL_NODE = Spec(
        "kill_node",
        "SIGKILL every learner process on the named learner's node at once (a lost node); the engine restarts "
        "them and they copy state from healthy peers.",
        target="node",
        rate=_rate(
            "kill_node",
            "Poisson rate of lost nodes (every learner on one node killed at once), per minute "
            "for the whole run; each names the node of a learner drawn at random.",
            per_learner=False,
            option="--kill-node-rate",
            help="Lost nodes per minute, run-wide (Poisson): every learner on one node killed at once.",
        ),
        describe="SIGKILL every learner on its node",
        carried_by=("kill_node", "learner"),
        takes_out=True,
        kills=True,
    )
    PREEMPT = Spec(
        "preempt",
        "SIGTERM the learner's process (a preemption notice, sent on its node by the run's agent there), then "
        "SIGKILL after notice_s from a detached timer if it has not left: the learner pushes the progress it has "
        "not pushed, checkpoints and leaves, and a new process (or a hot spare) takes its slot.",
        target="learner",
        rate=_rate(
            "preempt",
            "Poisson rate of preemptions (SIGTERM, then SIGKILL after the notice), per learner per minute.",
            option="--preempt-rate",
            help="Preemptions per learner per minute (Poisson): SIGTERM, then SIGKILL after the notice.",
        ),
        notice=Setting(
            "preempt_notice_s",
            30.0,
            "A preemption's notice: seconds from its SIGTERM to the SIGKILL that ends a learner that has "
            "not left by then (spot VMs get 30-120 s, Kubernetes' default grace period is 30 s).",
            alias="notice",
            option="--notice-s",
            help="Seconds from a preemption's SIGTERM to its SIGKILL",
            meaning="seconds from its SIGTERM to the SIGKILL that ends the learner if it has not left",
        ),
        describe="SIGTERM, SIGKILL after {notice:g} s unless it has left",
        carried_by=("preempt", "learner", "notice_s"),
        takes_out=True,
        kills=True,
        summary=" with {notice:g} s notice",
    )

    def __new__(cls, spec: Spec) -> FaultKind:
        member = object.__new__(cls)
        member._value_ = spec.name
        member.spec = spec
        member.__doc__ = spec.mechanism
        return member

    @property
    def needs_learner(self) -> bool:
        """Whether the fault acts on one existing learner (join makes a new one; the syncer is not one)."""
        return self.spec.target in ("learner", "node")

    @property
    def rate_per_learner(self) -> bool:
        """Whether its Poisson rate is per learner (kill_node's is per run: it names a node by a learner on it)."""
        return self.spec.target == "learner"

    @property
    def has_duration(self) -> bool:
        """Whether the fault lasts a while and then undoes itself."""
        return self.spec.duration is not None

    @property
    def takes_learner_out(self) -> bool:
        """Whether the fault removes a healthy learner (the quorum guardrail watches these).

        A degraded or cut link does not: the learner keeps training and its pushes arrive late.
        """
        return self.spec.takes_out

    @property
    def is_kill(self) -> bool:
        """Whether it ends learner processes, which are in flight until they train again in new ones."""
        return self.spec.kills

    def settings(self) -> list[tuple[str, Setting]]:
        """The plan keys this kind reads, in the plan's order: (rate | factor | duration | notice, its setting)."""
        slots = (("rate", self.spec.rate), ("factor", self.spec.factor), ("duration", self.spec.duration))
        return [(slot, s) for slot, s in (*slots, ("notice", self.spec.notice)) if s is not None]


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
        return {
            "syncer": "syncer",
            "new": "new learner",
            "node": f"node of learner {self.learner}",
            "learner": f"learner {self.learner}",
        }[self.kind.spec.target]

    def describe(self) -> str:
        """The mechanism with this fault's numbers, for logs: 'SIGSTOP, SIGCONT after 8 s'."""
        lasting = "until the run ends" if self.duration_s is None else f"for {self.duration_s:g} s"
        numbers: dict[str, Any] = {"duration": self.duration_s, "factor": self.factor, "notice": self.notice_s}
        return self.kind.spec.describe.format(lasting=lasting, **numbers)

    def inject(self, target: Any) -> None:
        """Carry it out on `target` (a `chaos.target.Target`): the kind's method, with this fault's fields."""
        method, *fields = self.kind.spec.carried_by
        assert all(getattr(self, field) is not None for field in self.kind.spec.required), self
        getattr(target, method)(*(getattr(self, field) for field in fields))


def lacking(request: Mapping[str, Any]) -> str | None:
    """The setting a control request for a fault (its `op` a kind's name) lacks of those its kind requires
    (`Spec.required`; its learner is the engine's to check), or None (also for an op that is no fault kind).
    The plan resolves every default, so the engine ignores such a request rather than give it one of its own."""
    kind = next((k for k in FaultKind if k.value == request.get("op")), None)
    if kind is None:
        return None
    return next((field for field in kind.spec.required if field != "learner" and not request.get(field)), None)
