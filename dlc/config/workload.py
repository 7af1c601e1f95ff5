"""What is trained: the model's shape, the corpus it reads, and its inner optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from dlc.config.section import Section


@dataclass(frozen=True)
class Arch:
    """A block family as a recipe knows it; its code is the module dlc.core.arch.<name>."""

    description: str
    grouped_query: bool  # model.num_kv_heads may be fewer than num_heads
    rotary: bool  # positions rotate pairs of each head's dimensions: the head size must be even


# model.arch's names, the registry of block families.
ARCHES = {
    "gpt": Arch(
        "GPT-2's blocks (learned positions, LayerNorm, GELU MLP, fused attention projection)",
        grouped_query=False,
        rotary=False,
    ),
    "llama": Arch(
        "Llama's (rotary positions, RMSNorm, SwiGLU MLP, no biases, optional grouped-query attention)",
        grouped_query=True,
        rotary=True,
    ),
}


class ModelConfig(Section):
    arch: Literal[tuple(ARCHES)] = Field(  # type: ignore[valid-type]  # the names are ARCHES' keys
        "gpt", description="; ".join(f"{name}: {arch.description}" for name, arch in ARCHES.items()) + "."
    )
    width: int = Field(64, ge=8, description="Model width (embedding dimension), in units.")
    num_layers: int = Field(4, ge=1, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads per block; must divide width.")
    num_kv_heads: int | None = Field(
        None,
        ge=1,
        description="llama: key and value heads per block (grouped-query attention); must divide num_heads. "
        "Default: num_heads (every query head has its own).",
    )
    mlp_ratio: int = Field(4, ge=1, description="MLP hidden size as a multiple of width.")
    mlp_hidden: int | None = Field(
        None,
        ge=1,
        description="The MLP's hidden size, when given, instead of mlp_ratio's. Default: mlp_ratio x width for gpt; "
        "for llama two thirds of that (SwiGLU has three matrices, not two), rounded up to a multiple of 64.",
    )
    rope_theta: float = Field(10000.0, gt=0, description="llama: the base of the rotary position frequencies.")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="What matmuls and activations are computed in. Parameters, optimizer state, anchors and outer "
        "gradients stay float32 either way; bfloat16 uses GPU tensor cores.",
    )
    context_len: int = Field(128, ge=2, description="Longest sequence the model accepts, in tokens.")
    vocab_size: int | None = Field(
        None,
        ge=2,
        description="Token ids the model embeds and predicts. Default: 256 on data.source stdlib or text (bytes), "
        "the dataset's vocabulary on data.source=prepared; a larger value pads it (e.g. to a multiple of 128).",
    )
    tie_embeddings: bool = Field(True, description="Reuse the input embedding as the output layer.")
    remat: Literal["none", "block"] = Field(
        "none",
        description="block: keep only each block's input for the backward pass and recompute the rest there: "
        "activations of about one block instead of all, for about a third more compute a step. "
        "Free to change on resume.",
    )
    init_std: float = Field(0.02, gt=0, description="Standard deviation of the normal initialisation.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.width % self.num_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} does not divide model.width={self.width}: "
                "choose a head count that divides the width"
            )
        if self.num_kv_heads is not None:
            if not ARCHES[self.arch].grouped_query and self.num_kv_heads != self.num_heads:
                grouped = " or ".join(f"model.arch={name}" for name, arch in ARCHES.items() if arch.grouped_query)
                raise ValueError(
                    f"model.num_kv_heads={self.num_kv_heads} needs {grouped}: {self.arch} blocks give every "
                    "query head its own key and value head"
                )
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"model.num_kv_heads={self.num_kv_heads} does not divide model.num_heads={self.num_heads}: "
                    "each key and value head serves the same number of query heads"
                )
        if ARCHES[self.arch].rotary and (self.width // self.num_heads) % 2:
            raise ValueError(
                f"model.width / model.num_heads = {self.width // self.num_heads} is odd: rotary positions "
                f"rotate pairs of each head's dimensions, so a {self.arch} head size must be even"
            )
        return self


class PrepareConfig(Section):
    """How `dlc train` prepares data.path on first use, as `dlc prepare` would."""

    sources: list[str] = Field(
        min_length=1,
        description="What `dlc prepare` reads: files, globs, directories, stdlib, a saved Hugging Face dataset.",
    )
    tokenizer: str = Field("bytes", description="bytes, bpe:N (a byte-level BPE of N tokens), or a tokenizer.json.")
    field: str = Field("text", description="The text field of JSONL records and the column of Parquet and datasets.")


class DataConfig(Section):
    source: Literal["stdlib", "text", "prepared"] = Field(
        "stdlib",
        description="stdlib: the running interpreter's standard-library sources, read as bytes (no download); "
        "text: the files named in data.paths, read as bytes; prepared: the token dataset in data.path "
        "(`dlc prepare`).",
    )
    path: str | None = Field(
        None,
        description="For data.source=prepared: the directory `dlc prepare` wrote (a local path, or one every "
        "node mounts at the same place).",
    )
    prepare: PrepareConfig | None = Field(
        None,
        description="For data.source=prepared: prepare data.path from these sources on first use, when it holds "
        "no dataset yet.",
    )
    paths: list[str] = Field(
        default_factory=list,
        description="Files or glob patterns (** allowed) for data.source=text, read as bytes.",
    )
    max_corpus_bytes: int | None = Field(
        None, ge=1, description="Use at most this many bytes of the corpus (files in order)."
    )
    block_bytes: int = Field(
        4096,
        ge=64,
        description="stdlib and text: corpus block size in bytes; blocks are shuffled and dealt to eval and learners.",
    )
    block_tokens: int = Field(
        4096,
        ge=64,
        description="prepared: the training split is cut into blocks of this many tokens, dealt to the learners "
        "in turn (learner i of n reads blocks i, i + n, ...).",
    )
    eval_fraction: float = Field(
        0.02,
        gt=0,
        lt=0.5,
        description="Fraction held out for eval: of the blocks (stdlib, text), or of the documents when "
        "data.prepare prepares a dataset.",
    )

    @model_validator(mode="after")
    def _source_needs_its_settings(self) -> DataConfig:
        if self.source == "text" and not self.paths:
            raise ValueError("data.source=text needs data.paths: a list of files or globs")
        if self.source == "prepared" and not self.path:
            raise ValueError("data.source=prepared needs data.path: a directory `dlc prepare` wrote")
        if self.source != "prepared" and (self.path or self.prepare):
            which = "data.path" if self.path else "data.prepare"
            raise ValueError(f"{which} is read only with data.source=prepared: set data.source=prepared or drop it")
        return self


class InnerConfig(Section):
    lr: float = Field(3e-3, gt=0, description="Peak AdamW learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final learning rate as a fraction of lr.")
    warmup_steps: int = Field(50, ge=0, description="Linear warm-up steps from 0 to lr.")
    schedule: Literal["cosine", "wsd"] = Field(
        "cosine",
        description="cosine: warm-up, then cosine decay to the final lr over the rest of the schedule; wsd: "
        "warm-up, stable at lr, then a linear decay to the final lr over the last decay_fraction of it.",
    )
    decay_fraction: float = Field(
        0.2, gt=0, le=1, description="wsd: the fraction of the schedule's steps, at its end, that decays."
    )
    schedule_steps: int | None = Field(
        None,
        ge=1,
        description="Length of the schedule in steps. Default: run.max_steps, or derived from "
        "run.max_tokens; required when the run stops only on wall time.",
    )
    z_loss: float = Field(
        0.0,
        ge=0,
        description="Weight of the z-loss, z_loss * mean(logsumexp(logits)^2), added to the training objective "
        "to keep the softmax's normaliser near 1 (PaLM used 1e-4). 0: off. The loss reported is the "
        "cross-entropy alone.",
    )
    weight_decay: float = Field(0.1, ge=0, description="AdamW decoupled weight decay.")
    b1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    b2: float = Field(0.99, ge=0, lt=1, description="AdamW second-moment decay.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    grad_clip_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
