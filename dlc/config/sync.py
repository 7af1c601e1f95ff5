"""How learners synchronise: the decoupled syncer's settings, and those of the blocking baselines."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dlc.config.outer import NesterovOuter, OuterConfig, legacy_outer
from dlc.config.section import Section


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
        "tokens",
        description="Merge weights: tokens (the data behind each push, since the learner's last sync of the "
        "fragment), uniform, or tokens^2/steps (data times tokens per step: a larger batch counts twice).",
    )
    staleness_discount: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Each version a push's base is behind multiplies its merge weight by this (1: no discount).",
    )
    merge: Literal["mean", "rda"] = Field(
        "mean",
        description="mean: weighted average of deltas; rda: radial-directional averaging per tensor (weighted "
        "mean for embeddings): the mean scaled up by how far the learners' deltas cancel in it.",
    )
    lr_feedback: Literal["none", "spread"] = Field(
        "spread",
        description="spread: each round the syncer measures per tensor how far the learners' deltas cancel in "
        "their mean (the mean of their norms over the norm of their mean: 1 when they agree, sqrt(M) when they "
        "are noise, counted up to that) and each learner multiplies that tensor's learning rate by it "
        "(smoothed over rounds, lr_feedback_decay): small batches a learner then step as far as "
        "data-parallel's one batch. "
        "Decoupled only; none: the learning rate as scheduled.",
    )
    lr_feedback_decay: float = Field(
        0.8, ge=0, lt=1, description="lr_feedback: weight of the previous factor when a round brings a new one."
    )
    lr_feedback_power: float = Field(
        2.5,
        gt=0,
        le=4,
        description="lr_feedback: the learners' factor is the smoothed spread to this power (at most M^(power/2) "
        "for M learners). A delta sums H steps, whose signal adds up while their noise partly cancels, so a "
        "delta's spread understates how much of one step is noise: a power above 1 makes up for it.",
    )
    outer: OuterConfig = Field(
        default_factory=NesterovOuter,
        description="The outer step on each merged fragment, chosen by kind with its own fields beside it: "
        "nesterov (lr, momentum) or delayed_nesterov (lr, momentum, delay_rounds).",
    )
    adopt: Literal["replace", "mix", "rebase"] = Field(
        "rebase",
        description="How a learner adopts a merged fragment: rebase (the merged value plus the progress made "
        "while the fragment was in flight), replace its values (that progress is lost), or mix them (mix_alpha).",
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

    @model_validator(mode="before")
    @classmethod
    def _legacy_outer(cls, data: Any) -> Any:
        return legacy_outer(data)

    @model_validator(mode="after")
    def _one_rescaling(self) -> SyncerConfig:
        if self.merge == "rda" and self.lr_feedback != "none":
            raise ValueError(
                "syncer.merge=rda scales each merged tensor up by how far the learners' deltas cancel, and "
                "syncer.lr_feedback=spread raises the learners' learning rate by the same factor: both would "
                "count it twice. Set syncer.merge=mean (the default) or syncer.lr_feedback=none"
            )
        return self

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
