"""Chaos fault kinds: each names the mechanism it uses, and describes itself."""

from __future__ import annotations

from chaos.faults import Fault, FaultKind


def test_every_fault_kind_names_its_mechanism():
    values = ["kill", "stall", "slow", "join", "leave", "kill_syncer", "degrade_link", "cut_link", "kill_node"]
    values.append("preempt")
    assert [k.value for k in FaultKind] == values
    assert all(k.__doc__ and k.__doc__ != FaultKind.__doc__ for k in FaultKind)
    assert (
        "SIGKILL" in FaultKind.KILL.__doc__
        and "SIGSTOP" in FaultKind.STALL.__doc__
        and "SIGCONT" in FaultKind.STALL.__doc__
    )
    assert "SIGKILL" in FaultKind.KILL_SYNCER.__doc__ and "step time" in FaultKind.SLOW.__doc__
    assert (
        "bandwidth" in FaultKind.DEGRADE_LINK.__doc__
        and "latency" in FaultKind.DEGRADE_LINK.__doc__
        and "queue" in FaultKind.CUT_LINK.__doc__
    )
    # Link faults act on one learner for a while, and leave it training (the quorum guardrail ignores them).
    assert all(
        k.needs_learner and k.has_duration and not k.takes_learner_out
        for k in (FaultKind.DEGRADE_LINK, FaultKind.CUT_LINK)
    )
    assert Fault(1, FaultKind.DEGRADE_LINK, 2, 30, 10).describe() == "link bandwidth /10, latency x10 for 30 s"
    assert Fault(1, FaultKind.CUT_LINK, 2, 10).describe() == "link cut for 10 s, messages held until it returns"
    # A lost node is named by a learner on it, takes learners out, and its rate is per run, not per learner.
    assert "SIGKILL" in FaultKind.KILL_NODE.__doc__ and "node" in FaultKind.KILL_NODE.__doc__
    assert (
        FaultKind.KILL_NODE.needs_learner
        and FaultKind.KILL_NODE.takes_learner_out
        and FaultKind.KILL_NODE.is_kill
        and not FaultKind.KILL_NODE.has_duration
        and not FaultKind.KILL_NODE.rate_per_learner
    )
    assert Fault(1, FaultKind.KILL_NODE, 2).target_name == "node of learner 2"
    # A preemption: SIGTERM with a notice, then SIGKILL; it takes its learner out until a new process trains.
    assert "SIGTERM" in FaultKind.PREEMPT.__doc__ and "notice_s" in FaultKind.PREEMPT.__doc__
    assert FaultKind.PREEMPT.is_kill and FaultKind.PREEMPT.takes_learner_out and FaultKind.PREEMPT.rate_per_learner
    assert not FaultKind.PREEMPT.has_duration
    assert Fault(1, FaultKind.PREEMPT, 2, notice_s=30).describe() == "SIGTERM, SIGKILL after 30 s unless it has left"


def test_a_control_request_lacks_what_its_kind_is_carried_out_with():
    from chaos.faults import lacking

    assert lacking({"op": "stall", "learner": 1}) == "duration_s"
    assert lacking({"op": "preempt", "learner": 1, "duration_s": 5.0}) == "notice_s"
    assert lacking({"op": "degrade_link", "learner": 1, "duration_s": 5.0}) == "factor"
    assert lacking({"op": "degrade_link", "learner": 1, "factor": 10.0}) == "duration_s"
    assert lacking({"op": "cut_link", "learner": 1}) == "duration_s"
    # A slow-down or a join may last until the run ends; a kill needs nothing; an unknown op is not a fault's.
    assert lacking({"op": "slow", "learner": 1, "factor": 3.0, "duration_s": None}) is None
    assert lacking({"op": "slow", "learner": 1, "duration_s": 5.0}) == "factor"
    assert lacking({"op": "join", "duration_s": None}) is None
    assert lacking({"op": "kill", "learner": 1}) is None
    assert lacking({"op": "reboot"}) is None
