"""Chaos plans: files and overrides, validation that names the field and the fix, the shipped plans,
and the reference table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import Fault, FaultKind
from chaos.plan import Plan, load_plan, plan_from_dict, reference_markdown, shipped_plans
from dlc.errors import UserError
from tests.fakes import FakeTarget, SleepingClock
from tests.helpers import run_plan


def test_link_faults_in_a_plan_file_take_the_plans_defaults(tmp_path: Path):
    file = tmp_path / "links.yaml"
    file.write_text(
        "degrade_link_per_learner_per_min: 0.5\ndegrade_link_factor: 6\ndegrade_link_for_s: 25\n"
        "cut_link_per_learner_per_min: 1\ncut_link_for_s: 7\ntimeline:\n"
        "  - {at_s: 1, fault: degrade_link, learner: 0}\n"
        "  - {at_s: 2, fault: degrade_link, learner: 1, factor: 2.5, duration_s: 9}\n"
        "  - {at_s: 3, fault: cut_link, learner: 2}\n"
        "  - {at_s: 4, fault: cut_link, learner: 3, duration_s: 1.5}\n"
    )
    plan = load_plan(file)
    assert [plan.fault_of(e) for e in plan.timeline] == [
        Fault(1, FaultKind.DEGRADE_LINK, 0, 25, 6),
        Fault(2, FaultKind.DEGRADE_LINK, 1, 9, 2.5),
        Fault(3, FaultKind.CUT_LINK, 2, 7, None),
        Fault(4, FaultKind.CUT_LINK, 3, 1.5, None),
    ]
    assert plan.summary().startswith("degrade_link 0.5/learner/min x6 for 25 s, cut_link 1/learner/min for 7 s")
    defaults = plan_from_dict({})
    assert (defaults.degrade_link_per_learner_per_min, defaults.degrade_link_factor, defaults.degrade_link_for_s,
            defaults.cut_link_per_learner_per_min, defaults.cut_link_for_s) == (0, 10, 30, 0, 10)  # fmt: skip
    assert defaults.fault_of(plan.timeline[0]) == Fault(1, FaultKind.DEGRADE_LINK, 0, 30, 10)


def _invalid(data: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(UserError) as info:
        plan_from_dict(data, **kw)
    return str(info.value)


def timeline_of(**entry: Any) -> dict[str, Any]:
    """A plan whose timeline holds the one entry."""
    return {"timeline": [entry]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kill_rate": 1}, "unknown key kill_rate: did you mean kill_per_learner_per_min?"),
        ({"warmup_sec": 1}, "unknown key warmup_sec: did you mean warmup_s?"),
        ({"kill_per_learner_per_min": float("inf")}, "kill_per_learner_per_min=inf: Input should be a finite number"),
        (timeline_of(at_s=1, fault="kill", lerner=0), "unknown key timeline[0].lerner: did you mean learner?"),
        (
            timeline_of(at_s=1, fault="kil", learner=0),
            "timeline[0].fault: 'kil' is not a fault kind: did you mean kill?",
        ),
        (timeline_of(at_s=1, fault="kill"), "timeline[0]: kill needs a learner: add learner: N"),
        (
            timeline_of(at_s=1, fault="join", learner=1),
            "join adds a new learner and takes no learner: remove learner: 1",
        ),
        (timeline_of(at_s=1, fault="kill_syncer", learner=0), "kill_syncer acts on the syncer"),
        (timeline_of(at_s=1, fault="stall", learner=0, until_end=True), "a stall cannot last until_end"),
        (timeline_of(at_s=1, fault="kill", learner=0, duration_s=3), "kill is instantaneous and takes no duration_s"),
        (timeline_of(at_s=1, fault="stall", learner=0, factor=2), "factor is for slow or degrade_link, not stall"),
        (
            timeline_of(at_s=1, fault="cut_link", learner=0, factor=2),
            "factor is for slow or degrade_link, not cut_link",
        ),
        (timeline_of(at_s=1, fault="degrade_link"), "timeline[0]: degrade_link needs a learner: add learner: N"),
        (timeline_of(at_s=1, fault="cut_lnk", learner=0), "'cut_lnk' is not a fault kind: did you mean cut_link?"),
        (
            timeline_of(at_s=1, fault="degrade_link", learner=0, factor=0.5),
            "timeline[0].factor=0.5: Input should be greater",
        ),
        (timeline_of(at_s=1, fault="cut_link", learner=0, until_end=True), "a cut_link cannot last until_end"),
        (timeline_of(at_s=1, fault="degrade_link", learner=0, until_end=True), "set learners.bandwidth_mbps"),
        ({"degrade_link_factor": 1}, "degrade_link_factor=1: Input should be greater than 1"),
        ({"cut_link_for_s": 0}, "cut_link_for_s=0: Input should be greater than 0"),
        ({"link_factor": 4}, "unknown key link_factor: did you mean degrade_link_factor?"),
        ({"cut_link_rate": 1}, "unknown key cut_link_rate: did you mean cut_link_per_learner_per_min?"),
        ({"timeline": ["kill learner 2"]}, "timeline[0]='kill learner 2' is not a mapping: write it as {at_s: 30"),
        ({"duration_s": 60, **timeline_of(at_s=90, fault="join")}, "timeline[0].at_s=90 is after duration_s=60"),
        ({"slow_factor": 0.5}, "slow_factor=0.5: Input should be greater than 1"),
        ({"max_concurrent": 0}, "max_concurrent=0: Input should be greater than or equal to 1"),
    ],
)
def test_plan_validation_names_the_field_and_the_fix(data: dict[str, Any], message: str):
    assert message in _invalid(data)


def test_plan_files_overrides_and_option_names(tmp_path: Path):
    file = tmp_path / "p.yaml"
    file.write_text("kill_per_learner_per_min: 0.5\nseed: 4\ntimeline:\n  - {at_s: 30, fault: kill, learner: 2}\n")
    plan = load_plan(file, {"seed": 9, "stall_for_s": 4})
    assert (plan.kill_per_learner_per_min, plan.seed, plan.stall_for_s, plan.timeline[0].learner) == (0.5, 9, 4, 2)
    with pytest.raises(UserError, match=r"--kill-rate=-1: Input should be greater than or equal to 0"):
        load_plan(file, {"kill_per_learner_per_min": -1}, {"kill_per_learner_per_min": "--kill-rate"})
    file.write_text("- kill\n")
    with pytest.raises(UserError, match="must be a mapping"):
        load_plan(file)
    file.write_text("timeline: [\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_plan(file)
    with pytest.raises(UserError, match=r"not found: .*kill_storm"):
        load_plan(tmp_path / "missing.yaml")
    with pytest.raises(UserError, match=r"timeline\[0\] targets learner 2 but the run's learners are 0, 1"):
        load_plan(None, {"timeline": [{"at_s": 1, "fault": "kill", "learner": 2}]}).check_learners([0, 1])


def test_shipped_plans_load_and_fit_the_tiny_recipe():
    plans = {name: load_plan(name) for name in shipped_plans()}
    assert set(plans) == {"kill_storm", "stragglers", "heterogeneous", "mixed", "thin_links"}
    for plan in plans.values():
        plan.check_learners([0, 1, 2, 3])
        assert plan.description and not plan.is_empty() and not plan.dry_run
    assert plans["kill_storm"].kill_per_learner_per_min > 0
    assert plans["stragglers"].stall_per_learner_per_min > 0 and plans["stragglers"].slow_per_learner_per_min > 0
    hetero = [plans["heterogeneous"].fault_of(e) for e in plans["heterogeneous"].timeline]
    assert hetero and all(f.kind is FaultKind.SLOW and f.duration_s is None for f in hetero)  # slow for the whole run
    assert {e.fault for e in plans["mixed"].timeline} >= {FaultKind.JOIN, FaultKind.LEAVE, FaultKind.KILL_SYNCER}
    thin = plans["thin_links"]
    assert {e.fault for e in thin.timeline} == {
        FaultKind.DEGRADE_LINK,
        FaultKind.CUT_LINK,
    } and thin.degrade_link_factor == 10
    assert thin.degrade_link_per_learner_per_min > 0 and thin.cut_link_per_learner_per_min > 0
    # Its scripted degradation and cut both fire (seed 0), within its guardrails.
    clock = SleepingClock()
    target = FakeTarget(clock)
    run_plan(thin, target, clock)
    assert ("degrade_link", 1, 10.0, 60.0) in target.calls and ("cut_link", 3, 10.0) in target.calls
    # Firing the heterogeneous plan applies every slow-down at once, within its guardrails.
    clock = SleepingClock()
    target = FakeTarget(clock)
    controller = run_plan(plans["heterogeneous"], target, clock)
    assert controller.report.fired == Counter({FaultKind.SLOW: len(hetero)}) and not controller.report.refused


def test_plan_reference_lists_every_field():
    table = reference_markdown()
    assert all(f"| `{name}` |" in table for name in Plan.model_fields)
    assert "| `timeline[].at_s` | `required` |" in table


def test_a_preemption_takes_its_notice_from_the_entry_or_the_plan():
    plan = plan_from_dict(
        {
            "preempt_per_learner_per_min": 0.5,
            "preempt_notice_s": 45,
            "timeline": [
                {"at_s": 1, "fault": "preempt", "learner": 0},
                {"at_s": 2, "fault": "preempt", "learner": 1, "notice_s": 5},
            ],
        }
    )
    assert [plan.fault_of(e) for e in plan.timeline] == [
        Fault(1, FaultKind.PREEMPT, 0, notice_s=45),
        Fault(2, FaultKind.PREEMPT, 1, notice_s=5),
    ]
    assert plan.summary().startswith("preempt 0.5/learner/min with 45 s notice")
    assert plan_from_dict({}).preempt_notice_s == 30
    assert "notice_s is for preempt, not kill" in _invalid(timeline_of(at_s=1, fault="kill", learner=0, notice_s=3))
    assert "preempt needs a learner" in _invalid(timeline_of(at_s=1, fault="preempt"))
    assert "preempt is instantaneous" in _invalid(timeline_of(at_s=1, fault="preempt", learner=0, duration_s=3))
    assert "did you mean preempt_per_learner_per_min?" in _invalid({"preempt_rate": 1})
    assert "preempt_notice_s=0: Input should be greater than 0" in _invalid({"preempt_notice_s": 0})
