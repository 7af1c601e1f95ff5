"""The recipe: one typed tree describing a training run, and the checks that span its sections.

Every field is declared with its unit in its name and a description, section by section
(`dlc.config.job`, `workload`, `learners`, `sync`); a key that is not declared is an error (see
`dlc.config.load` for the did-you-mean), never a silently ignored default.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from dlc.config.algorithms import ALGORITHM_DESCRIPTION, AlgorithmName
from dlc.config.job import (
    TRACKERS,
    CheckpointConfig,
    ClusterConfig,
    EvalConfig,
    MetricsConfig,
    ProfileConfig,
    RunConfig,
    TrackerName,
    TrackingConfig,
)
from dlc.config.learners import LearnersConfig
from dlc.config.section import Section
from dlc.config.sync import BlockingConfig, SyncerConfig
from dlc.config.workload import DataConfig, InnerConfig, ModelConfig


class Recipe(Section):
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(max_steps=1000), description="Run identity and stop condition."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The transformer.")
    data: DataConfig = Field(default_factory=DataConfig, description="Corpus or prepared dataset, and splits.")
    learners: LearnersConfig = Field(default_factory=LearnersConfig, description="Learner islands.")
    inner: InnerConfig = Field(default_factory=InnerConfig, description="Inner optimizer (AdamW).")
    algorithm: AlgorithmName = Field("decoupled", description=ALGORITHM_DESCRIPTION)
    syncer: SyncerConfig = Field(default_factory=SyncerConfig, description="Syncer (outer loop).")
    blocking: BlockingConfig = Field(default_factory=BlockingConfig, description="The dp and diloco baselines.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where the processes run (Ray).")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint policy.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    track: list[TrackerName] = Field(
        ["tensorboard"],
        description="Experiment trackers that receive the run's metrics and events: any of "
        f"{', '.join(TRACKERS)} (e.g. [tensorboard, wandb]; [] for none). Their settings are under tracking.",
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="Experiment trackers (the recipe's track list)."
    )
    profile: ProfileConfig = Field(
        default_factory=ProfileConfig, description="JAX profiler traces of a few learner steps."
    )
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="Prometheus metrics, through Ray's metrics API."
    )

    @field_validator("track", mode="before")
    @classmethod
    def _one_tracker_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # track=wandb on the command line

    @field_validator("track")
    @classmethod
    def _each_tracker_once(cls, value: list[TrackerName]) -> list[TrackerName]:
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"track lists {', '.join(twice)} more than once: name each tracker once")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        ctx = self.model.context_len
        if self.learners.seq_len > ctx:
            raise ValueError(
                f"learners.seq_len={self.learners.seq_len} is longer than model.context_len={ctx}: "
                "shorten seq_len or raise context_len"
            )
        block = self.data.block_bytes
        if self.data.source != "prepared" and block < self.learners.seq_len + 1:
            raise ValueError(
                f"data.block_bytes={block} is shorter than one training window (learners.seq_len="
                f"{self.learners.seq_len} bytes plus the byte it predicts): raise data.block_bytes to at least "
                f"{self.learners.seq_len + 1} or shorten learners.seq_len"
            )
        self._check_metrics()
        outside = [i for i in self.profile.learners if not 0 <= i < self.learners.count]
        if outside:
            raise ValueError(
                f"profile.learners lists {outside}, but learners.count={self.learners.count}: "
                f"indices run from 0 to {self.learners.count - 1}"
            )
        for o in self.learners.overrides:
            if o.index >= self.learners.count:
                raise ValueError(
                    f"learners.overrides has index {o.index} but learners.count={self.learners.count}: "
                    f"indices run from 0 to {self.learners.count - 1}"
                )
        for where, gpus in [("learners.num_gpus", self.learners.num_gpus)] + [
            (f"learners.overrides[index={o.index}].num_gpus", o.num_gpus) for o in self.learners.overrides
        ]:
            if gpus is not None and gpus > 1 and gpus != int(gpus):
                raise ValueError(
                    f"{where}={gpus:g}: a learner takes a share of one GPU or whole GPUs: set a fraction (0.25 puts "
                    "4 learners on one GPU), 1, or a whole number of GPUs with learners.devices equal to it"
                )
        for i in range(self.learners.count):
            one = self.learners.resolved(i)
            where = "learners" if not any(o.index == i for o in self.learners.overrides) else f"learner {i}"
            data, fsdp = one.mesh
            if data * fsdp != one.devices:
                raise ValueError(
                    f"{where}: mesh data={data} x fsdp={fsdp} is {data * fsdp} devices but devices={one.devices}: "
                    "make data x fsdp equal devices"
                )
            if one.batch_size % one.devices:
                raise ValueError(
                    f"{where}: batch_size={one.batch_size} does not split over devices={one.devices}: each device "
                    "takes an equal part of the batch, so make batch_size a multiple of devices"
                )
            if one.num_gpus > 1 and one.num_gpus != one.devices:
                raise ValueError(
                    f"{where}: num_gpus={one.num_gpus:g} but devices={one.devices}: a learner on N GPUs trains on N "
                    f"devices, so set devices={int(one.num_gpus)} (or num_gpus=1 for one GPU)"
                )
            if one.num_gpus > 0 and one.devices > 1 and one.num_gpus != one.devices:
                raise ValueError(
                    f"{where}: devices={one.devices} on GPUs needs num_gpus={one.devices}: a learner's devices are "
                    "whole GPUs of one node"
                )
        for o in self.learners.overrides:
            if o.accelerator_type is not None and self.learners.resolved(o.index).num_gpus == 0:
                raise ValueError(
                    f"learners.overrides[index={o.index}].accelerator_type={o.accelerator_type!r} but learner "
                    f"{o.index} reserves no GPU: give it num_gpus (e.g. 1) or drop accelerator_type"
                )
        sync = self.syncer
        if sync.quorum > self.learners.count:
            raise ValueError(
                f"syncer.quorum={sync.quorum} but only {self.learners.count} learners: lower the quorum or add learners"
            )
        if sync.overlap_steps >= sync.sync_interval_steps:
            raise ValueError(
                f"syncer.overlap_steps={sync.overlap_steps} must be smaller than syncer.sync_interval_steps="
                f"{sync.sync_interval_steps} (tau < H): a fragment must arrive before it is due again"
            )
        if sync.heartbeat_timeout_s <= sync.heartbeat_interval_s:
            raise ValueError(
                f"syncer.heartbeat_timeout_s={sync.heartbeat_timeout_s} must exceed syncer.heartbeat_interval_s="
                f"{sync.heartbeat_interval_s}, or every learner looks dead between heartbeats"
            )
        reserved = self.cpus_reserved()
        if self.cluster.address is None and self.cluster.num_cpus is not None and self.cluster.num_cpus < reserved:
            raise ValueError(
                f"cluster.num_cpus={self.cluster.num_cpus:g} but the recipe reserves {reserved:g} CPUs "
                f"({self.learners.cpus_reserved():g} for {self.learners.count} learners, "
                f"{self.learners.spares} spares and {self.learners.join_streams} join streams, "
                f"{self.syncer.num_cpus:g} for the syncer): raise cluster.num_cpus to {reserved:g}, or lower "
                "learners.num_cpus, learners.spares, learners.join_streams or syncer.num_cpus"
            )
        if self.run.max_steps is None and self.run.max_tokens is None and self.inner.schedule_steps is None:
            raise ValueError(
                "the run stops only on run.max_wall_s, so the learning-rate schedule has no length: "
                "set inner.schedule_steps"
            )
        return self

    def _check_metrics(self) -> None:
        if self.cluster.address is not None and self.metrics.port is not None:
            raise ValueError(
                f"metrics.port={self.metrics.port} names the embedded cluster's endpoint, but cluster.address joins "
                "a cluster that exports at its own port (ray start --metrics-export-port): set metrics.enabled=true "
                "instead of metrics.port"
            )
        if self.cluster.address is None and self.metrics.enabled and self.metrics.port is None:
            raise ValueError(
                "metrics.enabled=true, but the embedded cluster exports metrics only where metrics.port says: set "
                "metrics.port (e.g. metrics.port=9100)"
            )

    def cpus_reserved(self) -> float:
        """Ray CPUs the run reserves: learners, spares, room for joiners (a joiner must not wait for CPUs or take
        a restarting syncer's), and the syncer."""
        return self.learners.cpus_reserved() + self.syncer.num_cpus

    def lr_feedback(self) -> bool:
        """Whether the syncer sets the learners' learning rate a tensor (`syncer.lr_feedback`, decoupled only)."""
        return self.algorithm == "decoupled" and self.syncer.lr_feedback != "none"

    def schedule_steps(self) -> int:
        """Length of the inner learning-rate schedule in steps."""
        if self.inner.schedule_steps is not None:
            return self.inner.schedule_steps
        if self.run.max_steps is not None:
            return self.run.max_steps
        assert self.run.max_tokens is not None
        tokens_per_round = sum(
            self.learners.resolved(i).batch_size * self.learners.seq_len for i in range(self.learners.count)
        )
        return max(1, -(-self.run.max_tokens // tokens_per_round))

    def default_run_dir(self) -> Path:
        return Path("runs") / f"{self.run.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
