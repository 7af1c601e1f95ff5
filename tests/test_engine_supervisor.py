"""The supervisor's goodput filing, without Ray: time a training learner's loop stood still is not
filed as productive."""

from __future__ import annotations

import pytest

from dlc.config.load import load_recipe
from dlc.engine import supervisor as supervisor_module
from dlc.engine.supervisor import LearnerSlot, Supervisor
from dlc.run.rundir import RunDir
from tests.helpers import TINY


@pytest.fixture
def rundir(tmp_path):
    opened = RunDir(tmp_path, recipe_text="")
    yield opened
    opened.close()


def test_blocked_time_of_a_training_learner_is_filed_as_waiting_and_checkpoint(rundir, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(supervisor_module.time, "monotonic", lambda: now[0])
    sup = Supervisor(load_recipe(TINY), rundir, syncer=None, make_learner=None, join_streams=[])
    sup.slots[0] = slot = LearnerSlot(handle=None, stream=None, view={"state": "training"}, ticked_at=100.0)
    # 10 s training, of which its loop spent 1.5 s copying its state for a peer and 2 s checkpointing.
    slot.view.update(waiting_s=1.5, checkpoint_s=2.0)
    now[0] = 110.0
    sup.file_time()
    row = sup.ledger.summary()["learners"]["0"]
    assert (row["productive"], row["waiting"], row["checkpoint"]) == (6.5, 1.5, 2.0)
    # One more second: half of it a checkpoint. Counters are cumulative; only the new part is filed.
    slot.view.update(checkpoint_s=2.5)
    now[0] = 111.0
    sup.file_time()
    row = sup.ledger.summary()["learners"]["0"]
    assert (row["productive"], row["waiting"], row["checkpoint"]) == (7.0, 1.5, 2.5)
    assert row["goodput"] == pytest.approx(7.0 / 11.0, abs=1e-4)
