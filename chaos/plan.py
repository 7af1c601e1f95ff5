"""A fault plan: which faults to inject, how often, and the guardrails, loaded from YAML plus overrides.

Like a recipe, every key is declared with its unit in its name; an unknown key is an error with a
did-you-mean, and every message names the field and the fix.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from chaos.faults import Fault, FaultKind
from dlc.errors import UserError

PLANS_DIR = Path(__file__).resolve().parent / "plans"

# Names people reach for (often the CLI option's) -> the declared key, for did-you-mean.
_ALIASES = {setting.alias: setting.key for kind in FaultKind for _, setting in kind.settings()} | {
    "duration": "duration_s",
    "warmup": "warmup_s",
    "min_gap": "min_gap_s",
    "at": "at_s",
    "time_s": "at_s",
    "kind": "fault",
    "for_s": "duration_s",
}


def _listed(names: list[str], last: str = "and") -> str:
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else names[0]


def _kinds(where: Callable[[FaultKind], bool]) -> list[FaultKind]:
    return [kind for kind in FaultKind if where(kind)]


_LASTING = _kinds(lambda k: k.has_duration)
_FACTORED = _kinds(lambda k: k.spec.factor is not None)
_NOTICED = _kinds(lambda k: k.spec.notice is not None)


class TimelineEntry(BaseModel):
    """One fault at a fixed time: `- {at_s: 30, fault: kill, learner: 2}`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # an infinite rate would fire forever at once

    at_s: float = Field(..., ge=0, description="When to inject it, in seconds after the chaos clock starts.")
    fault: FaultKind = Field(..., description=_listed([k.value for k in FaultKind], "or") + ".")
    learner: int | None = Field(
        None,
        ge=0,
        description=f"Which learner (0-based); required for "
        f"{_listed([k.value for k in _kinds(lambda k: k.spec.target == 'learner')])}, and for "
        f"{_listed([k.value for k in _kinds(lambda k: k.spec.target == 'node')])} (every learner on that learner's "
        "node), absent otherwise.",
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        description=f"{', '.join(k.value for k in _LASTING)}: how long it lasts. Default: the plan's "
        f"{', '.join(k.spec.duration.key for k in _LASTING if k.spec.duration)}.",
    )
    until_end: bool = Field(
        False,
        description=f"{', '.join(k.value for k in _LASTING if k.spec.until_end is None)}: last until the run ends "
        "instead of duration_s (heterogeneous hardware).",
    )
    factor: float | None = Field(
        None,
        gt=1,
        description="; ".join(f"{k.value}: {k.spec.factor.meaning}" for k in _FACTORED if k.spec.factor)
        + f". Default: the plan's {', '.join(k.spec.factor.key for k in _FACTORED if k.spec.factor)}.",
    )
    notice_s: float | None = Field(
        None,
        gt=0,
        description="; ".join(f"{k.value}: {k.spec.notice.meaning}" for k in _NOTICED if k.spec.notice)
        + f". Default: the plan's {', '.join(k.spec.notice.key for k in _NOTICED if k.spec.notice)}.",
    )

    @field_validator("fault", mode="before")
    @classmethod
    def _known_kind(cls, value: Any) -> Any:
        kinds = [k.value for k in FaultKind]
        if isinstance(value, FaultKind) or value in kinds:
            return value
        close = difflib.get_close_matches(str(value), kinds, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"{value!r} is not a fault kind: {hint}kinds are {', '.join(kinds)}")

    @model_validator(mode="after")
    def _fits_its_kind(self) -> TimelineEntry:
        kind = self.fault.value
        spec = self.fault.spec
        if self.fault.needs_learner and self.learner is None:
            raise ValueError(f"{kind} needs a learner: add learner: N (0-based)")
        if not self.fault.needs_learner and self.learner is not None:
            what = "adds a new learner" if spec.target == "new" else "acts on the syncer"
            raise ValueError(f"{kind} {what} and takes no learner: remove learner: {self.learner}")
        if not self.fault.has_duration and (self.duration_s is not None or self.until_end):
            raise ValueError(f"{kind} is instantaneous and takes no duration_s or until_end: remove them")
        if self.until_end and spec.until_end is not None:
            raise ValueError(spec.until_end)
        if self.until_end and self.duration_s is not None:
            raise ValueError(f"duration_s={self.duration_s:g} and until_end: true contradict each other: keep one")
        if self.factor is not None and spec.factor is None:
            takes = _listed([k.value for k in _FACTORED], "or")
            raise ValueError(f"factor is for {takes}, not {kind}: remove factor: {self.factor:g}")
        if self.notice_s is not None and spec.notice is None:
            takes = _listed([k.value for k in _NOTICED], "or")
            raise ValueError(f"notice_s is for {takes}, not {kind}: remove notice_s: {self.notice_s:g}")
        return self


class _Guards(BaseModel):
    """A plan's settings beside its faults': what it is, its seed, and the guardrails."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # an infinite rate would fire forever at once

    description: str = Field("", description="What this plan does, in a sentence (printed when it starts).")
    seed: int = Field(
        0, description="Seed of the Poisson draws; the same seed gives the same faults at the same times."
    )
    duration_s: float | None = Field(
        None, gt=0, description="Inject for this many seconds after the chaos clock starts; null: until the run ends."
    )
    warmup_s: float = Field(
        20.0,
        ge=0,
        description="No fault in the first seconds of the chaos clock (it starts once every learner trains): Poisson "
        "draws begin after it, timeline faults inside it are refused.",
    )
    min_gap_s: float = Field(
        5.0, ge=0, description="At least this many seconds between two fired faults; one due sooner is refused."
    )
    max_concurrent: int = Field(
        1, ge=1, description="Faults in flight at once, at most; one that would exceed it is refused."
    )
    allow_below_quorum: bool = Field(
        False, description="Allow a kill, stall or leave that leaves fewer healthy learners than syncer.quorum."
    )
    dry_run: bool = Field(False, description="Record what would be injected, and the refusals, but touch nothing.")
    in_flight_max_s: float = Field(
        60.0,
        gt=0,
        description="A kill is in flight until its learner trains again after being seen down or in a new "
        "process (a hot spare), a leave until it is gone, a syncer kill for this long; none longer than this.",
    )


def _fault_fields() -> dict[str, Any]:
    """Each kind's plan keys, as its spec declares them: rates at least 0, factors above 1, times above 0."""
    # (ge, gt) of each slot
    bounds: dict[str, tuple[float | None, float | None]] = {
        "rate": (0, None),
        "factor": (None, 1),
        "duration": (None, 0),
        "notice": (None, 0),
    }
    return {
        setting.key: (
            float,
            Field(setting.default, description=setting.description, ge=bounds[slot][0], gt=bounds[slot][1]),
        )
        for kind in FaultKind
        for slot, setting in kind.settings()
    }


# The guardrails, then every kind's keys; `Plan` adds the timeline.
_Settings = create_model("_Settings", __base__=_Guards, **_fault_fields())


class Plan(_Settings):
    """What to inject and the guardrails around it. Rates are Poisson rates, seeded by `seed`."""

    timeline: list[TimelineEntry] = Field(
        default_factory=list, description="Faults at fixed times, each like {at_s: 30, fault: kill, learner: 2}."
    )

    @model_validator(mode="after")
    def _timeline_within_duration(self) -> Plan:
        if self.duration_s is None:
            return self
        if self.duration_s <= self.warmup_s:  # Poisson draws start after it, timeline faults in it are refused
            raise ValueError(
                f"duration_s={self.duration_s:g} ends before the warm-up does (warmup_s={self.warmup_s:g}): no "
                "fault could fire; lengthen duration_s (--duration) or shorten warmup_s (--warmup)"
            )
        for i, entry in enumerate(self.timeline):
            if entry.at_s > self.duration_s:
                raise ValueError(
                    f"timeline[{i}].at_s={entry.at_s:g} is after duration_s={self.duration_s:g}: "
                    "move it earlier or lengthen duration_s"
                )
        return self

    # -- views -------------------------------------------------------------------------------

    def rate_per_min(self, kind: FaultKind) -> float:
        """The Poisson rate of a kind: per learner for learner faults, for the whole run otherwise."""
        return float(getattr(self, kind.spec.rate.key))

    def default_duration_s(self, kind: FaultKind) -> float | None:
        return None if kind.spec.duration is None else float(getattr(self, kind.spec.duration.key))

    def default_factor(self, kind: FaultKind) -> float | None:
        """The factor of a kind that takes one (slow, degrade_link); None for the others."""
        return None if kind.spec.factor is None else float(getattr(self, kind.spec.factor.key))

    def default_notice_s(self, kind: FaultKind) -> float | None:
        """The notice of a kind that gives one (preempt); None for the others."""
        return None if kind.spec.notice is None else float(getattr(self, kind.spec.notice.key))

    def fault_of(self, entry: TimelineEntry) -> Fault:
        """A timeline entry with the plan's defaults filled in."""
        duration = None if entry.until_end else (entry.duration_s or self.default_duration_s(entry.fault))
        factor = entry.factor or self.default_factor(entry.fault)
        notice = entry.notice_s or self.default_notice_s(entry.fault)
        return Fault(entry.at_s, entry.fault, entry.learner, duration, factor, origin="timeline", notice_s=notice)

    def is_empty(self) -> bool:
        return not self.timeline and not any(self.rate_per_min(k) for k in FaultKind)

    def check_learners(self, learner_ids: Collection[int]) -> None:
        """UserError when the timeline names a learner the run does not have."""
        for i, entry in enumerate(self.timeline):
            if entry.learner is not None and entry.learner not in learner_ids:
                have = ", ".join(str(x) for x in sorted(learner_ids)) or "none"
                raise UserError(
                    f"timeline[{i}] targets learner {entry.learner} but the run's learners are {have}: "
                    "change the learner, or add learners to the recipe"
                )

    def summary(self) -> str:
        """One line: the rates, the timeline and the guardrails."""
        parts = []
        for kind in FaultKind:
            rate = self.rate_per_min(kind)
            if rate:
                per = "/learner/min" if kind.rate_per_learner else "/min"
                numbers = {
                    "duration": self.default_duration_s(kind),
                    "factor": self.default_factor(kind),
                    "notice": self.default_notice_s(kind),
                }
                parts.append(f"{kind.value} {rate:g}{per}{kind.spec.summary.format(**numbers)}")
        if self.timeline:
            parts.append(f"{len(self.timeline)} timeline fault(s)")
        lasting = f"{self.duration_s:g} s" if self.duration_s is not None else "until the run ends"
        guards = f"warm-up {self.warmup_s:g} s, gap {self.min_gap_s:g} s, at most {self.max_concurrent} in flight" + (
            ", may go below quorum" if self.allow_below_quorum else ""
        )
        return f"{', '.join(parts) or 'nothing'}; {lasting}; {guards}; seed {self.seed}" + (
            "; DRY RUN" if self.dry_run else ""
        )


# ---------------------------------------------------------------------------------------------
# Loading


def shipped_plans() -> dict[str, Path]:
    """The plans kept next to the code: name -> file."""
    return {p.stem: p for p in sorted(PLANS_DIR.glob("*.yaml"))}


def resolve_plan_path(name: str | Path) -> Path:
    """A plan file, or the name of a shipped plan (`kill_storm`); UserError listing them otherwise."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = shipped_plans()
    stem = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and stem in shipped:
        return shipped[stem]
    raise UserError(
        f"plan file {str(name)!r} not found: give a YAML file, or one of the shipped plans "
        f"{', '.join(shipped)} (in {PLANS_DIR})"
    )


def load_plan(
    path: str | Path | None,
    overrides: Mapping[str, Any] | None = None,
    option_names: Mapping[str, str] | None = None,
) -> Plan:
    """Read a plan (a file or a shipped plan's name; None: all defaults), apply overrides, validate once.

    ``overrides`` replace top-level keys. ``option_names`` maps an overridden key to the command-line
    option that set it, so a bad value is reported as `--kill-rate=-1` rather than by its key.
    """
    data: dict[str, Any] = {}
    origin = "plan"
    if path is not None:
        file = resolve_plan_path(path)
        origin = f"plan {str(file)!r}"
        try:
            loaded = yaml.safe_load(file.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise UserError(f"{origin} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise UserError(f"{origin} must be a mapping of keys (kill_per_learner_per_min:, timeline:, ...)")
        data = loaded or {}
    data = {**data, **(overrides or {})}
    names = {k: v for k, v in (option_names or {}).items() if k in (overrides or {})}
    return plan_from_dict(data, origin, names)


def plan_from_dict(
    data: Mapping[str, Any], origin: str = "plan", option_names: Mapping[str, str] | None = None
) -> Plan:
    try:
        return Plan.model_validate(dict(data))
    except ValidationError as exc:
        raise UserError(_describe(exc, origin, option_names or {})) from None


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(exc: ValidationError, origin: str, option_names: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _where(loc)
        if len(loc) == 1 and loc[0] in option_names:
            where = option_names[str(loc[0])]
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            names = list(TimelineEntry.model_fields if loc[0] == "timeline" else Plan.model_fields)
            close = [_ALIASES[key]] if _ALIASES.get(key) in names else difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {close[0]}?" if close else f"valid keys here: {', '.join(names)}"
            lines.append(f"unknown key {where}: {hint}")
        elif err["type"] == "value_error":
            message = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{where}: {message}" if where else message)
        elif err["type"] in ("model_type", "model_attributes_type") and loc[:1] == ("timeline",):
            lines.append(
                f"{where}={err.get('input')!r} is not a mapping: write it as {{at_s: 30, fault: kill, learner: 2}}"
            )
        else:
            lines.append(f"{where}={err.get('input')!r}: {err['msg']}")
    return f"invalid {origin}:\n  " + "\n  ".join(lines)


def reference_markdown() -> str:
    """The plan reference table of the README, generated from the declared fields."""
    from pydantic_core import PydanticUndefined

    def default_of(field: Any) -> str:
        if field.default_factory is not None:
            return json.dumps(field.default_factory())
        return "required" if field.default is PydanticUndefined else json.dumps(field.default)

    lines = ["| key | default | meaning |", "|---|---|---|"]
    for name, field in Plan.model_fields.items():
        lines.append(f"| `{name}` | `{default_of(field)}` | {field.description} |")
        if name == "timeline":
            for key, leaf in TimelineEntry.model_fields.items():
                lines.append(f"| `timeline[].{key}` | `{default_of(leaf)}` | {leaf.description} |")
    return "\n".join(lines)
