"""A learner on several devices (learners.devices, learners.mesh): in a process of 2 host devices.

XLA's host device count is read as JAX starts, so the learners run in a fresh interpreter; it
prints what it measured as JSON, and the tests check it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dlc.config.load import load_recipe
from dlc.errors import UserError
from tests.helpers import REPO, TINY

# One xdist worker takes the module (tests/conftest.py): its fixture's program (about a minute) then
# runs once, not once a worker.
XDIST_GROUP = "sharding"

PROGRAM = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    import jax, numpy as np
    from dlc.config.load import load_recipe
    from dlc.core.fragment_ops import FragmentOps
    from dlc.core.learner import Learner
    from dlc.data.plan import plan_data
    from dlc.plan.memory import fragment_plan
    from dlc.run.checkpoint import Checkpointer
    from tests.helpers import TINY

    COMMON = ["learners.count=1", "model.arch=llama", "model.num_kv_heads=2", "learners.batch_size=8"]
    out = {"devices": len(jax.devices())}

    def learner(*overrides):
        recipe = load_recipe(TINY, [*COMMON, *overrides])
        return recipe, Learner(recipe, 0, plan_data(recipe).streams[0])

    def leaves(x):
        return [np.asarray(v) for v in jax.tree_util.tree_leaves(x.params)]

    def same(a, b):
        return max(float(np.abs(u - v).max()) for u, v in zip(leaves(a), leaves(b)))

    def sharded(x):
        return sorted({str(v.sharding.spec) for v in jax.tree_util.tree_leaves(x.params)})

    one = learner()[1]
    for name, extra in (("fsdp", ["learners.devices=2"]), ("data", ["learners.devices=2", "learners.mesh={data: 2}"])):
        other = learner(*extra)[1]
        one.load_state(jax.device_get(other.state_tree()), other.state_meta())  # the same start
        one.train_step(); other.train_step()
        losses = [one.flush().loss, other.flush().loss]
        out[name] = {"loss": losses, "specs": sharded(other), "params": same(one, other)}

    recipe, two = learner("learners.devices=2")
    first = None
    for _ in range(25):
        two.train_step()
        record = two.flush()
        first = first or record.loss
    out["trains"] = [first, record.loss]

    # A checkpoint of the 2-device learner restored onto 1 device, and one of 1 device onto 2.
    with tempfile.TemporaryDirectory() as tmp:
        store = Checkpointer(Path(tmp) / "two", keep=1)
        store.save(1, two.state_tree(), two.state_meta())
        tree, meta = store.restore(one.state_tree())
        one.load_state(tree, meta)
        out["restored_on_one"] = same(one, two)
        one.train_step(); one.flush()
        store = Checkpointer(Path(tmp) / "one", keep=1)
        store.save(1, one.state_tree(), one.state_meta())
        tree, meta = store.restore(two.state_tree())
        two.load_state(tree, meta)
        out["restored_on_two"] = [same(one, two), sharded(two)]

    # A peer copy each way: the state as the host holds it.
    fresh = learner("learners.devices=2")[1]
    fresh.load_state(jax.device_get(one.state_tree()), one.state_meta())
    out["copied_to_two"] = [same(one, fresh), sharded(fresh)]

    # Fragments read from and written into sharded parameters, as on one device.
    plan = fragment_plan(load_recipe(TINY, [*COMMON, "learners.devices=2", "syncer.fragments=6"]))
    ops_one = FragmentOps(plan, one.params, "int4", 64, placement=one.placement)
    ops_two = FragmentOps(plan, fresh.params, "int4", 64, placement=fresh.placement)
    worst = 0.0
    for p in range(plan.num_fragments):
        a = ops_one.push(one.params, p, ops_one.put(np.zeros(ops_one.M, np.float32)))
        b = ops_two.push(fresh.params, p, ops_two.put(np.zeros(ops_two.M, np.float32)))
        for x, y in zip(a, b):
            worst = max(worst, float(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32)).max()))
        value = np.random.default_rng(p).standard_normal(plan.size(p)).astype(np.float32)
        one.params = ops_one.write(one.params, p, ops_one.to_device(p, value))
        fresh.params = ops_two.write(fresh.params, p, ops_two.to_device(p, value))
    out["fragments"] = [worst, same(one, fresh), sharded(fresh)]
    fresh.train_step(); fresh.flush()  # the step takes the written parameters as they are laid out
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def measured():
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    run = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, cwd=REPO, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_step_on_two_devices_is_the_step_on_one(measured):
    assert measured["devices"] == 2
    for mesh in ("fsdp", "data"):
        one, two = measured[mesh]["loss"]
        assert abs(one - two) < 1e-5 and measured[mesh]["params"] < 1e-5
    # fsdp: every parameter split along an axis; data: whole on each device.
    assert "P('fsdp',)" in measured["fsdp"]["specs"] and measured["data"]["specs"] == ["P()"]


def test_a_two_device_learner_trains(measured):
    first, last = measured["trains"]
    assert last < first - 1.0


def test_checkpoints_and_copies_move_between_one_and_two_devices(measured):
    assert measured["restored_on_one"] == 0.0
    difference, specs = measured["restored_on_two"]
    assert difference == 0.0 and "P('fsdp',)" in specs
    difference, specs = measured["copied_to_two"]
    assert difference == 0.0 and "P('fsdp',)" in specs


def test_fragments_of_sharded_parameters_are_read_and_written_as_on_one_device(measured):
    encoded, written, specs = measured["fragments"]
    assert encoded == 0.0 and written == 0.0 and "P('fsdp',)" in specs


BAD = [
    (["learners.devices=2", "learners.batch_size=15"], "batch_size=15 does not split over devices=2"),
    (["learners.devices=2", "learners.mesh={data: 2, fsdp: 2}"], "data=2 x fsdp=2 is 4 devices but devices=2"),
    (["learners.num_gpus=2"], "num_gpus=2 but devices=1"),
    (["learners.num_gpus=1.5"], "a share of one GPU or whole GPUs"),
    (["learners.devices=2", "learners.num_gpus=1"], "devices=2 on GPUs needs num_gpus=2"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD)
def test_meshes_that_cannot_be_are_refused(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        load_recipe(TINY, overrides)
