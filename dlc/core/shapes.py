"""The model's sizes its recipe implies: the vocabulary, the heads; its norms' epsilon.

What `dlc.core.model` builds from and what readers of a recipe (export, decoding) need without
building anything; JAX-free. The parameters' names and shapes come from the model itself
(`dlc.core.abstract`).
"""

from __future__ import annotations

from dlc.config.workload import ModelConfig
from dlc.data.corpus import BYTE_VOCAB

NORM_EPS = 1e-6  # flax.nnx.LayerNorm's and RMSNorm's default, which every family's norms use


def vocab_size(model: ModelConfig) -> int:
    """Tokens the model embeds and predicts: model.vocab_size, which a prepared dataset sets
    (`dlc.data.plan.resolve_data`), else every byte value."""
    return model.vocab_size or BYTE_VOCAB


def kv_heads(model: ModelConfig) -> int:
    """Key and value heads per block: fewer than the query heads under grouped-query attention."""
    return model.num_kv_heads or model.num_heads


def head_dim(model: ModelConfig) -> int:
    return model.width // model.num_heads
