"""The learners: how many, their batches and pace, the resources each reserves, their emulated links.

`LearnersConfig` holds the defaults and the per-learner overrides; `resolved(index)` gives one
learner's settings with its overrides applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from dlc.config.section import Section


@dataclass(frozen=True)
class LinkSpec:
    """One learner's emulated link to the syncer (see `dlc.net.link`)."""

    bandwidth_mbps: float | None = None  # None: unlimited
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    @property
    def emulated(self) -> bool:
        return self.bandwidth_mbps is not None or self.latency_ms > 0 or self.jitter_ms > 0


class MeshConfig(Section):
    """How a learner's devices divide its work: data x fsdp = learners.devices."""

    data: int = Field(1, ge=1, description="Replicas of the parameters; the batch is split over them.")
    fsdp: int | None = Field(
        None,
        ge=1,
        description="Devices each parameter, gradient and optimizer state is sharded over (the batch is split over "
        "them too). Default: devices / data.",
    )


@dataclass(frozen=True)
class LearnerSettings:
    """Everything that may differ between learners, resolved for one of them."""

    index: int
    batch_size: int
    devices: int  # devices the learner trains on: data x fsdp
    mesh: tuple[int, int]  # (data, fsdp)
    step_time_s: float
    num_cpus: float
    num_gpus: float
    accelerator_type: str | None
    link: LinkSpec
    resources: dict[str, float]  # custom Ray resources, e.g. {"node_b": 1}
    label_selector: dict[str, str]  # Ray node labels the learner's node must match


class LearnerOverride(Section):
    index: int = Field(..., ge=0, description="Which learner (0-based) these settings apply to.")
    batch_size: int | None = Field(None, ge=1, description="Sequences per inner step for this learner.")
    devices: int | None = Field(None, ge=1, description="Devices this learner trains on (see learners.devices).")
    mesh: MeshConfig | None = Field(None, description="How this learner's devices divide its work.")
    step_time_s: float | None = Field(None, ge=0, description="Pace: this learner never steps faster than this.")
    num_cpus: float | None = Field(None, ge=0, description="Ray CPU resources reserved for this learner.")
    num_gpus: float | None = Field(
        None, ge=0, description="GPU share reserved for this learner (0: it trains on CPU; above 1: its devices)."
    )
    accelerator_type: str | None = Field(
        None, description="Ray accelerator type this learner's GPU must be (e.g. H100, A100), on a mixed cluster."
    )
    resources: dict[str, float] | None = Field(
        None, description="Custom Ray resources for this learner, e.g. {node_b: 1}: it runs on a node that has them."
    )
    label_selector: dict[str, str] | None = Field(
        None, description="Ray node labels this learner's node must have, e.g. {zone: us-east1-b}."
    )
    bandwidth_mbps: float | None = Field(None, gt=0, description="This learner's link bandwidth, Mbit/s each way.")
    latency_ms: float | None = Field(None, ge=0, description="This learner's one-way link latency, ms.")
    jitter_ms: float | None = Field(None, ge=0, description="This learner's latency jitter (half-normal scale), ms.")


class LearnersConfig(Section):
    count: int = Field(1, ge=1, description="Number of learners (M).")
    batch_size: int = Field(16, ge=1, description="Sequences per inner step, per learner.")
    seq_len: int = Field(128, ge=2, description="Training sequence length in bytes; at most model.context_len.")
    devices: int = Field(
        1,
        ge=1,
        description="Devices each learner trains on, as one model: N GPUs of one node (num_gpus must be N), or on "
        "CPU N host devices of the learner's process. The batch is split over them; parameters, gradients and "
        "optimizer state are sharded as learners.mesh says.",
    )
    mesh: MeshConfig = Field(
        default_factory=MeshConfig,
        description="How a learner's devices divide its work: {data: a, fsdp: b} with a x b = devices. Default: "
        "everything sharded (fsdp = devices).",
    )
    step_time_s: float = Field(0.0, ge=0, description="Pace: no learner steps faster than this (0 = no pace).")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPU resources reserved per learner.")
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPU share reserved per learner: 0 trains on CPU, 1 a whole GPU, 0.25 puts 4 learners on one GPU "
        "(each may fill 90% of its share of the GPU's memory); N > 1 whole GPUs of one node for a learner of "
        "learners.devices=N.",
    )
    accelerator_type: str | None = Field(
        None,
        description="Ray accelerator type every GPU learner's GPU must be (e.g. H100, A100; Ray labels each node "
        "with its GPUs' kind). Default: any GPU.",
    )
    xla_cpu_threads: int | None = Field(
        None,
        ge=1,
        description="Threads XLA computes with in each learner (and the evaluator) on CPU. Default: the CPUs Ray "
        "reserves for the learner (num_cpus, at least 1), so learners sharing a few cores do not crowd each other: "
        "a second thread buys four tiny learners on 2 cores nothing and costs an eighth more CPU per step.",
    )
    keep_freed_memory: bool = Field(
        True,
        description="Learners (and the evaluator) keep the memory they free for reuse instead of handing it back "
        "to the kernel (Linux, glibc), and hand it back only after compiling and after each checkpoint: XLA's "
        "per-step temporaries are not faulted in afresh every step, which took a third of a tiny learner's CPU "
        "step. They start with one malloc arena (MALLOC_ARENA_MAX=1, unless set by hand), without which a "
        "thread's own arena still unmaps them. Between checkpoints a learner may hold more memory (a tiny one "
        "470-595 MiB against 455-486).",
    )
    placement: Literal["spread", "pack"] = Field(
        "spread",
        description="spread: learners on as many nodes as possible (Ray's SPREAD); pack: the learners' slots are "
        "one placement group on as few nodes as possible. The syncer always runs on the driver's node.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources every learner reserves (per learner: overrides)."
    )
    label_selector: dict[str, str] = Field(
        default_factory=dict, description="Ray node labels every learner's node must have (per learner: overrides)."
    )
    spares: int = Field(
        0,
        ge=0,
        description="Hot spares: learner processes kept started and compiled, idle, each reserving num_cpus "
        "and num_gpus; a dead learner's slot is taken over by one, and a new spare starts behind it.",
    )
    join_streams: int = Field(
        2, ge=0, description="Data streams held back for learners that join during the run, one per joiner."
    )
    bandwidth_mbps: float | None = Field(
        None,
        gt=0,
        description="Emulated bandwidth of each learner's link to the syncer, Mbit/s each way (null = unlimited).",
    )
    latency_ms: float = Field(0.0, ge=0, description="Emulated one-way latency of each learner's link, ms.")
    jitter_ms: float = Field(
        0.0, ge=0, description="Emulated latency jitter, ms (half-normal scale; messages never overtake)."
    )
    overrides: list[LearnerOverride] = Field(default_factory=list, description="Per-learner settings.")

    @model_validator(mode="after")
    def _one_override_per_learner(self) -> LearnersConfig:
        seen: set[int] = set()
        for o in self.overrides:
            if o.index in seen:
                raise ValueError(f"learners.overrides names learner {o.index} twice: merge its settings into one entry")
            seen.add(o.index)
        return self

    def resolved(self, index: int) -> LearnerSettings:
        """Learner `index`'s settings: its override where one is set, else the learners' default.

        A joiner beyond the overrides gets the defaults.
        """
        override = next((o for o in self.overrides if o.index == index), None)

        def pick(name: str) -> Any:
            value = getattr(override, name) if override is not None else None
            return getattr(self, name) if value is None else value

        devices = pick("devices")
        mesh = pick("mesh")
        data = mesh.data
        fsdp = mesh.fsdp if mesh.fsdp is not None else max(devices // data, 1)
        return LearnerSettings(
            index=index,
            batch_size=pick("batch_size"),
            devices=devices,
            mesh=(data, fsdp),
            step_time_s=pick("step_time_s"),
            num_cpus=pick("num_cpus"),
            num_gpus=pick("num_gpus"),
            accelerator_type=pick("accelerator_type"),
            link=LinkSpec(pick("bandwidth_mbps"), pick("latency_ms"), pick("jitter_ms")),
            resources=dict(pick("resources")),
            label_selector=dict(pick("label_selector")),
        )

    def xla_threads(self, index: int | None) -> int:
        """The threads XLA computes with in learner `index` (None: a hot spare, or the evaluator) on CPU."""
        if self.xla_cpu_threads is not None:
            return self.xla_cpu_threads
        cpus = self.num_cpus if index is None else self.resolved(index).num_cpus
        return max(1, int(cpus))

    def cpus_reserved(self) -> float:
        """Ray CPUs the learners, their hot spares and the joiners chaos may add reserve together (each spare
        and joiner as much as a learner's default)."""
        own = sum(self.resolved(i).num_cpus for i in range(self.count))
        return own + (self.join_streams + self.spares) * self.num_cpus
