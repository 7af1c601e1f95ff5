"""The model's sizes from its recipe alone: its vocabulary, every parameter's name and shape, their count.

The one place that knows what `dlc.core.model.ByteTransformer` holds, without building it: the
memory check (`dlc.plan.memory`) sizes a run before anything is allocated, the bandwidth planner
cuts fragments from these shapes, and `dlc status` counts a recorded run's parameters. None of them
may import JAX, so nothing here does; `tests/unit/core/test_shapes.py` builds the model and compares.

Today every model reads bytes (`vocab_size`) and is the one byte-level transformer (`param_shapes`):
a vocabulary from a tokenizer or another model family is a change to those two functions alone.
"""

from __future__ import annotations

import math

from dlc.config.workload import ModelConfig

BYTE_VOCAB = 256  # the model reads and predicts raw bytes


def vocab_size(model: ModelConfig) -> int:
    """Tokens the model embeds and predicts: every byte value, until a dataset brings its tokenizer."""
    return BYTE_VOCAB


def mlp_hidden(model: ModelConfig) -> int:
    """Width of each block's MLP hidden layer."""
    return model.mlp_ratio * model.width


def param_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, by the path names `dlc.core.model.flatten_params` gives it."""
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


def param_count(model: ModelConfig) -> int:
    return sum(math.prod(shape) for shape in param_shapes(model).values())
