"""The model's arrays read from the model itself: the built model's names and shapes, the bytes a learner holds."""

import subprocess
import sys

import pytest

from dlc.config.load import load_recipe
from dlc.config.workload import ModelConfig
from dlc.core.abstract import learner_arrays, param_count, param_shapes
from dlc.core.shapes import vocab_size
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
    assert list(param_shapes(model).items()) == list(built.items())  # the same names, in the same order


def test_the_count_by_hand():
    # The arithmetic is in tests/unit/core/test_model.py's test_parameter_count_by_hand: width 32, two
    # blocks, tied embeddings 33,920; untied adds the 32 x 256 output layer.
    assert vocab_size(CFG) == 256  # bytes
    assert param_count(CFG) == 33_920
    assert param_count(CFG.model_copy(update={"tie_embeddings": False})) == 33_920 + 32 * 256


def test_a_learners_arrays_by_hand():
    """tiny: float32 parameters, AdamW's two moments, its two step counters (int32) and one float32 lr
    factor a tensor (`steps.scale_by_leaf`); over two fsdp devices the matrices are halved and the rest
    replicated on both; over two data devices all is on both."""
    n = 219_520
    factors = 4 * 44  # tiny's tensors: 10 in each of 4 blocks, 2 embeddings, the final norm's 2
    arrays = learner_arrays(load_recipe(TINY), 0)
    assert (arrays.params, arrays.optimizer) == (4 * n, 2 * 4 * n + 2 * 4 + factors)
    # Of tiny's parameters the vectors that do not split are none: every dimension is 64, 256 or 128.
    fsdp = learner_arrays(load_recipe(TINY, ["learners.devices=2", "learners.mesh={data: 1, fsdp: 2}"]), 0)
    # The counters are replicated; the 44 factors split in two, as any vector of an even length.
    assert fsdp.params == 4 * n and fsdp.optimizer == 2 * 4 * n + 2 * 2 * 4 + factors
    data = learner_arrays(load_recipe(TINY, ["learners.devices=2", "learners.mesh={data: 2, fsdp: 1}"]), 0)
    assert data.params == 2 * 4 * n
    # The activations scale with the batch, and bfloat16's are float32's on a CPU learner.
    double = learner_arrays(load_recipe(TINY, ["learners.batch_size=32"]), 0)
    assert double.activations == 2 * arrays.activations
    bf16 = learner_arrays(load_recipe(TINY, ["model.compute_dtype=bfloat16"]), 0)
    assert bf16.activations == arrays.activations
    assert learner_arrays(load_recipe(TINY, ["model.compute_dtype=bfloat16"]), 0, cpu=False).activations < (
        0.6 * arrays.activations
    )


def test_sizing_a_model_touches_no_device():
    """The driver sizes the run on a machine whose GPUs are the learners': jax.eval_shape only."""
    code = (
        "from dlc.config.load import load_recipe; from dlc.plan.memory import footprint; "
        f"footprint(load_recipe({str(TINY)!r}, ['model.arch=llama'])); "
        "from jax._src import xla_bridge; print(sorted(xla_bridge._backends))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_the_recipe_owners_and_the_readers_import_no_jax():
    modules = "dlc.core.shapes, dlc.plan.memory, dlc.observe.reader, dlc.units"
    code = f"import sys, {modules}; print(sorted({{'jax', 'flax', 'ray'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
