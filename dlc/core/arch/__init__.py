"""The block families a model can be built of, one module each, found by the name model.arch gives.

`family("llama")` is `dlc.core.arch.llama.FAMILY`. The names a recipe accepts, and what the recipe
checks of each, are `dlc.config.workload.ARCHES`: a new family is its module here and its entry there.
"""

from __future__ import annotations

import importlib

from dlc.config.workload import ModelConfig
from dlc.core.arch.base import Family


def family(arch: str) -> Family:
    """The family model.arch names."""
    found: Family = importlib.import_module(f"{__name__}.{arch}").FAMILY
    return found


def mlp_hidden(cfg: ModelConfig) -> int:
    """Each block's MLP width: model.mlp_hidden, else its family's default."""
    return cfg.mlp_hidden or family(cfg.arch).mlp_hidden(cfg)
