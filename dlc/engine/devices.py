"""Each process's device: the GPU share or CPU it runs on, its Ray resources, the environment it starts with.

Pure decisions from the recipe (no Ray, no JAX here), so they are testable without a cluster or a
GPU; the driver applies them through `.options(**setup.ray_options())`. Ray sets a process's
`runtime_env` variables before the process starts, which is the only time JAX reads them:

- A learner with `num_gpus > 0` runs on the GPU Ray assigns it (Ray sets CUDA_VISIBLE_DEVICES) and
  may fill `GPU_MEMORY_SHARE` of its share of that GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION):
  JAX's own default, 75% of the whole GPU per process, lets a second learner on the same GPU fail
  with CUDA_ERROR_OUT_OF_MEMORY.
- Everything else (CPU learners, the syncer, the evaluator unless `eval.num_gpus`, the driver)
  gets JAX_PLATFORMS=cpu: Ray leaves CUDA_VISIBLE_DEVICES alone for a process that reserved no GPU,
  and a CUDA-enabled JAX would otherwise take 75% of every GPU it sees.
- Learners and the evaluator that keep freed memory (`learners.keep_freed_memory`) start with one
  malloc arena (MALLOC_ARENA_MAX=1): glibc reads it only then, and without it XLA's thread
  allocates from a heap that unmaps its temporaries (`dlc.core.allocator.keep_freed_memory`). An
  embedded cluster gets it from the driver's environment (`embedded_env`), so no process needs a
  runtime_env for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlc.config.job import ClusterConfig
from dlc.config.schema import Recipe
from dlc.core.allocator import ARENA_VAR
from dlc.errors import UserError

# Of a process's share of its GPU's memory, what JAX may take; the rest is left to each process's
# CUDA context and libraries (cuBLAS, cuDNN workspaces), which live outside JAX's pool.
GPU_MEMORY_SHARE = 0.9
# JAX's memory settings: set by hand in the driver's environment, each replaces dlc's on every GPU
# process (and reaches the processes of a cluster joined with cluster.address, which do not inherit it).
MEMORY_VARS = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR")
ACCELERATOR_PREFIX = "accelerator_type:"  # Ray's node resource naming a node's GPU kind
EPS = 1e-6  # Ray keeps resources to 4 decimals: sums like 0.24 x 4 + 0.04 must still fit in 1


@dataclass(frozen=True)
class DeviceSetup:
    """One process's Ray resources and the environment variables it starts with."""

    num_cpus: float
    num_gpus: float = 0.0
    accelerator_type: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def platform(self) -> str:
        """The JAX platform the process must end up on: gpu or cpu."""
        return "gpu" if self.num_gpus > 0 else "cpu"

    def ray_options(self, inherited: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Options for `.options(...)`. `inherited`: the environment the process gets anyway (an embedded
        cluster's workers inherit the driver's); variables it already holds are not set again, and a
        process needing none is started without a runtime_env, so Ray can hand it a worker it started
        in advance (a runtime_env costs a new worker process: about a second more per learner here)."""
        out: dict[str, Any] = {"num_cpus": self.num_cpus}
        env_vars = {k: v for k, v in self.env.items() if inherited is None or inherited.get(k) != v}
        if env_vars:
            out["runtime_env"] = {"env_vars": env_vars}
        if self.num_gpus > 0:
            out["num_gpus"] = self.num_gpus
        if self.accelerator_type:
            out["accelerator_type"] = self.accelerator_type
        return out


def process_env(
    num_gpus: float, user_env: Mapping[str, str], keep_memory: bool = False, devices: int = 1
) -> dict[str, str]:
    """The environment a process reserving `num_gpus` GPUs starts with; `keep_memory`: one that
    keeps the memory it frees (learners and the evaluator, by `learners.keep_freed_memory`). A
    learner of `devices` > 1 on CPU gets that many host devices (XLA's flag, read as JAX starts)."""
    env = {"JAX_PLATFORMS": "cpu"}
    if num_gpus == 0 and devices > 1:
        # First: XLA stops reading its flags at a word without dashes, which the thread limits hold.
        flags = user_env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {flags}".strip()
    if num_gpus > 0:
        # Empty: JAX chooses (the GPU). The driver's own JAX_PLATFORMS=cpu must not reach this process.
        env = {"JAX_PLATFORMS": "", "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{min(num_gpus, 1.0) * GPU_MEMORY_SHARE:.4g}"}
        # Set by hand, each wins; with PREALLOCATE=false alone, the share still caps what JAX may grow to.
        env.update({name: user_env[name] for name in MEMORY_VARS if name in user_env})
    if keep_memory:
        env[ARENA_VAR] = user_env.get(ARENA_VAR, "1")  # set by hand, it wins
    return env


def embedded_env(recipe: Recipe, user_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the driver adds to its own environment before it starts an embedded cluster: variables
    the learners start with that every process of the cluster may as well inherit, so that no
    learner needs a runtime_env (a worker process started for it: about a second more each)."""
    user_env = os.environ if user_env is None else user_env
    if recipe.learners.keep_freed_memory and ARENA_VAR not in user_env:
        return {ARENA_VAR: "1"}
    return {}


def learner_setup(recipe: Recipe, index: int | None, user_env: Mapping[str, str] | None = None) -> DeviceSetup:
    """Learner `index`'s device setup; None: a hot spare (the learners' defaults)."""
    settings = recipe.learners.resolved(-1 if index is None else index)
    return DeviceSetup(
        num_cpus=settings.num_cpus,
        num_gpus=settings.num_gpus,
        accelerator_type=settings.accelerator_type if settings.num_gpus > 0 else None,
        env=process_env(
            settings.num_gpus,
            os.environ if user_env is None else user_env,
            recipe.learners.keep_freed_memory,
            settings.devices,
        ),
    )


def syncer_setup(recipe: Recipe) -> DeviceSetup:
    """The syncer merges NumPy arrays: always on CPU."""
    return DeviceSetup(num_cpus=recipe.syncer.num_cpus, env=process_env(0.0, {}))


def evaluator_setup(recipe: Recipe, user_env: Mapping[str, str] | None = None) -> DeviceSetup:
    """The evaluator reserves no CPU (it runs between the learners' steps), and a GPU share only if asked."""
    gpus = recipe.eval.num_gpus
    env = process_env(gpus, os.environ if user_env is None else user_env, recipe.learners.keep_freed_memory)
    return DeviceSetup(num_cpus=0.0, num_gpus=gpus, env=env)


def inherited_env(cluster: ClusterConfig) -> Mapping[str, str] | None:
    """The environment the run's processes get without being told: an embedded cluster's workers
    inherit the driver's; a joined cluster's (None) have their own."""
    return os.environ if cluster.address is None else None


def isolate_driver(environ: Any = None) -> None:
    """The driver never trains: keep its JAX (if anything imports it) off the GPUs, unless the user chose."""
    (os.environ if environ is None else environ).setdefault("JAX_PLATFORMS", "cpu")


def same_setup(recipe: Recipe, a: int | None, b: int | None) -> bool:
    """Whether learners `a` and `b` (None: a hot spare) run on the same kind of device with the same share,
    and as many of them."""
    pa, pb = learner_setup(recipe, a, {}), learner_setup(recipe, b, {})
    da, db = (recipe.learners.resolved(-1 if i is None else i) for i in (a, b))
    return (pa.num_cpus, pa.num_gpus, pa.accelerator_type, da.devices, da.mesh) == (
        pb.num_cpus,
        pb.num_gpus,
        pb.accelerator_type,
        db.devices,
        db.mesh,
    )


# -- does the cluster have what the recipe reserves? ----------------------------------------------


def gpu_demand(recipe: Recipe) -> dict[str | None, float]:
    """GPUs the run reserves from its start, by accelerator type (None: any kind).

    The learners, the hot spares and the evaluator; learners that join later (chaos) are not
    counted: they wait for room like any Ray actor.
    """
    learners = recipe.learners
    demand: dict[str | None, float] = {}
    for i in [*range(learners.count), *([None] * learners.spares)]:
        p = learner_setup(recipe, i, {})
        demand[p.accelerator_type] = demand.get(p.accelerator_type, 0.0) + p.num_gpus
    demand[None] = demand.get(None, 0.0) + recipe.eval.num_gpus
    return {kind: gpus for kind, gpus in demand.items() if gpus > 0}


def check_resources(recipe: Recipe, nodes: Sequence[Mapping[str, float]]) -> None:
    """Refuse a recipe that reserves GPUs the cluster does not have (Ray would wait for them forever).

    `nodes`: the resources of each live node of the cluster (Ray's `Resources` of `ray.nodes()`).
    """
    demand = gpu_demand(recipe)
    if not demand:
        return
    total = sum(node.get("GPU", 0.0) for node in nodes)
    wanted = sum(demand.values())
    if wanted > total + EPS:
        raise UserError(
            f"the recipe reserves {_gpus(wanted)} ({_who(recipe)}) but the Ray cluster has {total:g}: "
            "set learners.num_gpus=0 (and eval.num_gpus=0) to train on CPU, share GPUs with fractions "
            "(learners.num_gpus=0.25 puts 4 learners on one), or run where the GPUs are"
        )
    kinds = sorted({k[len(ACCELERATOR_PREFIX) :] for node in nodes for k in node if k.startswith(ACCELERATOR_PREFIX)})
    for kind, gpus in demand.items():
        if kind is None:
            continue
        have = sum(node.get("GPU", 0.0) for node in nodes if f"{ACCELERATOR_PREFIX}{kind}" in node)
        if gpus > have + EPS:
            raise UserError(
                f"the recipe reserves {_gpus(gpus)} of accelerator_type {kind!r} but the Ray cluster has {have:g} "
                f"of that kind (kinds here: {', '.join(kinds) or 'none'}): change learners.accelerator_type "
                "(or the overrides') to a kind the cluster has, or leave it unset for any GPU"
            )


def _gpus(n: float) -> str:
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


def _who(recipe: Recipe) -> str:
    """What reserves the GPUs, e.g. '4 learners x 0.25, eval.num_gpus=0.04'."""
    learners = recipe.learners
    shares: dict[float, int] = {}
    for i in range(learners.count):
        gpus = learners.resolved(i).num_gpus
        if gpus > 0:
            shares[gpus] = shares.get(gpus, 0) + 1
    parts = [f"{n} learner{'s' if n > 1 else ''} x {g:g}" for g, n in shares.items()]
    spare = learners.resolved(-1).num_gpus
    if learners.spares and spare > 0:
        parts.append(f"{learners.spares} spare{'s' if learners.spares > 1 else ''} x {spare:g}")
    if recipe.eval.num_gpus > 0:
        parts.append(f"eval.num_gpus={recipe.eval.num_gpus:g}")
    return ", ".join(parts)
