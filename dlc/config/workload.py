"""What is trained: the model's shape, the corpus it reads, and its inner optimizer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dlc.config.section import Section


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
