"""Chaos: break a running training job on purpose, on a schedule, behind guardrails.

Independent of the training internals: faults act on a `Target` (see chaos.target). A plan (YAML,
chaos/plans/) says what to inject; the schedule turns it into faults; the controller fires them.
"""

from chaos.controller import Controller, Report, run
from chaos.faults import Fault, FaultKind
from chaos.plan import Plan, TimelineEntry, load_plan, shipped_plans
from chaos.schedule import schedule
from chaos.target import LearnerInfo, ProcessSignals, RunDirTarget, Target, TargetError

__all__ = [
    "Controller",
    "Fault",
    "FaultKind",
    "LearnerInfo",
    "Plan",
    "ProcessSignals",
    "Report",
    "RunDirTarget",
    "Target",
    "TargetError",
    "TimelineEntry",
    "load_plan",
    "run",
    "schedule",
    "shipped_plans",
]
