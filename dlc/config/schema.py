"""The recipe: one typed tree describing a training run.

Every field is declared here with its unit in its name and a description; a key that is not
declared is an error (see `dlc.config.load` for the did-you-mean), never a silently ignored default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

# Seeds feed NumPy's and JAX's generators, which take unsigned 32-bit values.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class LinkSpec:
    """One learner's emulated link to the syncer (see `dlc.net.link`)."""

    bandwidth_mbps: float | None = None  # None: unlimited
    latency_ms: float = 0.0
    jitter_ms: float = 0.0

    @property
    def emulated(self) -> bool:
        return self.bandwidth_mbps is not None or self.latency_ms > 0 or self.jitter_ms > 0


@dataclass(frozen=True)
class LearnerSettings:
    """Everything that may differ between learners, resolved for one of them."""

    index: int
    batch_size: int
    step_time_s: float
    num_cpus: float
    num_gpus: float
    accelerator_type: str | None
    link: LinkSpec
    resources: dict[str, float]  # custom Ray resources, e.g. {"node_b": 1}
    label_selector: dict[str, str]  # Ray node labels the learner's node must match


class Section(BaseModel):
    # No inf or nan anywhere: every number here is a size, a rate or a time that must be finite.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 in an int or float field; in a recipe it is always a slip.
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if bool not in (annotation, *getattr(annotation, "__args__", ())):
                raise PydanticCustomError("bool_for_number", "true/false is not a number: write a number here")
        return value


class RunConfig(Section):
    name: str = Field("run", description="Run name; the default run directory is runs/<name>-<timestamp>.")
    dir: str | None = Field(
        None,
        description="Run directory. Default: runs/<name>-<UTC timestamp>. Point it at an existing run "
        "directory to resume from its checkpoint. On several machines: a path every node mounts at the same "
        "place, or a URL etils can write (gs://, s3://, file://) that holds the checkpoints.",
    )
    local_dir: str | None = Field(
        None,
        description="With a URL run.dir only: the directory on the driver's machine for status, events, metrics "
        "and the summary (what dlc status and dlc report read). Default: runs/<last part of the URL>.",
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed for parameter initialisation and the data split (0 to 2^32 - 1)."
    )
    max_steps: int | None = Field(None, ge=1, description="Stop after this many inner steps per learner.")
    max_tokens: int | None = Field(
        None, ge=1, description="Stop after this many training tokens (bytes), all learners together."
    )
    max_wall_s: float | None = Field(None, gt=0, description="Stop after this many seconds of wall time.")
    log_every_steps: int = Field(50, ge=1, description="Steps between train-loss lines in metrics.jsonl and the log.")
    status_interval_s: float = Field(1.0, gt=0, description="Seconds between rewrites of status.json.")
    compile_cache: bool = Field(
        True,
        description="Keep compiled functions in compile_cache_dir, so a restarted, joining or later learner "
        "loads its step instead of compiling it (false: compile in every process).",
    )
    compile_cache_dir: str = Field(
        "~/.cache/dlc/xla",
        description="JAX's persistent compilation cache, shared by every process of a run and by later runs; "
        "safe for several processes at once.",
    )

    @model_validator(mode="after")
    def _needs_a_stop(self) -> RunConfig:
        if self.max_steps is None and self.max_tokens is None and self.max_wall_s is None:
            raise ValueError("no stop condition: set run.max_steps, run.max_tokens or run.max_wall_s")
        if self.local_dir is not None and not (self.dir and "://" in self.dir):
            raise ValueError(
                f"run.local_dir={self.local_dir!r} is only for a URL run.dir (gs://...): with a path, the run "
                "directory is run.dir itself; remove run.local_dir"
            )
        return self


class ModelConfig(Section):
    width: int = Field(64, ge=8, description="Model width (embedding dimension), in units.")
    num_layers: int = Field(4, ge=1, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads per block; must divide width.")
    mlp_ratio: int = Field(4, ge=1, description="MLP hidden size as a multiple of width.")
    context_len: int = Field(128, ge=2, description="Longest sequence the model accepts, in bytes.")
    tie_embeddings: bool = Field(True, description="Reuse the input embedding as the output layer.")
    init_std: float = Field(0.02, gt=0, description="Standard deviation of the normal initialisation.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.width % self.num_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} does not divide model.width={self.width}: "
                "choose a head count that divides the width"
            )
        return self


class DataConfig(Section):
    source: Literal["stdlib", "text"] = Field(
        "stdlib",
        description="stdlib: the running interpreter's standard-library sources (no download); "
        "text: the files named in data.paths.",
    )
    paths: list[str] = Field(
        default_factory=list,
        description="Files or glob patterns (** allowed) for data.source=text, read as bytes.",
    )
    max_corpus_bytes: int | None = Field(
        None, ge=1, description="Use at most this many bytes of the corpus (files in order)."
    )
    block_bytes: int = Field(
        4096, ge=64, description="Corpus block size in bytes; blocks are shuffled and dealt to eval and learners."
    )
    eval_fraction: float = Field(0.02, gt=0, lt=0.5, description="Fraction of blocks held out for eval.")

    @model_validator(mode="after")
    def _text_needs_paths(self) -> DataConfig:
        if self.source == "text" and not self.paths:
            raise ValueError("data.source=text needs data.paths: a list of files or globs")
        return self


class LearnerOverride(Section):
    index: int = Field(..., ge=0, description="Which learner (0-based) these settings apply to.")
    batch_size: int | None = Field(None, ge=1, description="Sequences per inner step for this learner.")
    step_time_s: float | None = Field(None, ge=0, description="Pace: this learner never steps faster than this.")
    num_cpus: float | None = Field(None, ge=0, description="Ray CPU resources reserved for this learner.")
    num_gpus: float | None = Field(
        None, ge=0, description="GPU share reserved for this learner (0: it trains on CPU; at most 1)."
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
    step_time_s: float = Field(0.0, ge=0, description="Pace: no learner steps faster than this (0 = no pace).")
    num_cpus: float = Field(1.0, ge=0, description="Ray CPU resources reserved per learner.")
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPU share reserved per learner, at most 1: 0 trains on CPU, 1 a whole GPU, 0.25 puts 4 learners "
        "on one GPU (each may fill 90% of its share of the GPU's memory).",
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

        return LearnerSettings(
            index=index,
            batch_size=pick("batch_size"),
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


class InnerConfig(Section):
    lr: float = Field(3e-3, gt=0, description="Peak AdamW learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final learning rate as a fraction of lr (cosine).")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps from 0 to lr.")
    schedule_steps: int | None = Field(
        None,
        ge=1,
        description="Length of the cosine schedule in steps. Default: run.max_steps, or derived from "
        "run.max_tokens; required when the run stops only on wall time.",
    )
    weight_decay: float = Field(0.1, ge=0, description="AdamW decoupled weight decay.")
    b1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    b2: float = Field(0.99, ge=0, lt=1, description="AdamW second-moment decay.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")


class SyncerConfig(Section):
    """Settings of the syncer that merges learners' progress (Decoupled DiLoCo)."""

    fragments: int = Field(
        24, ge=1, description="P: parameter fragments, synced one at a time on a staggered schedule."
    )
    sync_interval_steps: int = Field(24, ge=1, description="H: inner steps between two syncs of the same fragment.")
    overlap_steps: int = Field(
        2, ge=0, description="tau: steps a learner trains on before adopting a merged fragment it sent for."
    )
    quorum: int = Field(1, ge=1, description="K: healthy learners whose pushes a round needs before it may close.")
    grace_gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Grace window = gamma * (tau * step time - quorum time - sync time): 1 waits for late "
        "answers as long as the merge still reaches learners by the time they adopt it.",
    )
    heartbeat_interval_s: float = Field(0.5, gt=0, description="Seconds between a learner's heartbeats.")
    heartbeat_timeout_s: float = Field(
        5.0, gt=0, description="A learner silent this long is unhealthy: rounds stop waiting for it."
    )
    max_staleness: int = Field(4, ge=0, description="Reject a push whose base is more than this many versions old.")
    weighting: Literal["uniform", "tokens", "tokens_squared_per_step"] = Field(
        "tokens_squared_per_step",
        description="Merge weights: uniform, by tokens, or tokens^2/steps (data seen times tokens per step: fair "
        "to slow learners).",
    )
    merge: Literal["mean", "rda"] = Field(
        "rda",
        description="rda: radial-directional averaging per tensor (weighted mean for embeddings); mean: weighted "
        "average of deltas.",
    )
    outer_lr: float = Field(
        1.0, gt=0, description="Outer Nesterov SGD learning rate (1.0 with momentum 0: the weighted average)."
    )
    outer_momentum: float = Field(
        0.0, ge=0, lt=1, description="Outer Nesterov momentum (DiLoCo uses 0.9 with lr 0.7 at H=500)."
    )
    adopt: Literal["replace", "mix", "rebase"] = Field(
        "replace",
        description="How a learner adopts a merged fragment: replace its values, mix them (mix_alpha), or "
        "rebase (keep the progress made while the fragment was in flight).",
    )
    mix_alpha: float = Field(0.5, ge=0, le=1, description="adopt=mix: weight of the learner's own values.")
    codec: Literal["none", "bf16", "int8", "int4"] = Field(
        "int4", description="Compression of outer gradients learner -> syncer (none = fp32)."
    )
    codec_block_values: int = Field(64, ge=2, description="Values per absmax scale block for int8 / int4.")
    down_codec: Literal["none", "bf16", "int8", "int4"] = Field(
        "bf16",
        description="Merged fragments syncer -> learner, once per round: none (fp32) or bf16 send the value; "
        "int8 / int4 send the difference from the version the learner holds, the error fed back next round.",
    )
    num_cpus: float = Field(1.0, ge=0, description="Ray CPU resources reserved for the syncer.")
    channel: Literal["direct", "ray"] = Field(
        "direct",
        description="How requests, pushes, merged fragments and heartbeats travel: direct, on one authenticated "
        "socket per learner to the syncer's node (about a seventh of the CPU of an actor call); ray, as Ray actor "
        "calls.",
    )
    checkpoint_interval_s: float = Field(30.0, gt=0, description="Seconds between syncer checkpoints.")

    @field_validator("weighting", mode="before")
    @classmethod
    def _renamed_weighting(cls, value: Any) -> Any:
        if value == "tokens_per_step":
            raise ValueError(
                "syncer.weighting=tokens_per_step is now called tokens_squared_per_step (the weight is "
                "tokens^2 / steps): rename it in the recipe"
            )
        return value


class BlockingConfig(Section):
    """Settings of the blocking baselines, dp and diloco."""

    reconfigure_s: float = Field(
        20.0,
        ge=0,
        description="Elastic pause: the whole job stops this long each time a learner is lost or returns "
        "(the constant dlc simulate fits to the paper's elastic-DP goodput).",
    )
    dp_codec: Literal["none", "bf16"] = Field(
        "none",
        description="dp: encoding of the gradient every learner sends every step and of the model it gets back "
        "(none = fp32).",
    )


class ClusterConfig(Section):
    address: str | None = Field(
        None,
        description="Ray cluster to join: HOST:PORT of its head (ray start --head), auto, or ray://HOST:10001. "
        "Default: start an embedded one-node cluster on 127.0.0.1 with no dashboard.",
    )
    num_cpus: float | None = Field(
        None,
        ge=1,
        description="CPUs the embedded cluster advertises; at least what the recipe reserves. Default: the "
        "machine's logical CPUs, or what the recipe reserves if that is more.",
    )


class CheckpointConfig(Section):
    every_steps: int = Field(500, ge=1, description="Steps between checkpoints (one is always written at exit).")
    keep: int = Field(2, ge=1, description="How many recent checkpoints to keep.")


class EvalConfig(Section):
    every_steps: int = Field(200, ge=1, description="Steps between evaluations on the held-out split.")
    batches: int = Field(8, ge=1, description="Batches per evaluation (fixed windows of the held-out split).")
    batch_size: int = Field(16, ge=1, description="Sequences per eval batch.")
    num_gpus: float = Field(
        0.0,
        ge=0,
        le=1,
        description="GPU share reserved for the evaluator (0: it evaluates on CPU). With GPU learners, a small "
        "share (e.g. 0.04 beside 4 learners x 0.24) makes evaluations of large models quick.",
    )


class Recipe(Section):
    run: RunConfig = Field(
        default_factory=lambda: RunConfig(max_steps=1000), description="Run identity and stop condition."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The byte-level transformer.")
    data: DataConfig = Field(default_factory=DataConfig, description="Corpus and splits.")
    learners: LearnersConfig = Field(default_factory=LearnersConfig, description="Learner islands.")
    inner: InnerConfig = Field(default_factory=InnerConfig, description="Inner optimizer (AdamW).")
    algorithm: Literal["decoupled", "diloco", "dp", "none"] = Field(
        "decoupled",
        description="decoupled: Decoupled DiLoCo; diloco: blocking DiLoCo (every H steps all learners send "
        "the whole model and wait); dp: data-parallel (every step all learners send gradients and wait); "
        "none: independent learners that never synchronise (a baseline for overhead; no global model).",
    )
    syncer: SyncerConfig = Field(default_factory=SyncerConfig, description="Syncer (outer loop).")
    blocking: BlockingConfig = Field(default_factory=BlockingConfig, description="The dp and diloco baselines.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where the processes run (Ray).")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint policy.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        ctx = self.model.context_len
        if self.learners.seq_len > ctx:
            raise ValueError(
                f"learners.seq_len={self.learners.seq_len} is longer than model.context_len={ctx}: "
                "shorten seq_len or raise context_len"
            )
        block = self.data.block_bytes
        if block < self.learners.seq_len + 1:
            raise ValueError(
                f"data.block_bytes={block} is shorter than one training window (learners.seq_len="
                f"{self.learners.seq_len} bytes plus the byte it predicts): raise data.block_bytes to at least "
                f"{self.learners.seq_len + 1} or shorten learners.seq_len"
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
            if gpus is not None and gpus > 1:
                raise ValueError(
                    f"{where}={gpus:g}: a learner trains on one device, so it uses at most 1 GPU: set 1 for a "
                    "whole GPU, or a fraction (0.25 puts 4 learners on one GPU)"
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

    def cpus_reserved(self) -> float:
        """Ray CPUs the run reserves: learners, spares, room for joiners (a joiner must not wait for CPUs or take
        a restarting syncer's), and the syncer."""
        return self.learners.cpus_reserved() + self.syncer.num_cpus

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
