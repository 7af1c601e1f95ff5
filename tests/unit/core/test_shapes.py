"""The model's shapes from its recipe alone: the same names and shapes as the built model, by hand, JAX-free."""

import subprocess
import sys

import pytest

from dlc.config.load import load_recipe
from dlc.config.workload import ModelConfig
from dlc.core.shapes import param_count, param_shapes, vocab_size
from tests.helpers import REPO, TINY

CFG = ModelConfig(width=32, num_layers=2, num_heads=4, mlp_ratio=4, context_len=16)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["model.tie_embeddings=false", "model.num_layers=11", "model.mlp_ratio=3"],
        ["model.arch=llama"],
        ["model.arch=llama", "model.num_kv_heads=1", "model.tie_embeddings=false", "model.mlp_hidden=100"],
    ],
    ids=["tied", "untied", "llama", "llama-gqa-untied"],
)
def test_the_shapes_are_the_built_models(overrides):
    from dlc.core.model import build_model, flatten_params

    model = load_recipe(TINY, overrides).model
    built = {name: tuple(v.shape) for name, v in flatten_params(build_model(model, 0)[1]).items()}
    assert param_shapes(model) == built


def test_the_count_by_hand():
    # The arithmetic is in tests/unit/core/test_model.py's test_parameter_count_by_hand: width 32, two
    # blocks, tied embeddings 33,920; untied adds the 32 x 256 output layer.
    assert vocab_size(CFG) == 256  # bytes
    assert param_count(CFG) == 33_920
    assert param_count(CFG.model_copy(update={"tie_embeddings": False})) == 33_920 + 32 * 256


def test_the_shape_owner_and_its_users_import_no_jax():
    modules = "dlc.core.shapes, dlc.plan.memory, dlc.units"
    code = f"import sys, {modules}; print(sorted({{'jax', 'flax', 'ray'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
