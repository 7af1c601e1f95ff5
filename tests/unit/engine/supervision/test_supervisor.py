"""The supervisor's goodput filing, without Ray: time a training learner's loop stood still is not
filed as productive."""

from __future__ import annotations

import json

import pytest
from ray import exceptions as ray_exceptions

from dlc.config.load import load_recipe
from dlc.engine.supervision import recovery
from dlc.engine.supervision import supervisor as supervisor_module
from dlc.engine.supervision.slots import LearnerSlot
from dlc.engine.supervision.supervisor import Supervisor
from dlc.engine.syncer.reports import SyncerReports
from dlc.run import events
from dlc.run.rundir import RunDir
from tests.helpers import TINY


@pytest.fixture
def rundir(tmp_path):
    opened = RunDir(tmp_path, recipe_text="")
    yield opened
    opened.close()


def test_blocked_time_of_a_training_learner_is_filed_as_waiting_and_checkpoint(rundir, monkeypatch):
    now = [100.0]
    sup = Supervisor(load_recipe(TINY), rundir, syncer=None, make_learner=None, join_streams=[], clock=lambda: now[0])
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


def test_progress_an_adoption_discarded_is_filed_as_wasted(rundir, monkeypatch):
    """A learner that replaced fragments it had trained on since its push reports the steps thrown away
    (in whole-model steps); the ledger moves them, at its step time, from productive to wasted, once."""
    now = [100.0]
    fake_ray(monkeypatch)
    sup = Supervisor(load_recipe(TINY), rundir, syncer=None, make_learner=None, join_streams=[], clock=lambda: now[0])
    view = {"state": "training", "tokens_per_s": 1000.0, "tokens_per_step": 100}  # 0.1 s a step
    snapshot = {**view, "discarded_steps": 2.5}
    answer = Ref({"snapshot": snapshot, "events": [], "metrics": [], "error": None})
    sup.slots[0] = LearnerSlot(handle=Actor("learner 0", poll=answer), stream=None, view=dict(view), ticked_at=100.0)
    now[0] = 110.0
    sup.file_time()
    for _ in range(2):  # the same cumulative count twice: filed once
        sup._poll(lambda i, result: None, now[0])
    row = sup.ledger.summary()["learners"]["0"]
    assert (row["productive"], row["wasted"]) == pytest.approx((9.75, 0.25))


# -- recoveries, with the actors and Ray's calls faked -------------------------------------------


class Ref:
    """An object reference: answered with a value, or with an error (its actor died)."""

    def __init__(self, value=None, error=None, done=True):
        self.value, self.error, self.done = value, error, done


class FakeRay:
    exceptions = ray_exceptions

    def __init__(self):
        self.killed = []

    def wait(self, refs, timeout=None, num_returns=1):
        return [r for r in refs if r.done], [r for r in refs if not r.done]

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor, no_restart=True):
        self.killed.append(actor)


def fake_ray(monkeypatch):
    """Ray's calls faked where the supervisor and its recoveries make them."""
    fake = FakeRay()
    monkeypatch.setattr(supervisor_module, "ray", fake)
    monkeypatch.setattr(recovery, "ray", fake)
    return fake


PID = 4242


def answered(name, args, actor_name):
    """What a learner's process answers unless a test says otherwise, shaped as the real one's answer
    (the supervisor writes it into its events): its pid once up, where a state copy left it."""
    if name in ("ready", "take_slot"):
        return PID
    if name == "import_state":  # (state, data_position)
        return {"peer": 0, "step": 50, "data_position": args[1], "copy_s": 0.5}
    if name == "import_global":  # (global state, data_position, step)
        return {"peer": None, "step": args[2], "data_position": args[1]}
    return actor_name


class Method:
    def __init__(self, actor, name):
        self.actor, self.name = actor, name

    def remote(self, *args):
        self.actor.calls.append((self.name, args))
        answer = self.actor.answers.get(self.name, Ref(answered(self.name, args, self.actor.name)))
        return answer() if callable(answer) else answer


class Actor:
    """A learner (or syncer) process: every call is recorded and answered as `answers` says."""

    def __init__(self, name, **answers):
        self.name, self.answers, self.calls = name, answers, []

    def __getattr__(self, method):
        return Method(self, method)

    def called(self, method):
        return [args for name, args in self.calls if name == method]


def recovering(rundir, monkeypatch, syncer, new_actor, peer_state="training"):
    """Learner 1 died at step 40, data position 37; learner 0 is its peer (or not healthy)."""
    fake = fake_ray(monkeypatch)
    made = []

    def make_learner(i, stream, incarnation):
        made.append((i, incarnation))
        return new_actor.pop(0) if isinstance(new_actor, list) else new_actor

    rundir.begin()
    sup = Supervisor(load_recipe(TINY), rundir, syncer=syncer, make_learner=make_learner, join_streams=[])
    sup.slots[0] = LearnerSlot(handle=Actor("peer"), stream=None, view={"state": peer_state, "step": 50})
    sup.slots[1] = LearnerSlot(handle=None, stream="s1", view={"state": "training", "step": 40, "data_position": 37})
    sup._on_death(1)
    return sup, fake, made


def test_after_a_busy_driver_every_view_is_fresh_before_the_next_chaos_request(rundir, monkeypatch):
    """The driver restarted the syncer for 20 s: a learner's poll answered at its start is that old.
    Killed on the next tick, the learner would come back at that old data position; catch_up takes
    the stale answer and a fresh one first."""
    fake_ray(monkeypatch)
    sup = Supervisor(load_recipe(TINY), rundir, syncer=None, make_learner=None, join_streams=[])
    answers = iter([75, 190])

    def poll():
        position = next(answers)
        view = {"state": "training", "step": position, "data_position": position}
        return Ref({"snapshot": view, "events": [], "metrics": [], "error": None})

    sup.slots[0] = slot = LearnerSlot(handle=Actor("learner 0", poll=poll), stream=None, view={"state": "training"})
    slot.poll = poll()  # asked before the driver got busy
    sup.catch_up(lambda i, result: None)
    assert slot.view["data_position"] == 190


def written(rundir):
    return [json.loads(line) for line in (rundir.path / "events.jsonl").read_text().splitlines()]


def accepted(learner, fragment=0, seq=0, version=0):
    """The syncer's record of a push it took."""
    return events.PushAccepted(
        learner=learner, fragment=fragment, seq=seq, base_version=version, version=version, bytes=8, steps=4
    )


def test_a_recovery_waits_out_a_syncer_that_died_while_the_learner_registered(rundir, monkeypatch):
    dead = Actor("syncer", rejoin=Ref(error=ray_exceptions.RayActorError()))
    learner = Actor("new")
    sup, _, _ = recovering(rundir, monkeypatch, dead, learner)
    sup._advance_recoveries()  # process up: copies its peer
    sup._advance_recoveries()  # copied: registers with the syncer, which is dead
    sup._advance_recoveries()  # no traceback: it asks again (the driver has not noticed yet)
    assert sup.slots[1].recovery.phase == "registering" and not learner.called("start")
    sup.syncer = alive = Actor("syncer2")  # the driver restarted the syncer
    sup._advance_recoveries()
    sup._advance_recoveries()
    assert alive.called("rejoin") == [(1, learner)]
    assert learner.called("set_syncer") == [(alive,)] and learner.called("start") == [(None, None)]
    assert sup.slots[1].recovery is None and sup.slots[1].handle is learner
    assert [e["kind"] for e in written(rundir)].count("learner_rejoined") == 1


def test_a_peer_that_dies_mid_copy_costs_a_second_copy_not_a_second_process(rundir, monkeypatch):
    learner = Actor("new", import_state=Ref(error=ray_exceptions.RayActorError()))
    sup, fake, made = recovering(rundir, monkeypatch, Actor("syncer"), learner)
    sup._advance_recoveries()  # process up: copies learner 0
    assert learner.called("import_state")
    sup.slots[0].view["state"] = "dead"  # the peer died while it was copied
    sup._advance_recoveries()  # the copy failed; the new process still answers: copy again
    assert made == [(1, 1)] and fake.killed == []
    # No healthy peer left: the global model, at its previous process's step and data position.
    ((_, position, step),) = learner.called("import_global")
    assert (position, step) == (37, 40)
    assert [e["kind"] for e in written(rundir)].count("state_copy_retried") == 1


def test_with_no_healthy_peer_a_new_process_rejoins_from_the_global_model(rundir, monkeypatch):
    learner = Actor("new")
    sup, _, _ = recovering(rundir, monkeypatch, Actor("syncer"), learner, peer_state="dead")
    sup._advance_recoveries()  # process up: no healthy peer to copy
    sup._advance_recoveries()  # it took the global model, at its previous process's place
    assert learner.called("import_global") and not learner.called("import_state")
    (rejoined,) = [e for e in written(rundir) if e["kind"] == "learner_rejoined"]
    assert (rejoined["peer"], rejoined["step"], rejoined["data_position"], rejoined["copy_s"]) == (None, 40, 37, None)


def test_a_peer_that_trains_but_was_not_heard_from_lately_is_waited_for_not_skipped(rundir, monkeypatch):
    """Cores busy with new processes starting delay a training peer's answers: the copy waits for it
    rather than taking the global model (fresh AdamW state), until it answers or is found stalled."""
    now = [100.0]
    learner = Actor("new")
    sup, _, _ = recovering(rundir, monkeypatch, Actor("syncer"), learner)
    sup.clock = lambda: now[0]
    sup.slots[0].last_seen = 97.0  # last answered 3 s ago: under the 5 s heartbeat timeout, not stalled
    sup._advance_recoveries()  # process up: its only peer trains but has not answered lately
    sup._advance_recoveries()
    assert sup.slots[1].recovery.phase == "awaiting peer" and sup.state_of(1) == "rejoining"
    assert sup.slots[1].view["phase"] == "waiting for learner 0 to answer"
    assert not learner.called("import_state") and not learner.called("import_global")
    sup.slots[0].last_seen = 100.0  # it answered
    sup._advance_recoveries()
    assert learner.called("import_state") and not learner.called("import_global")
    sup._advance_recoveries()
    (rejoined,) = [e for e in written(rundir) if e["kind"] == "learner_rejoined"]
    assert rejoined["peer"] == 0


def test_a_peer_waited_for_that_is_found_stalled_gives_way_to_the_global_model(rundir, monkeypatch):
    now = [100.0]
    learner = Actor("new")
    sup, _, _ = recovering(rundir, monkeypatch, Actor("syncer"), learner)
    sup.clock = lambda: now[0]
    sup.slots[0].last_seen = 97.0
    sup._advance_recoveries()
    assert sup.slots[1].recovery.phase == "awaiting peer"
    sup.slots[0].override = "stalled"  # its silence reached the heartbeat timeout
    sup._advance_recoveries()
    assert learner.called("import_global") and not learner.called("import_state")


def test_a_process_that_fails_its_recovery_is_killed_before_another_starts(rundir, monkeypatch):
    failing = Actor("first", import_state=Ref(error=ray_exceptions.RayActorError()))
    second = Actor("second")
    sup, fake, made = recovering(rundir, monkeypatch, Actor("syncer"), [failing, second])
    sup._advance_recoveries()  # it comes up and copies its peer...
    failing.answers["ready"] = Ref(error=ray_exceptions.RayActorError())  # ...and dies while copying
    sup._advance_recoveries()
    assert fake.killed == [failing] and made == [(1, 1), (1, 1)]
    assert sup.slots[1].recovery.actor is second and sup.slots[1].recovery.step == 40


def test_a_death_and_the_recovery_are_said_on_the_console(rundir, monkeypatch):
    fake_ray(monkeypatch)
    said: list[str] = []
    rundir.begin()
    sup = Supervisor(load_recipe(TINY), rundir, Actor("syncer"), lambda i, s, n: Actor("new"), [], say=said.append)
    sup.slots[1] = LearnerSlot(handle=None, stream="s1", view={"state": "training", "step": 40, "data_position": 37})
    sup._on_death(1)
    assert said == ["learner 1 died at step 40"]
    sup.slots[1].awaiting_first_push = sup.wall() - 3.0
    sup.note_syncer_events([accepted(1)])
    assert said[1].startswith("learner 1 back: pushing again 3.0") and said[1].endswith("s after it died")
    assert [e["kind"] for e in written(rundir)][-2:] == ["learner_died", "learner_recovered"]


def test_a_console_line_whose_figure_is_unknown_reads_a_question_mark(rundir):
    said: list[str] = []
    rundir.begin()
    sup = Supervisor(load_recipe(TINY), rundir, syncer=None, make_learner=None, join_streams=[], say=said.append)
    # A notice that did not say how long the leaving took: a number format, no number.
    notice = {"reason": "SIGTERM", "fragments": None, "leave_s": None, "unpushed_steps": 0.0, "pid": None}
    sup._event(events.LearnerPreempted(learner=2, step=40, data_position=37, **notice))
    sup._event(events.LearnerDied(learner=3, step=None, data_position=0, pid=None))
    assert said == [
        "learner 2 preempted (SIGTERM): pushed ? fragments and left ? s after its notice; "
        "a new process takes its place",
        "learner 3 died at step ?",
    ]
    assert [e["kind"] for e in written(rundir)][-2:] == ["learner_preempted", "learner_died"]


def test_a_syncer_restart_says_which_acceptances_died_with_it_before_the_learners_re_send(rundir, monkeypatch):
    fake_ray(monkeypatch)
    rundir.begin()
    reports = SyncerReports(rundir, resume=False)
    learner = Actor("learner", set_syncer=Ref(1))  # it re-sends one unacknowledged push
    sup = Supervisor(load_recipe(TINY), rundir, Actor("syncer"), make_learner=None, join_streams=[])
    sup.slots[0] = LearnerSlot(handle=learner, stream=None, view={"state": "training"})
    closed = events.RoundClosed(
        fragment=0, version=1, contributors=[0], weights=[1.0], tokens=[4], seqs=[3], merged=[(0, 3)]
    )
    heard = [accepted(0, fragment=0, seq=3), closed, accepted(0, fragment=1, seq=4)]
    reports.absorb({"events": heard, "status": {}, "error": None}, sup)
    new = Actor("syncer2", restore=Ref({"journal_rounds": 1, "versions": [1, 0], "rounds_closed": 1}))
    syncer, said = sup.restart_syncer(lambda: new, reports)
    assert syncer is new and learner.called("set_syncer") == [(new,)]
    assert said.endswith("learners re-sent 1 unacknowledged pushes")
    tail = [e for e in written(rundir) if e["kind"] != "chaos"][3:]
    assert [(e["kind"], e.get("seq")) for e in tail] == [
        ("syncer_died", None),
        ("push_lost", 4),
        ("syncer_restarted", None),
    ]
    assert tail[1]["reason"] == "syncer_died" and tail[2]["versions"] == [1, 0]


def test_a_learner_that_left_on_its_notice_is_replaced_and_nothing_it_trained_is_wasted(rundir, monkeypatch):
    """Learner 1 got a preemption notice, pushed its progress and reports `preempted`: its process is
    ended and a new one goes on from its data position; its time until then is the preemption's."""
    fake = fake_ray(monkeypatch)
    said: list[str] = []
    now = [100.0]
    rundir.begin()
    new = Actor("new")
    sup = Supervisor(
        load_recipe(TINY), rundir, Actor("syncer"), lambda i, s, n: new, [], say=said.append, clock=lambda: now[0]
    )
    notice = {"reason": "SIGTERM", "at": 1.0, "deadline": None, "fragments": 24, "leave_s": 1.25}
    view = {"state": "preempted", "step": 40, "data_position": 37, "unpushed_steps": 0.0, "notice": notice,
            "tokens": 4096, "tokens_per_s": 1000.0, "tokens_per_step": 1024}  # fmt: skip
    old = Actor("old", poll=Ref({"snapshot": view, "events": [], "metrics": [], "error": None}))
    sup.slots[1] = LearnerSlot(handle=old, stream="s1", view={"state": "leaving"}, ticked_at=now[0])
    sup._poll(lambda i, result: None, now[0])
    assert fake.killed == [old] and sup.slots[1].override == "restarting" and sup.slots[1].death_fault == "preempt"
    (preempted,) = [e for e in written(rundir) if e["kind"] == "learner_preempted"]
    assert preempted | {"t": 0} == {"t": 0, "kind": "learner_preempted", "learner": 1, "step": 40, "pid": None,
                                    "reason": "SIGTERM", "fragments": 24, "leave_s": 1.25, "unpushed_steps": 0.0,
                                    "data_position": 37}  # fmt: skip
    assert said == ["learner 1 preempted (SIGTERM): pushed 24 fragments and left 1.2 s after its notice; "
                    "a new process takes its place"]  # fmt: skip
    now[0] += 4.0
    sup.file_time()
    row = sup.ledger.summary()["learners"]["1"]
    assert (row["wasted"], row["dead"], row["preempted"]) == (0.0, 0.0, pytest.approx(4.0))
    sup._advance_recoveries()  # the new process is up: it copies the global model (no healthy peer)
    ((_, position, step),) = new.called("import_global")
    assert (position, step) == (37, 40) and sup.restarts[1] == 1 and sup.dead_tokens[1] == 4096
    sup.slots[1].awaiting_first_push = sup.wall() - 2.0
    sup.note_syncer_events([accepted(1)])
    assert said[-1].startswith("learner 1 back: pushing again 2.0") and said[-1].endswith("after it left on its notice")


def test_learners_on_a_draining_node_get_a_notice_once(rundir, monkeypatch):
    fake_ray(monkeypatch)
    rundir.begin()
    sup = Supervisor(load_recipe(TINY), rundir, Actor("syncer"), None, [])
    for i, node in enumerate(["n1", "n2", "n2"]):
        view = {"state": "training", "node_id": node, "node": f"10.0.0.{node[1]}"}
        sup.slots[i] = LearnerSlot(handle=Actor(f"l{i}"), stream=None, view=view)
    sup.notice_draining({"n2": 2000.0, "n9": None})
    sup.notice_draining({"n2": 2000.0})
    assert [sup.slots[i].handle.called("give_notice") for i in range(3)] == [
        [],
        [("node draining", 2000.0)],
        [("node draining", 2000.0)],
    ]
    (draining,) = [e for e in written(rundir) if e["kind"] == "node_draining"]
    assert (draining["node_id"], draining["node"], draining["learners"]) == ("n2", "10.0.0.2", [1, 2])
