"""The model's sizes its recipe implies: the vocabulary, the MLP's width, the heads.

What `dlc.core.model` builds from and what readers of a recipe (export, decoding) need without
building anything; JAX-free. The parameters' names and shapes come from the model itself
(`dlc.core.abstract`).
"""

from __future__ import annotations

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
