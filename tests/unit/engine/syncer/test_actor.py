"""The syncer actor's worker without Ray: a restarted syncer reports the rounds its predecessor
closed but never reported, so the run's record does not depend on which process died."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from dlc.algo.decoupled.messages import Push
from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.engine.syncer.actor import SyncerWorker
from dlc.run import events
from tests.fakes import Direct
from tests.helpers import IN_PROCESS, TINY, marked_storage


def worker(run_dir, register=True):
    # Fake learner handles take the deliveries: messages go as actor calls, not on the direct channel.
    overrides = ["learners.count=2", "syncer.quorum=1", "syncer.codec=none", "syncer.fragments=2", "syncer.channel=ray"]
    recipe = load_recipe(TINY, [*IN_PROCESS, *overrides, "syncer.merge=mean", "syncer.down_codec=none"])
    w = SyncerWorker(recipe.model_dump(mode="json"), str(run_dir), marked_storage(run_dir))
    delivered = []
    for i in range(2 if register else 0):
        w.register(i, SimpleNamespace(deliver=Direct(delivered.append)))
    return w


def push(w, fragment, seq, base, scale=1.0):
    delta = np.full(w.syncer.plan.size(fragment), scale * 1e-3, np.float32)
    w.syncer.open_round(fragment)  # the fragment's round comes up; K = 1: the push closes it
    w.push(Push(0, fragment, base, 4, 400, seq, get_codec("none").encode(delta), sent_at=0.0))


def rounds(reported):
    return {(e.fragment, e.version) for e in reported if isinstance(e, events.RoundClosed)}


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
    assert all(e.replayed and e.t is not None and e.t > 0 for e in again if isinstance(e, events.RoundClosed))
    assert second.poll()["events"] == []  # once
    second.close()


def test_a_restarted_syncer_nets_a_cumulative_push_against_what_its_predecessor_merged(tmp_path):
    # Learner 0 pushes fragment 0 from version 0 (seq 0: delta d) and the round merges it; before it
    # adopts version 1 it is asked again and pushes from the same anchor (seq 1: 2d, cumulative).
    # Only d of that is new. By hand, outer lr 1, momentum 0, one contributor: v1 = theta0 - d and
    # v2 = theta0 - 2d, whichever syncer merges seq 1, also one restored from a checkpoint.
    first = worker(tmp_path)
    theta0 = first.syncer.global_fragments()[0]
    push(first, 0, seq=0, base=0)  # d = 1e-3 everywhere
    first.save()  # a checkpoint between the two merges: the history must survive it too
    first.close()

    second = worker(tmp_path)
    second.restore()
    np.testing.assert_allclose(second.syncer.global_fragments()[0], theta0 - 1e-3, atol=1e-7)
    push(second, 0, seq=1, base=0, scale=2)
    np.testing.assert_allclose(second.syncer.global_fragments()[0], theta0 - 2e-3, atol=1e-7)
    assert second.syncer.versions() == [2, 0]
    second.close()


def test_a_syncer_restarted_from_its_journal_alone_nets_it_too(tmp_path):
    first = worker(tmp_path)
    theta0 = first.syncer.global_fragments()[0]
    push(first, 0, seq=0, base=0)
    first.close()  # no checkpoint: the journal is all there is

    second = worker(tmp_path)
    second.restore()
    push(second, 0, seq=1, base=0, scale=2)
    np.testing.assert_allclose(second.syncer.global_fragments()[0], theta0 - 2e-3, atol=1e-7)
    second.close()


def test_a_restarted_syncer_sends_every_live_learner_the_current_fragments(tmp_path):
    first = worker(tmp_path)
    push(first, 0, seq=0, base=0)
    push(first, 0, seq=1, base=1)
    first.close()  # died before anyone may have received version 2

    second = worker(tmp_path, register=False)
    second.restore()
    received = []
    second.register(1, SimpleNamespace(deliver=Direct(received.append)), False)  # as the driver re-registers
    (message,) = received
    assert (message.fragment, message.version, message.base_version) == (0, 2, None)
    np.testing.assert_array_equal(get_codec("none").decode(message.payload), second.syncer.global_fragments()[0])
    second.close()


def send(w, fragment, seq, base, scale=1.0, finite=True):
    """A push as it arrives, its fragment's round not asked for (it waits there, or closes nothing)."""
    delta = np.full(w.syncer.plan.size(fragment), scale * 1e-3 if finite else np.nan, np.float32)
    w.push(Push(0, fragment, base, 4, 400, seq, get_codec("none").encode(delta), sent_at=0.0))
    return w.syncer.drain_events()[-1]


def test_a_restarted_syncer_refuses_every_part_of_a_round_its_predecessor_merged(tmp_path):
    # Seq 0 (anchor v0) makes v1. Before learner 0 adopts v1 it is asked again and pushes from
    # the same anchor (seq 1: cumulative, netted); it adopts v1 and pushes from there (seq 2). Seqs
    # 1 and 2, parts from two anchors, are merged in one round (v2), and the syncer dies before
    # anyone hears of v2: the learner re-sends both. Neither may be merged again.
    first = worker(tmp_path)
    theta0 = first.syncer.global_fragments()[0]
    push(first, 0, seq=0, base=0)
    assert isinstance(send(first, 0, seq=1, base=0, scale=2), events.PushAccepted)
    assert isinstance(send(first, 0, seq=2, base=1), events.PushAccepted)
    first.syncer.flush()
    (closed,) = [e for e in first.syncer.drain_events() if isinstance(e, events.RoundClosed)]
    assert closed.merged == [(0, 1), (0, 2)] and closed.seqs == [2]
    v2 = first.syncer.global_fragments()[0]
    np.testing.assert_allclose(v2, theta0 - 3e-3, atol=1e-7)  # d (seq 0) + d (seq 1 net of 0) + d (seq 2)
    first.close()

    second = worker(tmp_path)
    second.restore()
    for seq, base, scale in ((1, 0, 2), (2, 1, 1)):
        event = send(second, 0, seq=seq, base=base, scale=scale)
        assert isinstance(event, events.PushRejected) and event.reason == "duplicate", event
    assert second.syncer.flush() == 0
    np.testing.assert_array_equal(second.syncer.global_fragments()[0], v2)
    assert second.next_seqs() == {0: 3}  # where a learner resumed after a hard stop numbers from
    second.close()


def test_a_push_still_waiting_when_the_syncer_died_is_taken_by_the_next(tmp_path):
    # Seq 0 (fragment 0) waits in its round; seq 1 (fragment 1) is merged first. Seq 0 was never
    # merged: re-sent to a restarted syncer, it must be taken, though a lower seq than a merged one.
    first = worker(tmp_path)
    assert isinstance(send(first, 0, seq=0, base=0), events.PushAccepted)
    push(first, 1, seq=1, base=0)
    assert first.syncer.versions() == [0, 1]
    first.close()

    second = worker(tmp_path)
    second.restore()
    assert isinstance(send(second, 0, seq=0, base=0), events.PushAccepted)
    assert second.syncer.flush() == 1 and second.syncer.versions() == [1, 1]
    second.close()


def test_a_push_refused_before_a_syncer_restart_stays_refused(tmp_path):
    # A refused push stays in its learner's list of unacknowledged pushes and is re-sent after a
    # syncer restart: the new syncer must not judge it again (a norm-outlier guard starts empty).
    first = worker(tmp_path)
    refused = send(first, 0, seq=0, base=0, finite=False)
    assert isinstance(refused, events.PushRejected) and refused.reason == "nonfinite"
    push(first, 1, seq=1, base=0)  # a round closes after it: its record carries the settled seqs
    first.close()

    second = worker(tmp_path)
    second.restore()
    event = send(second, 0, seq=0, base=0, finite=False)
    assert isinstance(event, events.PushRejected) and event.reason == "duplicate"
    second.close()


def test_a_push_refused_as_the_syncer_dies_stays_refused(tmp_path):
    # No round closes after the refusal: the journal must hold it by itself. A norm outlier is the
    # case that matters: the restarted syncer's guard starts empty and would take it.
    first = worker(tmp_path)
    for seq in range(5):  # five ordinary pushes of fragment 0: the guard knows its norms
        push(first, 0, seq=seq, base=seq)
    outlier = send(first, 0, seq=5, base=5, scale=1000)
    assert isinstance(outlier, events.PushRejected) and outlier.reason == "norm_outlier"
    first.close()

    second = worker(tmp_path)
    second.restore()
    event = send(second, 0, seq=5, base=5, scale=1000)  # the learner re-sends it
    assert isinstance(event, events.PushRejected) and event.reason == "duplicate"
    assert second.syncer.flush() == 0 and second.syncer.versions() == [5, 0]
    assert second.syncer.book.rejections == {"norm_outlier": 1, "duplicate": 1}
    second.close()


def test_a_resume_from_an_older_state_logs_the_rounds_it_makes_again():
    from dlc.engine.syncer.reports import rounds_kept

    # events.jsonl holds fragment 0 up to version 5 and fragment 1 up to 2; the syncer restored
    # from a checkpoint at versions [3, 2] (its journal moved aside): 0's versions 4 and 5 come again.
    # (A line that does not say its round reads as nothing, `events.parse`: none gets this far.)
    logged = {(0, v) for v in range(1, 6)} | {(1, 1), (1, 2), (7, 1)}
    assert rounds_kept(logged, [3, 2]) == {(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)}


def test_a_push_handled_after_the_syncer_stalled_finds_no_learner_silent(tmp_path):
    # Its tick was due 6 s ago and never came (the process did not run): the learners' heartbeats
    # waited unread, so the push handled first after it must not find the learners silent past the
    # timeout (5 s) and stop waiting for them.
    w = worker(tmp_path)
    now = time.monotonic()
    w.syncer.heartbeats = {0: now - 6.0, 1: now - 6.0}
    w._tick_at = now - 6.0
    push(w, 0, seq=0, base=0)
    assert w.error is None and w.syncer.healthy() == {0, 1}
    w.close()
