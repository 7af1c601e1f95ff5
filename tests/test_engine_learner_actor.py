"""The learner actor's worker without Ray, wired to a syncer worker the way the supervisor wires
the actors: a learner restarted with no healthy peer starts from the syncer's global fragments."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from dlc.algo.decoupled.messages import Push
from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.engine.learner_actor import LearnerWorker
from dlc.engine.local import Direct
from dlc.engine.syncer_actor import SyncerWorker
from tests.helpers import TINY, marked_storage


def test_a_learner_with_no_peer_to_copy_starts_from_the_global_fragments(tmp_path):
    recipe = load_recipe(TINY, ["learners.count=2", "syncer.codec=none", "syncer.fragments=2"])
    recipe_json = recipe.model_dump(mode="json")
    storage = marked_storage(tmp_path)
    syncer = SyncerWorker(recipe_json, str(tmp_path), storage)
    syncer.register(0, SimpleNamespace(deliver=Direct(lambda message: None)))
    delta = np.full(syncer.syncer.plan.size(0), 1e-2, np.float32)
    syncer.syncer.open_round(0)  # fragment 0's round comes up; K = 1: the push closes it
    syncer.push(Push(0, 0, 0, 4, 400, 0, get_codec("none").encode(delta), sent_at=0.0))  # fragment 0 -> v1

    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    learner = LearnerWorker(recipe_json, 1, stream, storage, SimpleNamespace(push=Direct(lambda push: None)))
    # The supervisor passes the syncer's answer on as it comes: one (fragments, versions) value.
    where = learner.import_global(syncer.global_fragments())

    fragments, versions = learner.sync.peer_view()
    expected, expected_versions = syncer.global_fragments()
    assert where["peer"] is None and versions == expected_versions == [1, 0]
    for mine, theirs in zip(fragments, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    syncer.close()
