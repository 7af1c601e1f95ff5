"""The model's sizes from its recipe alone: its vocabulary, every parameter's name and shape, their count.

The one place that knows what `dlc.core.model.Transformer` holds, without building it: the
memory check (`dlc.plan.memory`) sizes a run before anything is allocated, the bandwidth planner
cuts fragments from these shapes, and `dlc status` counts a recorded run's parameters. None of them
may import JAX, so nothing here does; `tests/unit/core/test_shapes.py` builds the model and compares.

Every model is a decoder-only transformer of GPT-2's blocks or Llama's (`model.arch`, `param_shapes`),
reading bytes or a prepared dataset's tokens (`vocab_size`).
"""

from __future__ import annotations

import math

from dlc.config.workload import ModelConfig
from dlc.data.corpus import BYTE_VOCAB


def vocab_size(model: ModelConfig) -> int:
    """Tokens the model embeds and predicts: model.vocab_size, which a prepared dataset sets
    (`dlc.data.plan.resolve_data`), else every byte value."""
    return model.vocab_size or BYTE_VOCAB


def mlp_hidden(model: ModelConfig) -> int:
    """Width of each block's MLP hidden layer: model.mlp_hidden, else from mlp_ratio. A SwiGLU MLP (llama) has
    three matrices where GELU's has two, so two thirds of the width keeps the count, rounded up to 64."""
    if model.mlp_hidden is not None:
        return model.mlp_hidden
    if model.arch == "llama":
        return -(-2 * model.mlp_ratio * model.width // (3 * 64)) * 64
    return model.mlp_ratio * model.width


def kv_heads(model: ModelConfig) -> int:
    """Key and value heads per block: fewer than the query heads under grouped-query attention."""
    return model.num_kv_heads or model.num_heads


def head_dim(model: ModelConfig) -> int:
    return model.width // model.num_heads


def param_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, by the path names `dlc.core.model.flatten_params` gives it."""
    if model.arch == "llama":
        return _llama_shapes(model)
    d, hidden, vocab = model.width, mlp_hidden(model), vocab_size(model)
    shapes: dict[str, tuple[int, ...]] = {
        "embed/embedding": (vocab, d),
        "pos_embed/embedding": (model.context_len, d),
        "norm_out/bias": (d,),
        "norm_out/scale": (d,),
    }
    for i in range(model.num_layers):
        block = f"blocks/{i}"
        # Attention projections have no bias; the MLP's layers and the LayerNorms do.
        shapes |= {
            f"{block}/attn/out/kernel": (d, d),
            f"{block}/attn/qkv/kernel": (d, 3 * d),
            f"{block}/mlp/down/bias": (d,),
            f"{block}/mlp/down/kernel": (hidden, d),
            f"{block}/mlp/up/bias": (hidden,),
            f"{block}/mlp/up/kernel": (d, hidden),
            f"{block}/norm_attn/bias": (d,),
            f"{block}/norm_attn/scale": (d,),
            f"{block}/norm_mlp/bias": (d,),
            f"{block}/norm_mlp/scale": (d,),
        }
    if not model.tie_embeddings:  # tied: the output layer is the input embedding, transposed
        shapes["head/kernel"] = (d, vocab)
    return shapes


def _llama_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    # No biases and no position table (rotary positions are computed); RMSNorm has a scale only.
    d, hidden, vocab, kv = model.width, mlp_hidden(model), vocab_size(model), kv_heads(model) * head_dim(model)
    shapes: dict[str, tuple[int, ...]] = {"embed/embedding": (vocab, d), "norm_out/scale": (d,)}
    for i in range(model.num_layers):
        block = f"blocks/{i}"
        shapes |= {
            f"{block}/attn/k/kernel": (d, kv),
            f"{block}/attn/out/kernel": (d, d),
            f"{block}/attn/q/kernel": (d, d),
            f"{block}/attn/v/kernel": (d, kv),
            f"{block}/mlp/down/kernel": (hidden, d),
            f"{block}/mlp/gate/kernel": (d, hidden),
            f"{block}/mlp/up/kernel": (d, hidden),
            f"{block}/norm_attn/scale": (d,),
            f"{block}/norm_mlp/scale": (d,),
        }
    if not model.tie_embeddings:
        shapes["head/kernel"] = (d, vocab)
    return shapes


def param_count(model: ModelConfig) -> int:
    return sum(math.prod(shape) for shape in param_shapes(model).values())
