"""The syncer actor's worker without Ray: a restarted syncer reports the rounds its predecessor
closed but never reported, so the run's record does not depend on which process died."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from dlc.algo.decoupled.messages import Push
from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.engine.local import Direct
from dlc.engine.syncer_actor import SyncerWorker
from tests.helpers import TINY, marked_storage


def worker(run_dir):
    recipe = load_recipe(TINY, ["learners.count=2", "syncer.quorum=1", "syncer.codec=none", "syncer.fragments=2"])
    w = SyncerWorker(recipe.model_dump(mode="json"), str(run_dir), marked_storage(run_dir))
    delivered = []
    for i in range(2):
        w.register(i, SimpleNamespace(deliver=Direct(delivered.append)))
    return w


def push(w, fragment, seq, base):
    delta = np.full(w.syncer.plan.size(fragment), 1e-3, np.float32)
    w.syncer.open_round(fragment)  # the fragment's round comes up; K = 1: the push closes it
    w.push(Push(0, fragment, base, 4, 400, seq, get_codec("none").encode(delta), sent_at=0.0))


def rounds(events):
    return {(e["fragment"], e["version"]) for e in events if e["kind"] == "round_closed"}


def test_a_restarted_syncer_reports_rounds_its_predecessor_never_reported(tmp_path):
    first = worker(tmp_path)
    push(first, 0, seq=0, base=0)
    reported = first.poll()["events"]  # the driver saw fragment 0's version 1 ...
    first.save()  # ... and it went into a checkpoint
    push(first, 0, seq=1, base=1)
    push(first, 1, seq=2, base=0)  # these two the driver never saw: the syncer dies now
    assert rounds(reported) == {(0, 1)}
    first.close()

    second = worker(tmp_path)
    restored = second.restore()
    assert restored is not None and restored["versions"] == [2, 1]
    again = second.poll()["events"]
    # Every round closed before the death is reported again (the driver logs each once), with
    # the time it closed; nothing that did not happen is.
    assert rounds(again) == {(0, 1), (0, 2), (1, 1)}
    assert all(e["replayed"] and e["t"] > 0 for e in again if e["kind"] == "round_closed")
    assert second.poll()["events"] == []  # once
    second.close()
