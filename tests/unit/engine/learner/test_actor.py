"""The learner actor's worker without Ray, wired to a syncer worker the way the supervisor wires
the actors: a restarted learner starts from a peer's state or the syncer's global fragments, at its
own place in its own data stream."""

from __future__ import annotations

import gc
import socket
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dlc.algo.decoupled.messages import FragmentRequest, Push
from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.data.plan import open_stream
from dlc.data.tokens import StreamSpec
from dlc.engine.learner import uplinks
from dlc.engine.learner.actor import LearnerWorker
from dlc.engine.syncer.actor import SyncerWorker
from tests.fakes import Direct
from tests.helpers import IN_PROCESS, TINY, marked_storage


@pytest.fixture(autouse=True)
def _compiled_within_the_test(monkeypatch):
    """Every worker's compile thread (started as it is built) ends within its test: a daemon thread
    still inside XLA when the interpreter exits aborts the process ("FATAL: exception not rethrown")."""
    made = []
    build = LearnerWorker.__init__

    def tracked(self, *args, **kwargs):
        made.append(self)
        build(self, *args, **kwargs)

    monkeypatch.setattr(LearnerWorker, "__init__", tracked)
    yield
    for worker in made:
        worker.startup.join(timeout=300)


def test_a_compiled_learner_leaves_what_its_start_up_made_out_of_full_collections(tmp_path):
    recipe_json = load_recipe(TINY, [*IN_PROCESS, "learners.count=1"]).model_dump(mode="json")
    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    upstream = SimpleNamespace(push=Direct(lambda push: None))
    worker = LearnerWorker(recipe_json, 0, stream, marked_storage(tmp_path), upstream)
    worker.startup.join(timeout=300)
    assert worker.error is None and worker.startup.compiled.is_set()
    # Built after the imports were frozen; frozen too once compiled: no collection walks it again.
    assert not any(o is worker.learner for o in gc.get_objects())
    assert gc.get_freeze_count() > 0


def test_a_learner_with_no_peer_to_copy_starts_from_the_global_fragments(tmp_path):
    recipe = load_recipe(TINY, [*IN_PROCESS, "learners.count=2", "syncer.codec=none", "syncer.fragments=2"])
    recipe_json = recipe.model_dump(mode="json")
    storage = marked_storage(tmp_path)
    syncer = SyncerWorker(recipe_json, str(tmp_path), storage)
    syncer.register(0, SimpleNamespace(deliver=Direct(lambda message: None)))
    delta = np.full(syncer.syncer.plan.size(0), 1e-2, np.float32)
    syncer.syncer.open_round(0)  # fragment 0's round comes up; K = 1: the push closes it
    syncer.push(Push(0, 0, 0, 4, 400, 0, get_codec("none").encode(delta), sent_at=0.0))  # fragment 0 -> v1

    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    learner = LearnerWorker(recipe_json, 1, stream, storage, SimpleNamespace(push=Direct(lambda push: None)))
    # The supervisor passes the syncer's answer on as it comes: one (fragments, versions) value,
    # and where the learner's previous process had got to in its stream.
    where = learner.import_global(syncer.global_fragments(), 17)

    fragments, versions = learner.sync.peer_view()
    expected, expected_versions = syncer.global_fragments()
    assert where["peer"] is None and versions == expected_versions == [1, 0]
    assert where["data_position"] == learner.learner.position == 17
    for mine, theirs in zip(fragments, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    syncer.close()


def two_streams(kind: str, tmp_path) -> tuple[list[Any], list[str]]:
    """Two learners' data: bytes held in memory, or their shares of a dataset prepared here."""
    if kind == "bytes":
        return [np.random.default_rng(i).integers(0, 256, 200_000, dtype=np.uint8) for i in range(2)], []
    from dlc.data.prepare import prepare

    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(40):
        (texts / f"{i}.txt").write_text(f"document {i}: " + "".join(chr(33 + (i * j) % 90) for j in range(10_000)))
    prepare([str(texts)], tmp_path / "ds", tokenizer="bytes", eval_fraction=0.1, workers=1)
    return [StreamSpec(str(tmp_path / "ds"), i, 2, 1024) for i in range(2)], ["model.vocab_size=257"]


@pytest.mark.parametrize("kind", ["bytes", "prepared"])
def test_a_learner_copying_a_peer_goes_on_from_its_own_place_in_its_own_stream(kind, tmp_path):
    streams, vocab = two_streams(kind, tmp_path)
    recipe = load_recipe(TINY, [*IN_PROCESS, "learners.count=2", "syncer.fragments=2", *vocab])
    recipe_json = recipe.model_dump(mode="json")
    no_syncer = SimpleNamespace(push=Direct(lambda push: None))
    storage = marked_storage(tmp_path)
    peer = LearnerWorker(recipe_json, 0, streams[0], storage, no_syncer)
    for _ in range(5):
        peer.learner.train_step()
    state = peer.export_state()  # not training: copied directly
    assert state["meta"]["step"] == state["meta"]["data_position"] == 5

    # Learner 1's previous process had read 3 batches of its own stream when it died.
    rejoined = LearnerWorker(recipe_json, 1, streams[1], storage, no_syncer, incarnation=1)
    where = rejoined.import_state(state, 3)
    assert where == {**where, "peer": 0, "step": 5, "data_position": 3}  # the peer's step, its own position
    # Its next batch is the fourth of its own stream: nothing of its shard repeated or skipped.
    own = open_stream(streams[1], recipe.learners.batch_size, recipe.learners.seq_len, position=3).next_batch()
    for got, expected in zip(rejoined.learner.stream.next_batch(), own, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_learner_behind_its_previous_process_checkpoints_over_the_stale_steps(tmp_path):
    # A restart that copied a peer behind the dead process (or started from the global model)
    # saves at steps the dead process had saved: its checkpoints are stale, not a reason to fail.
    recipe = load_recipe(TINY, [*IN_PROCESS, "learners.count=2"])
    recipe_json = recipe.model_dump(mode="json")
    storage = marked_storage(tmp_path)
    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    no_syncer = SimpleNamespace(push=Direct(lambda push: None))
    dead = LearnerWorker(recipe_json, 0, stream, storage, no_syncer)
    for _ in range(3):
        dead.learner.train_step()
        dead.save()
    assert dead.checkpointer.latest_step() == 3
    dead.checkpointer.close()

    again = LearnerWorker(recipe_json, 0, stream, storage, no_syncer, incarnation=1)
    again.import_global((dead.sync.peer_view()), data_position=3, step=2)
    assert again.learner.step == 2  # where the dead process had got to, not step 0
    again.save()  # step 2 exists: overwritten; step 3 is stale: removed
    assert again.checkpointer.latest_step() == 2
    again.checkpointer.close()


def test_a_resumed_learner_numbers_its_pushes_above_every_seq_the_syncer_saw(tmp_path):
    # After a hard stop the learner's checkpoint is older than the syncer's state: its seqs from
    # the checkpoint were already seen (they would be refused as duplicates). It goes on from the
    # syncer's next seq, in the incarnation that seq belongs to, so a later restart numbers above it.
    recipe = load_recipe(TINY, [*IN_PROCESS, "learners.count=2", "syncer.fragments=2"])
    recipe_json = recipe.model_dump(mode="json")
    storage = marked_storage(tmp_path)
    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    no_syncer = SimpleNamespace(push=Direct(lambda push: None))
    learner = LearnerWorker(recipe_json, 0, stream, storage, no_syncer, incarnation=1)
    learner.learner.train_step()
    learner.sync.seq += 5  # five pushes made
    learner.save()
    learner.checkpointer.close()

    resumed = LearnerWorker(recipe_json, 0, stream, storage, no_syncer)
    where = resumed.restore(next_seq=1_000_000_009)
    assert resumed.sync.seq == 1_000_000_009 and where["incarnation"] == resumed.sync.incarnation == 1
    assert where["checkpoint"] and where["step"] == 1
    resumed.checkpointer.close()
    # Learner 1 never saved: it says so (the driver tells the user it starts from the global model).
    fresh = LearnerWorker(recipe_json, 1, stream, storage, no_syncer)
    assert fresh.restore(next_seq=0) == {"step": 0, "data_position": 0, "incarnation": 0, "checkpoint": False}
    fresh.checkpointer.close()
    behind = LearnerWorker(recipe_json, 0, stream, storage, no_syncer)
    assert behind.restore(next_seq=3)["incarnation"] == 1 and behind.sync.seq == 1_000_000_005  # its own is higher
    behind.checkpointer.close()


def wired(tmp_path, monkeypatch, *overrides: str) -> tuple[SyncerWorker, LearnerWorker]:
    """A syncer worker and learner 1's worker, wired as the actors are, with the direct channel (the
    default) on loopback; Ray's one part, asking the syncer actor where its channel is, is the syncer
    worker's own answer."""
    monkeypatch.setattr(uplinks.ray, "get", lambda ref, timeout=None: ref)
    settings = ["learners.count=2", "syncer.codec=none", "syncer.fragments=2", *overrides]
    recipe_json = load_recipe(TINY, [*IN_PROCESS, *settings]).model_dump(mode="json")
    storage = marked_storage(tmp_path)
    syncer = SyncerWorker(recipe_json, str(tmp_path), storage)
    handle = SimpleNamespace(
        channel=SimpleNamespace(remote=syncer.channel), retire=SimpleNamespace(remote=syncer.retire)
    )
    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    return syncer, LearnerWorker(recipe_json, 1, stream, storage, handle)


def test_a_learner_and_the_syncer_talk_on_the_direct_channel(tmp_path, monkeypatch):
    syncer, learner = wired(tmp_path, monkeypatch)
    try:
        syncer.register(1, SimpleNamespace(deliver=None))  # no actor call may carry a message
        assert learner._try_connect() and learner.link.uplink.connected
        syncer._deliver(1, FragmentRequest(fragment=1, version=0, sent_at=0.0))
        request = learner.sync.inbox.get(timeout=10)
        assert (request.fragment, request.version) == (1, 0)
        joined = syncer.syncer.heartbeats[1]
        learner.link.uplink.heartbeat(1, 42)
        learner.link.uplink.barrier(timeout_s=10)  # returns once the heartbeat was handled
        assert syncer.syncer.heartbeats[1] > joined and syncer.poll()["status"]["channel_messages_in"] == 2
    finally:
        learner.link.uplink.close()
        syncer.close()


def test_a_syncer_whose_channel_cannot_be_reached_fails_the_run_saying_why(tmp_path, monkeypatch):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(uplinks.ray, "get", lambda ref, timeout=None: ref)
    monkeypatch.setattr(uplinks, "UNREACHABLE_S", 0.05)
    channel = {"address": ("127.0.0.1", port), "authkey": b"key"}
    handle = SimpleNamespace(channel=SimpleNamespace(remote=lambda: channel))
    recipe_json = load_recipe(TINY, [*IN_PROCESS, "learners.count=2"]).model_dump(mode="json")
    stream = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    learner = LearnerWorker(recipe_json, 0, stream, marked_storage(tmp_path), handle)
    assert not learner._try_connect() and learner.error is None  # refused once: it tries again
    time.sleep(0.1)  # refused for longer than it waits: the run fails with the reason
    assert not learner._try_connect()
    assert f"learner 0 cannot reach the syncer at 127.0.0.1:{port}" in learner.error
    assert "ConnectionRefusedError" in learner.error and "syncer.channel=ray" in learner.error
    learner.checkpointer.close()


def test_a_learner_that_finishes_its_steps_hands_its_progress_over_at_once(tmp_path, monkeypatch):
    # Its peers may train on for seconds: progress held until the driver stops every learner would
    # meet a global model rounds newer. The syncer holds it by the time the learner says it finished.
    syncer, learner = wired(tmp_path, monkeypatch, "run.max_steps=3")
    try:
        syncer.register(1, SimpleNamespace(deliver=None))
        learner.start(None, None)
        deadline = time.monotonic() + 300
        while learner.state != "finished" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert learner.state == "finished" and learner.learner.step == 3
        # No round asked for anything: what it holds is both fragments, three steps each.
        assert learner.sync.unpushed_steps() == 0
        assert syncer.poll()["status"]["pushes_accepted"] == 2
        assert syncer.syncer.retired == {1} and 1 not in syncer.syncer.members  # no round asks it again
        final = learner.stop()  # the driver's stop at the run's end sends nothing twice
        assert final["snapshot"]["state"] == "stopped" and syncer.poll()["status"]["pushes_accepted"] == 2
    finally:
        learner._stop.set()
        learner.link.uplink.close()
        syncer.close()
