"""Where each process runs: the environment and Ray options a learner, spare, syncer and evaluator get for
a recipe, and the refusal of recipes that reserve GPUs a cluster does not have. No Ray, no GPU needed."""

from __future__ import annotations

import pytest

from dlc.config.job import ClusterConfig
from dlc.config.load import load_recipe
from dlc.engine.devices import (
    check_resources,
    embedded_env,
    evaluator_setup,
    gpu_demand,
    inherited_env,
    isolate_driver,
    learner_setup,
    process_env,
    same_setup,
    syncer_setup,
)
from dlc.errors import UserError
from tests.helpers import REPO, TINY

GPU = REPO / "recipes" / "gpu.yaml"
MIXED = REPO / "recipes" / "mixed.yaml"
NO_USER_ENV: dict[str, str] = {}


def test_cpu_learners_syncer_and_evaluator_never_see_a_gpu():
    recipe = load_recipe(TINY)
    for placement in (
        learner_setup(recipe, 0, NO_USER_ENV),
        learner_setup(recipe, None, NO_USER_ENV),  # a hot spare
        syncer_setup(recipe),
        evaluator_setup(recipe, NO_USER_ENV),
    ):
        assert placement.platform == "cpu" and placement.env["JAX_PLATFORMS"] == "cpu"
        assert "num_gpus" not in placement.ray_options() and "accelerator_type" not in placement.ray_options()
    assert learner_setup(recipe, 0, NO_USER_ENV).ray_options() == {
        "num_cpus": 1.0,
        "runtime_env": {"env_vars": {"JAX_PLATFORMS": "cpu", "MALLOC_ARENA_MAX": "1"}},
    }
    assert evaluator_setup(recipe, NO_USER_ENV).ray_options()["num_cpus"] == 0.0


def test_gpu_recipe_shares_one_gpu_and_its_memory_among_four_learners_and_the_evaluator():
    recipe = load_recipe(GPU)
    learners = [learner_setup(recipe, i, NO_USER_ENV) for i in range(4)]
    evaluator = evaluator_setup(recipe, NO_USER_ENV)
    # 0.24 x 0.9 = 0.216 of the GPU's memory per learner, 0.04 x 0.9 = 0.036 for the evaluator.
    gpu = {"JAX_PLATFORMS": "", "MALLOC_ARENA_MAX": "1"}
    assert all(p.env == {**gpu, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.216"} for p in learners)
    assert evaluator.env == {**gpu, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.036"}
    # Together 4 x 0.216 + 0.036 = 0.9 of the GPU: JAX's own default (0.75 each) would not fit twice.
    fractions = [float(p.env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) for p in [*learners, evaluator]]
    assert sum(fractions) == pytest.approx(0.9)
    assert learners[0].ray_options() == {
        "num_cpus": 1.0,
        "num_gpus": 0.24,
        "runtime_env": {"env_vars": {**gpu, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.216"}},
    }
    assert syncer_setup(recipe).env == {"JAX_PLATFORMS": "cpu"}  # merges NumPy arrays
    assert gpu_demand(recipe) == {None: pytest.approx(1.0)}


def test_memory_settings_made_by_hand_win_on_gpu_processes_only():
    # No preallocation, by hand: JAX grows its pool on demand, still capped at the share (0.25 x 0.9).
    by_hand = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PATH": "/bin"}
    assert process_env(0.25, by_hand) == {
        "JAX_PLATFORMS": "",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.225",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }
    assert process_env(0.25, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert process_env(0.0, by_hand) == {"JAX_PLATFORMS": "cpu"}
    # A whole GPU: 90% of it (JAX's default is 75%).
    assert process_env(1.0, {}) == {"JAX_PLATFORMS": "", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}


def test_mixed_recipe_puts_learner_0_on_the_gpu_and_the_others_on_cpu():
    recipe = load_recipe(MIXED)
    assert [learner_setup(recipe, i, NO_USER_ENV).platform for i in range(4)] == ["gpu", "cpu", "cpu", "cpu"]
    assert learner_setup(recipe, 0, NO_USER_ENV).ray_options()["num_gpus"] == 1.0
    # A hot spare runs on the learners' defaults (CPU): it may take the slot of 1, 2 or 3, not of 0.
    assert [same_setup(recipe, i, None) for i in range(4)] == [False, True, True, True]
    assert gpu_demand(recipe) == {None: 1.0}


def test_processes_of_an_embedded_cluster_are_not_told_what_they_inherit():
    recipe = load_recipe(MIXED)
    driver = {"JAX_PLATFORMS": "cpu", "PATH": "/bin"}  # what dlc train's own environment holds
    # ... and what it adds before it starts an embedded cluster: one malloc arena, for the learners.
    assert embedded_env(recipe, driver) == {"MALLOC_ARENA_MAX": "1"}
    driver.update(embedded_env(recipe, driver))
    # No runtime_env: Ray may hand the process a worker it started in advance.
    assert learner_setup(recipe, 1, NO_USER_ENV).ray_options(driver) == {"num_cpus": 1.0}
    assert syncer_setup(recipe).ray_options(driver) == {"num_cpus": 1.0}
    gpu = learner_setup(recipe, 0, NO_USER_ENV).ray_options(driver)
    assert gpu["runtime_env"] == {"env_vars": {"JAX_PLATFORMS": "", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}}
    # dlc train run with JAX_PLATFORMS=cuda by hand: the CPU processes are told otherwise.
    assert learner_setup(recipe, 1, NO_USER_ENV).ray_options({**driver, "JAX_PLATFORMS": "cuda"})["runtime_env"] == {
        "env_vars": {"JAX_PLATFORMS": "cpu"}
    }
    # A joined cluster's processes inherit nothing from the driver: every variable is set.
    assert inherited_env(ClusterConfig(address="auto")) is None
    assert inherited_env(ClusterConfig()) is not None


def test_learners_that_keep_freed_memory_start_with_one_malloc_arena_unless_set_by_hand():
    keep, plain = load_recipe(TINY), load_recipe(TINY, ["learners.keep_freed_memory=false"])
    assert learner_setup(keep, 0, NO_USER_ENV).env == {"JAX_PLATFORMS": "cpu", "MALLOC_ARENA_MAX": "1"}
    assert evaluator_setup(keep, NO_USER_ENV).env == {"JAX_PLATFORMS": "cpu", "MALLOC_ARENA_MAX": "1"}
    cpu = {"JAX_PLATFORMS": "cpu"}
    assert learner_setup(plain, 0, NO_USER_ENV).env == evaluator_setup(plain, NO_USER_ENV).env == cpu
    assert embedded_env(plain, NO_USER_ENV) == {}
    # Set by hand in the driver's environment: every learner gets that value, and an embedded cluster
    # inherits it as it is.
    by_hand = {"MALLOC_ARENA_MAX": "2"}
    assert learner_setup(keep, 0, by_hand).env["MALLOC_ARENA_MAX"] == "2" and embedded_env(keep, by_hand) == {}


def test_accelerator_types_pick_gpu_kinds_and_cpu_learners_ignore_them():
    recipe = load_recipe(
        TINY,
        [
            "learners.count=3",
            "learners.accelerator_type=H100",
            "learners.overrides=[{index: 0, num_gpus: 1}, {index: 1, num_gpus: 0.5, accelerator_type: A100}]",
        ],
    )
    h100, a100, cpu = (learner_setup(recipe, i, NO_USER_ENV) for i in range(3))
    assert h100.ray_options()["accelerator_type"] == "H100" and a100.ray_options()["accelerator_type"] == "A100"
    assert cpu.platform == "cpu" and cpu.accelerator_type is None
    assert gpu_demand(recipe) == {"H100": 1.0, "A100": 0.5}
    both = [{"CPU": 8, "GPU": 1, "accelerator_type:H100": 1}, {"CPU": 8, "GPU": 2, "accelerator_type:A100": 1}]
    check_resources(recipe, both)
    with pytest.raises(UserError) as err:
        check_resources(recipe, [{"CPU": 8, "GPU": 2, "accelerator_type:H100": 1}])
    assert str(err.value) == (
        "the recipe reserves 0.5 GPUs of accelerator_type 'A100' but the Ray cluster has 0 of that kind "
        "(kinds here: H100): change learners.accelerator_type (or the overrides') to a kind the cluster has, "
        "or leave it unset for any GPU"
    )


def test_a_recipe_reserving_gpus_the_cluster_lacks_is_refused_in_one_line():
    check_resources(load_recipe(TINY), [{"CPU": 2}])  # no GPU asked, none needed
    check_resources(load_recipe(GPU), [{"CPU": 16, "GPU": 1}])  # 4 x 0.24 + 0.04 fits one GPU exactly
    with pytest.raises(UserError) as err:
        check_resources(load_recipe(GPU), [{"CPU": 2}])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "the recipe reserves 1 GPU (4 learners x 0.24, eval.num_gpus=0.04) but the Ray cluster has 0: "
    )
    assert "learners.num_gpus=0" in message
    # Hot spares reserve their share too: 2 x 0.5 + 1 spare x 0.5 = 1.5 GPUs.
    spares = load_recipe(TINY, ["learners.count=2", "learners.num_gpus=0.5", "learners.spares=1"])
    with pytest.raises(UserError, match=r"reserves 1.5 GPUs \(2 learners x 0.5, 1 spare x 0.5\) but .* has 1:"):
        check_resources(spares, [{"CPU": 4, "GPU": 1}])


def test_the_driver_keeps_jax_on_cpu_unless_the_user_chose():
    env: dict[str, str] = {}
    isolate_driver(env)
    assert env == {"JAX_PLATFORMS": "cpu"}
    chosen = {"JAX_PLATFORMS": "cuda"}
    isolate_driver(chosen)
    assert chosen == {"JAX_PLATFORMS": "cuda"}
