"""A trained model read back from a run directory: the global model of a syncer checkpoint, or a learner's.

The syncer's checkpoint holds the global model as one float32 vector per fragment of its plan
(`theta`); cut from the recipe's own parameter shapes into that many fragments, the plan puts every
value back in place, and its fingerprint, saved with the checkpoint, says the cut is the same. A
learner's checkpoint holds its parameters whole. Either is read as saved, while the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from flax import nnx

from dlc.config.load import recipe_from_dict
from dlc.config.schema import Recipe
from dlc.core.abstract import abstract_params, param_shapes
from dlc.core.fragments import FragmentPlan
from dlc.core.model import Params, flatten_params, unflatten_params
from dlc.data.manifest import TOKENIZER_FILE, read_manifest
from dlc.data.tokenizer import Tokenizer, bytes_tokenizer
from dlc.data.tokens import local_path
from dlc.errors import UserError
from dlc.run.checkpoint import read_checkpoint
from dlc.run.files import RECIPE_FILE
from dlc.run.storage import RunStorage, is_url


@dataclass(frozen=True)
class RunModel:
    """The parameters, the recipe they were trained with, what they are, and the run's tokenizer."""

    recipe: Recipe
    graphdef: nnx.GraphDef  # the model's structure: `apply_model(graphdef, params, tokens)`
    params: Params
    source: str  # e.g. "the global model of syncer checkpoint 600"
    tokenizer: Tokenizer
    stop_token: int | None  # the end-of-document token, where the model learned one


def run_recipe(run: Path) -> Recipe:
    """The recipe a run directory recorded, its model's vocabulary resolved."""
    try:
        data = yaml.safe_load((run / RECIPE_FILE).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(
            f"{str(run / RECIPE_FILE)!r} cannot be read ({exc}): pass a run directory dlc train made"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{str(run / RECIPE_FILE)!r} is not a recipe: pass a run directory dlc train made")
    return recipe_from_dict(data, origin=str(run / RECIPE_FILE))


def run_tokenizer(recipe: Recipe) -> tuple[Tokenizer, int | None]:
    """The tokenizer the run's data was made with, and its end-of-document token (None for a byte corpus)."""
    if recipe.data.source != "prepared":
        return bytes_tokenizer(), None  # a byte corpus: ids are bytes, and no end-of-document token
    assert recipe.data.path is not None
    path = local_path(recipe.data.path)
    manifest = read_manifest(path)
    tokenizer = Tokenizer.from_file(
        path / TOKENIZER_FILE, spec=manifest.tokenizer.spec, eos=manifest.tokenizer.eos_token
    )
    return tokenizer, manifest.tokenizer.eos_id


def load_run_model(run: Path, checkpoint: int | None = None, learner: int | None = None) -> RunModel:
    """The global model of the run's newest (or `checkpoint`) syncer checkpoint, or learner `learner`'s."""
    recipe = run_recipe(run)
    location = recipe.run.dir if recipe.run.dir and is_url(recipe.run.dir) else str(run.resolve())
    storage = RunStorage(location)
    graphdef, like = abstract_params(recipe.model)  # the structure alone: every value is read
    if learner is not None:
        if not 0 <= learner < recipe.learners.count:
            raise UserError(f"--learner {learner}: the run has learners 0 to {recipe.learners.count - 1}")
        tree, _, step = read_checkpoint(storage.learner_dir(learner), checkpoint)
        params = _learner_params(tree, like, storage.learner_dir(learner))
        source = f"learner {learner}'s model at its checkpoint {step}"
    else:
        if recipe.algorithm == "none":
            raise UserError(
                "the run trained with algorithm=none, which has no global model: pass --learner I for one learner's"
            )
        tree, meta, step = read_checkpoint(storage.syncer_dir(), checkpoint)
        params = _global_params(recipe, tree, meta, like, storage.syncer_dir())
        source = f"the global model of syncer checkpoint {step}"
    tokenizer, stop = run_tokenizer(recipe)
    return RunModel(recipe, graphdef, params, source, tokenizer, stop)


def _global_params(recipe: Recipe, tree: Any, meta: dict[str, Any], like: Params, where: Any) -> Params:
    theta = tree.get("theta") if isinstance(tree, dict) else None
    if not isinstance(theta, dict) or not theta:
        raise UserError(f"the syncer checkpoint in {where} holds no global model (no theta): is it a dlc run's?")
    plan = FragmentPlan.build(param_shapes(recipe.model), len(theta))
    if meta.get("plan") != plan.fingerprint():
        raise UserError(
            f"the syncer checkpoint in {where} was cut into fragments that the run's recipe.yaml does not give: "
            "was recipe.yaml edited after the run?"
        )
    vectors = [np.asarray(theta[str(p)], dtype=np.float32) for p in range(len(theta))]
    return unflatten_params(plan.assemble(vectors, flatten_params(like)), like)


def _learner_params(tree: Any, like: Params, where: Any) -> Params:
    params = tree.get("learner", {}).get("params") if isinstance(tree, dict) else None
    if not isinstance(params, dict):
        raise UserError(f"the learner checkpoint in {where} holds no parameters: is it a dlc run's?")
    flat, expected = flatten_params(params), flatten_params(like)
    if {k: np.shape(v) for k, v in flat.items()} != {k: np.shape(v) for k, v in expected.items()}:
        raise UserError(f"the learner checkpoint in {where} does not fit the run's recipe.yaml: was it edited?")
    return unflatten_params({k: np.asarray(v, dtype=np.float32) for k, v in flat.items()}, like)
