"""The blocking baselines without Ray: dp's averaged step, the barrier, and the elastic pauses."""

import threading
import time

import jax
import numpy as np
import pytest

from dlc.algo import get_algorithm
from dlc.algo.blocking.learner import DataParallelSync
from dlc.algo.blocking.messages import Contribution
from dlc.algo.blocking.syncer import AdamWStep, BarrierSyncer, OuterStep
from dlc.config.schema import Recipe
from dlc.core.codec import get_codec
from dlc.core.learner import Learner
from dlc.core.model import flatten_params
from dlc.core.steps import make_grad_step, make_optimizer, make_train_step
from dlc.net.transport import Transport
from tests.fakes import Direct, FakeClock

SMALL = {
    "run": {"max_steps": 10},
    "model": {"width": 16, "num_layers": 1, "num_heads": 2, "context_len": 16},
    "learners": {"count": 2, "batch_size": 4, "seq_len": 16},
    "inner": {"warmup_steps": 0, "lr": 1e-3},
    "blocking": {"reconfigure_s": 5.0},
}


def stream(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=20_000, dtype=np.uint8)


def test_dp_average_is_one_step_on_the_concatenated_batch():
    recipe = Recipe.model_validate(SMALL)
    learners = [Learner(recipe, i, stream(i)) for i in range(2)]
    batches = []
    for learner in learners:  # peek at the batch each learner will take
        position = learner.stream.position
        batches.append(learner.stream.next_batch())
        learner.stream.position = position
    initial = flatten_params(learners[0].params)

    syncer_box = {}
    deliver = lambda i, m: syncs[i].receive(m) or m.payload.nbytes  # noqa: E731
    syncer = BarrierSyncer(recipe, initial, deliver, FakeClock(), AdamWStep, "none", "none", "tokens")
    syncer_box["push"] = Direct(syncer.push)
    box, traffic = type("S", (), syncer_box), get_algorithm("dp").traffic(recipe)
    syncs = [DataParallelSync(recipe, learner, Transport(), box, traffic) for learner in learners]
    for i in range(2):
        syncer.join(i)
    syncer.tick()  # admits both and sends them version 0
    stop = threading.Event()
    threads = [threading.Thread(target=sync.step, args=(stop,)) for sync in syncs]
    for t in threads:
        t.start()
    # Tick until both learners have their step back; compiling the gradient step comes first and
    # takes seconds, many more on a loaded machine: the deadline only stops a real hang.
    deadline = time.monotonic() + 240
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        syncer.tick()
        threading.Event().wait(0.005)
    stop.set()
    for t in threads:
        t.join()
    assert syncer.version == 1 and all(sync.version == 1 for sync in syncs)

    # The same step in one process, on both batches at once.
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    reference = Learner(recipe, 0, stream(0))
    _, grads, _ = make_grad_step(reference.graphdef)(reference.params, x, y)
    mean = sum(
        np.float32(0.5) * syncer.codec.decode(get_codec("none").encode(syncs[0].flat(g)))
        for g in [jax.device_get(make_grad_step(reference.graphdef)(reference.params, *b)[1]) for b in batches]
    )
    np.testing.assert_allclose(mean, syncs[0].flat(jax.device_get(grads)), rtol=1e-4, atol=1e-7)
    optimizer = make_optimizer(recipe.inner, recipe.schedule_steps())
    params, _, _ = make_train_step(reference.graphdef, optimizer)(reference.params, reference.opt_state, x, y)
    expected = syncs[0].flat(jax.device_get(params))
    np.testing.assert_allclose(syncer.theta[0], expected, atol=1e-6)
    # Every learner holds the new global model.
    for learner in learners:
        np.testing.assert_array_equal(syncs[0].flat(learner.params), syncer.theta[0])


def make_barrier(members=3):
    recipe = Recipe.model_validate(
        {**SMALL, "learners": {**SMALL["learners"], "count": members}, "syncer": {"codec": "none"}}
    )
    initial = {"w": np.zeros((4, 2), np.float32)}
    clock = FakeClock()
    sent = []
    deliver = lambda i, m: sent.append((i, m.version)) or 0  # noqa: E731
    syncer = BarrierSyncer(recipe, initial, deliver, clock, OuterStep, "none", "none", "tokens_squared_per_step")
    for i in range(members):
        syncer.join(i)
    return syncer, clock, sent


def contribution(learner, version, value=1.0, tokens=64):
    payload = get_codec("none").encode(np.full(8, value, np.float32))
    return Contribution(learner, version, seq=version, steps=1, tokens=tokens, payload=payload, sent_at=0.0)


def contribute(syncer, learners, value=1.0):
    for i in learners:
        syncer.heartbeat(i)
        syncer.push(contribution(i, syncer.version, value))


def test_the_barrier_waits_for_every_member_and_the_job_start_has_no_pause():
    syncer, clock, sent = make_barrier()
    syncer.tick()
    assert syncer.members == {0, 1, 2} and syncer.pauses == 0
    assert sorted(sent) == [(0, 0), (1, 0), (2, 0)]
    contribute(syncer, [0, 1])
    assert syncer.tick() == 0  # learner 2 has not sent: everyone waits
    contribute(syncer, [2], value=4.0)
    assert syncer.tick() == 1 and syncer.version == 1
    np.testing.assert_allclose(syncer.theta[0], -2.0)  # outer lr 1: minus the mean (1 + 1 + 4) / 3
    assert sent[-3:] == [(0, 1), (1, 1), (2, 1)]


def test_silence_counts_from_admission_when_the_job_starts_late():
    # The learners registered, then the job's first tick came long after (the driver was busy
    # starting things): nobody has beaten yet, and nobody is dropped for it.
    syncer, clock, sent = make_barrier(members=2)
    clock.now += 30.0
    syncer.tick()
    assert syncer.members == {0, 1}
    clock.now += 4.9
    syncer.tick()
    assert syncer.members == {0, 1} and syncer.pauses == 0
    clock.now += 0.2  # past heartbeat_timeout_s since the admission: a member that never beat is dropped
    syncer.heartbeat(0)
    syncer.tick()
    assert syncer.members == {0} and syncer.pauses == 1


def test_a_stall_of_the_syncer_itself_drops_nobody():
    # The syncer's process did not run for 6 s (starved): the learners' heartbeats waited unread, and
    # the first tick after it, from the first message handled, must not drop them for that silence.
    syncer, clock, sent = make_barrier(members=2)
    syncer.tick()
    clock.now += 6.0
    syncer.excuse(6.0)
    syncer.tick()
    assert syncer.members == {0, 1} and syncer.pauses == 0
    clock.now += 5.1  # silent past the timeout after the stall: dropped as before
    syncer.tick()
    assert syncer.members == set() and syncer.pauses == 1


def test_a_failure_pauses_once_then_the_survivors_go_on():
    syncer, clock, sent = make_barrier()
    syncer.tick()
    contribute(syncer, [0, 2])
    syncer.leave(1)  # the driver saw learner 1 die
    assert syncer.pauses == 1 and syncer.members == {0, 2}
    clock.now += 4.9
    assert syncer.tick() == 0  # survivors have sent, but the job is reconfiguring
    clock.now += 0.2
    syncer.heartbeat(0), syncer.heartbeat(2)
    assert syncer.tick() == 1 and syncer.pauses == 1
    contribute(syncer, [0, 2])
    assert syncer.tick() == 1 and syncer.pauses == 1  # no further pause without a change


def test_a_return_pauses_once_and_the_newcomer_gets_the_model_after_the_pause():
    syncer, clock, sent = make_barrier()
    syncer.tick()
    syncer.leave(1)
    clock.now += 6.0
    syncer.rejoin(1)  # restarted and state copied: it asks to come back
    contribute(syncer, [0, 2])
    assert syncer.tick() == 1 and syncer.version == 1
    assert syncer.pauses == 2 and syncer.members == {0, 1, 2}
    assert (1, 1) not in sent  # version 1 goes out when the reconfiguration is over
    clock.now += 5.1
    for i in range(3):
        syncer.heartbeat(i)
    syncer.tick()
    assert sorted(m for m, v in sent if v == 1) == [0, 1, 2]
    contribute(syncer, [0, 1, 2])
    assert syncer.tick() == 1 and syncer.pauses == 2


def test_silence_drops_a_member_once_and_changes_during_a_pause_fold_into_it():
    syncer, clock, sent = make_barrier(members=4)
    syncer.tick()
    clock.now += 6.0  # past heartbeat_timeout_s (5 s) for learners 2 and 3
    syncer.heartbeat(0), syncer.heartbeat(1)
    syncer.tick()
    assert syncer.members == {0, 1} and syncer.pauses == 1
    syncer.leave(1)  # during the pause: folded into it
    assert syncer.pauses == 1
    syncer.tick()
    assert syncer.pauses == 1
    kinds = [e.kind for e in syncer.drain_events()]
    assert kinds.count("reconfigure") == 1 and kinds.count("reconfigure_folded") == 1


def test_a_thawed_member_is_readmitted_and_stale_contributions_are_rejected():
    syncer, clock, sent = make_barrier(members=2)
    syncer.tick()
    contribute(syncer, [0])
    clock.now += 6.0
    syncer.heartbeat(0)
    syncer.tick()  # learner 1 froze: dropped, pause
    clock.now += 5.1
    syncer.heartbeat(0)
    assert syncer.tick() == 1  # learner 0 alone closes version 1
    syncer.heartbeat(1)  # thawed
    syncer.push(contribution(1, 0))  # what it computed before it froze
    assert syncer.rejections == {"not_member": 1}
    syncer.tick()
    assert 1 in syncer.joining  # admitted when the current version closes
    contribute(syncer, [0])
    assert syncer.tick() == 1 and syncer.members == {0, 1} and syncer.pauses == 2


@pytest.mark.parametrize("combiner", [AdamWStep, OuterStep])
def test_barrier_checkpoint_state_round_trips(combiner):
    recipe = Recipe.model_validate(SMALL)
    learner = Learner(recipe, 0, stream(0))
    initial = flatten_params(learner.params)
    codec = "none"
    a = BarrierSyncer(recipe, initial, lambda i, m: 0, FakeClock(), combiner, codec, codec, "tokens")
    a.join(0)
    a.tick()
    size = a.theta[0].size
    a.push(Contribution(0, 0, 0, 1, 64, get_codec("none").encode(np.full(size, 0.01, np.float32)), 0.0))
    a.tick()
    tree, meta = a.state()
    b = BarrierSyncer(recipe, initial, lambda i, m: 0, FakeClock(), combiner, codec, codec, "tokens")
    b.load(tree, meta)
    assert b.version == 1
    np.testing.assert_array_equal(b.theta[0], a.theta[0])
    for key, value in a.combiner.state().items():
        np.testing.assert_array_equal(b.combiner.state()[key], value)


def test_bandwidth_prediction_follows_the_algorithm():
    from dlc.plan.bandwidth import recipe_traffic

    base = Recipe.model_validate(SMALL)
    n = recipe_traffic(base)["params"]
    dp = recipe_traffic(base.model_copy(update={"algorithm": "dp"}))
    assert dp["up_bytes_per_step"] == 4 * n and dp["down_bytes_per_step"] == 4 * n
    diloco = recipe_traffic(base.model_copy(update={"algorithm": "diloco"}))
    H = base.syncer.sync_interval_steps
    int4 = get_codec("int4", base.syncer.codec_block_values).encoded_nbytes(n)
    assert diloco["up_bytes_per_step"] == pytest.approx(int4 / H)
    assert diloco["down_bytes_per_step"] == pytest.approx(2 * n / H)  # the model in bf16, the default
    # Differences from the learner's version are the decoupled syncer's: diloco sends values, in bf16.
    int4_down = base.model_copy(
        update={"algorithm": "diloco", "syncer": base.syncer.model_copy(update={"down_codec": "int4"})}
    )
    assert recipe_traffic(int4_down)["down_bytes_per_step"] == pytest.approx(2 * n / H)
    assert recipe_traffic(base.model_copy(update={"algorithm": "none"}))["up_bytes_per_step"] == 0
