"""Chaos fault kinds: each names the mechanism it uses, and describes itself."""

from __future__ import annotations

from chaos.faults import Fault, FaultKind
from tests.helpers import CL, DL, KN, KS, SL, ST, K


def test_every_fault_kind_names_its_mechanism():
    values = ["kill", "stall", "slow", "join", "leave", "kill_syncer", "degrade_link", "cut_link", "kill_node"]
    assert [k.value for k in FaultKind] == values
    assert all(k.__doc__ and k.__doc__ != FaultKind.__doc__ for k in FaultKind)
    assert "SIGKILL" in K.__doc__ and "SIGSTOP" in ST.__doc__ and "SIGCONT" in ST.__doc__
    assert "SIGKILL" in KS.__doc__ and "step time" in SL.__doc__
    assert "bandwidth" in DL.__doc__ and "latency" in DL.__doc__ and "queue" in CL.__doc__
    # Link faults act on one learner for a while, and leave it training (the quorum guardrail ignores them).
    assert all(k.needs_learner and k.has_duration and not k.takes_learner_out for k in (DL, CL))
    assert Fault(1, DL, 2, 30, 10).describe() == "link bandwidth /10, latency x10 for 30 s"
    assert Fault(1, CL, 2, 10).describe() == "link cut for 10 s, messages held until it returns"
    # A lost node is named by a learner on it, takes learners out, and its rate is per run, not per learner.
    assert "SIGKILL" in KN.__doc__ and "node" in KN.__doc__
    assert KN.needs_learner and KN.takes_learner_out and KN.is_kill and not KN.has_duration and not KN.rate_per_learner
    assert Fault(1, KN, 2).target_name == "node of learner 2"
