"""The driver's log of the syncer, without Ray: what a syncer's death or a stop loses is said once, and
every reader of events.jsonl then counts each push and each round once."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from dlc.algo.decoupled.messages import Push
from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.engine.supervision.supervisor import Supervisor
from dlc.engine.syncer.actor import SyncerWorker
from dlc.engine.syncer.reports import Accepted, SyncerReports, lost_pushes
from dlc.observe.reader import voided
from dlc.run import events
from dlc.run.rundir import RunDir
from tests.fakes import Direct
from tests.helpers import IN_PROCESS, TINY, marked_storage


@pytest.fixture
def rundir(tmp_path):
    opened = RunDir(tmp_path / "run", recipe_text="")
    opened.path.mkdir()
    yield opened
    opened.close()


def logged(rundir):
    return [json.loads(line) for line in (rundir.path / "events.jsonl").read_text().splitlines()]


def net(lines):
    """What a reader counts: acceptances (learner, fragment, seq) and merges, less what was lost."""
    records = events.parse_all(lines)
    void = voided(records)
    kept = [e for i, e in enumerate(records) if i not in void]
    accepted = Counter((e.learner, e.fragment, e.seq) for e in kept if isinstance(e, events.PushAccepted))
    merged = Counter(
        (who, e.fragment, seq) for e in kept if isinstance(e, events.RoundClosed) for who, seq in e.merged or []
    )
    return accepted, merged


# -- across a syncer's death, with the real syncer worker --------------------------------------


def worker(run_dir):
    # Two fragments, quorum 1, no compression; fake learner handles take the deliveries.
    overrides = ["learners.count=2", "syncer.quorum=1", "syncer.codec=none", "syncer.fragments=2", "syncer.channel=ray"]
    recipe = load_recipe(TINY, [*IN_PROCESS, *overrides, "syncer.merge=mean", "syncer.down_codec=none"])
    w = SyncerWorker(recipe.model_dump(mode="json"), str(run_dir), marked_storage(run_dir))
    for i in range(2):
        w.register(i, SimpleNamespace(deliver=Direct(lambda message: None)))
    return w


def push(w, fragment, seq, base, asked=False):
    """Learner 0's push; `asked`: its fragment's round is open, so with K = 1 the push closes it."""
    if asked:
        w.syncer.open_round(fragment)
    delta = np.full(w.syncer.plan.size(fragment), 1e-3, np.float32)
    w.push(Push(0, fragment, base, 4, 400, seq, get_codec("none").encode(delta), sent_at=0.0))


def test_a_push_accepted_into_a_round_that_died_with_the_syncer_is_lost_once_and_counts_once(rundir, tmp_path):
    reports = SyncerReports(rundir, resume=False)
    rundir.begin()
    sup = Supervisor(load_recipe(TINY), rundir, syncer=None, make_learner=None, join_streams=[])
    first = worker(tmp_path / "syncer")
    push(first, 0, seq=0, base=0, asked=True)  # fragment 0's round 1: merged
    push(first, 1, seq=1, base=0)  # waits in fragment 1's round
    push(first, 0, seq=2, base=1)  # waits in fragment 0's round 2
    reports.absorb(first.poll(), sup)  # the driver logged all three acceptances
    push(first, 1, seq=3, base=0, asked=True)  # closes fragment 1's round 1 with seq 1: journaled, never reported
    first.close()  # the syncer dies: seq 2 dies with it; seq 1 is in a round its journal kept

    second = worker(tmp_path / "syncer")
    restored = second.restore()
    assert restored["versions"] == [1, 1]
    reports.restored(restored["versions"], reason="syncer_died")
    push(second, 0, seq=2, base=1)  # the learner re-sends what was never acknowledged: taken again ...
    push(second, 1, seq=3, base=0)  # ... or refused, merged already
    reports.absorb(second.poll(), sup)
    second.syncer.flush()
    reports.absorb(second.poll(), sup)

    lines = logged(rundir)
    kinds = [e["kind"] for e in lines]
    assert kinds == [
        *["push_accepted", "round_closed", "push_accepted", "push_accepted"],
        "push_lost",  # before the push is accepted again
        *["round_closed", "push_accepted", "push_rejected"],  # the dead syncer's round 1 of fragment 1, replayed
        "round_closed",
    ]
    lost = lines[4]
    assert {k: lost[k] for k in ("learner", "fragment", "seq", "version", "reason")} == {
        "learner": 0,
        "fragment": 0,
        "seq": 2,
        "version": 1,
        "reason": "syncer_died",
    }
    assert lost["bytes"] == lines[3]["bytes"] == 4 * second.syncer.plan.size(0)
    # Net of the loss, every push was accepted once and merged once (seq 3's acceptance never reached
    # the driver: the round that merged it was reported by the restored syncer).
    accepted, merged = net(lines)
    assert accepted == Counter({(0, 0, 0): 1, (0, 1, 1): 1, (0, 0, 2): 1})
    assert merged == Counter({(0, 0, 0): 1, (0, 1, 1): 1, (0, 1, 3): 1, (0, 0, 2): 1})
    # The syncer's own count agrees: what the restored one holds, plus what it accepted since.
    assert second.syncer.status()["pushes_accepted"] == 4 == sum(accepted.values()) + 1
    second.close()


# -- at a resume, from events.jsonl ----------------------------------------------------------------


def accepted(learner, fragment, seq, version):
    """An earlier run's line, a whole record as the engine writes it (so are the next two)."""
    push = events.PushAccepted(
        learner=learner, fragment=fragment, seq=seq, base_version=version, version=version, bytes=8, steps=4
    )
    return push.record()


def closed(fragment, version, learner, seq):
    """The round `version` of `fragment`, which merged the push `seq` of `learner` alone."""
    return events.RoundClosed(
        fragment=fragment,
        version=version,
        contributors=[learner],
        weights=[1.0],
        tokens=[400],
        seqs=[seq],
        merged=[(learner, seq)],
    ).record()


def push_lost(learner, fragment, seq, version, reason):
    lost = events.PushLost(learner=learner, fragment=fragment, seq=seq, version=version, bytes=8, reason=reason)
    return lost.record()


EARLIER_RUN = [
    accepted(0, 0, 0, 0),
    closed(0, 1, 0, 0),
    accepted(0, 0, 1, 1),
    closed(0, 2, 0, 1),
    accepted(1, 1, 5, 0),  # waiting in fragment 1's round when the run stopped
    accepted(1, 1, 6, 0),  # lost at an earlier syncer death: not lost twice
    push_lost(1, 1, 6, 0, "syncer_died"),
    accepted(0, 0, 2, 2),  # waiting in fragment 0's round 3
    {"kind": "push_accepted", "learner": 0, "seq": 9},  # a line that does not say its round (damaged, or older)
]


def resumed(rundir, versions):
    with open(rundir.path / "events.jsonl", "w") as f:
        f.writelines(json.dumps({"t": 1.0, **e}) + "\n" for e in EARLIER_RUN)
    reports = SyncerReports(rundir, resume=True)
    rundir.begin()
    reports.restored(versions)
    return logged(rundir)[len(EARLIER_RUN) :]


def test_a_resume_loses_the_pushes_waiting_in_open_rounds_when_the_run_stopped(rundir):
    new = resumed(rundir, [2, 0])  # the syncer's journal held every round logged
    assert [(e["kind"], e["seq"], e["reason"]) for e in new] == [
        ("push_lost", 5, "run_stopped"),
        ("push_lost", 2, "run_stopped"),
    ]


def test_a_resume_from_an_older_state_loses_the_rounds_after_it_and_their_pushes(rundir):
    new = resumed(rundir, [1, 0])  # its journal moved aside: fragment 0 back at version 1
    assert [(e["kind"], e.get("seq"), e.get("version"), e["reason"]) for e in new] == [
        ("round_lost", None, 2, "run_stopped"),
        ("push_lost", 1, 1, "round_lost"),
        ("push_lost", 5, 0, "run_stopped"),
        ("push_lost", 2, 2, "run_stopped"),
    ]
    accepted, merged = net(logged(rundir))
    assert merged == Counter({(0, 0, 0): 1})
    # The line that does not say its round reads as nothing (events.parse): neither lost nor counted.
    assert accepted == Counter({(0, 0, 0): 1})


def test_lost_pushes_by_hand():
    # A push accepted at version v is merged in round v + 1: held by a syncer at v + 1 or later.
    pushes = [Accepted(0, 0, seq=1, version=3, bytes=8), Accepted(0, 1, seq=2, version=0, bytes=8)]
    assert lost_pushes(pushes, [4, 1]) == []
    assert lost_pushes(pushes, [3, 1]) == pushes[:1]
    assert lost_pushes(pushes, [4]) == pushes[1:]  # fragment 1 restored nothing
    assert lost_pushes(pushes, []) == pushes
