"""A trained model read back from a run directory's checkpoints, and `dlc sample` on it.

The run directories here are written by hand: a recipe and checkpoints saved the way the syncer
and the learners save them, holding a model whose values the test knows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dlc.config.load import dump_recipe, load_recipe, replaced_overrides
from dlc.core.model import build_model, flatten_params
from dlc.plan.memory import fragment_plan
from dlc.run.checkpoint import Checkpointer
from dlc.use.run_model import load_run_model
from tests.helpers import TINY, assert_user_error, invoke

SMALL = [
    "model.width=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "learners.count=2",
    "syncer.fragments=6",
    "data.max_corpus_bytes=300000",
    "data.block_bytes=1024",
]


def write_run(path: Path, *overrides: str, seed: int = 3, syncer_steps: tuple[int, ...] = (10, 20)) -> dict:
    """A run directory whose syncer checkpoints hold the model built from `seed` (plus step / 1000, so
    checkpoints differ) and whose learner 1 checkpoint holds the model from seed + 1."""
    recipe = load_recipe(TINY, replaced_overrides([*SMALL, f"run.dir={path}"], *overrides))
    path.mkdir(parents=True)
    (path / "recipe.yaml").write_text(dump_recipe(recipe))
    plan = fragment_plan(recipe)
    models = {}
    syncer = Checkpointer(path / "checkpoints" / "syncer", keep=3)
    for step in syncer_steps:
        flat = {k: v + step / 1000 for k, v in flatten_params(build_model(recipe.model, seed)[1]).items()}
        theta = {str(p): plan.gather(flat, p) for p in range(plan.num_fragments)}
        syncer.save(step, {"theta": theta, "momentum": theta}, {"plan": plan.fingerprint(), "versions": [0]})
        models[step] = flat
    syncer.close()
    params = build_model(recipe.model, seed + 1)[1]
    learner = Checkpointer(path / "checkpoints" / "learner-1", keep=3)
    learner.save(7, {"learner": {"params": params}, "sync": {}}, {"step": 7})
    learner.close()
    models["learner"] = flatten_params(params)
    return models


def assert_same(params, flat) -> None:
    got = flatten_params(params)
    assert got.keys() == flat.keys()
    for name, value in flat.items():
        np.testing.assert_array_equal(got[name], value)


def test_the_global_model_is_put_back_together_from_the_syncer_checkpoint(tmp_path):
    models = write_run(tmp_path / "run")
    newest = load_run_model(tmp_path / "run")
    assert newest.source == "the global model of syncer checkpoint 20" and newest.stop_token is None
    assert_same(newest.params, models[20])
    assert_same(load_run_model(tmp_path / "run", checkpoint=10).params, models[10])
    one = load_run_model(tmp_path / "run", learner=1)
    assert one.source == "learner 1's model at its checkpoint 7"
    assert_same(one.params, models["learner"])


def test_sample_streams_text_that_the_seed_decides(tmp_path):
    write_run(tmp_path / "run")
    run = str(tmp_path / "run")
    first = invoke("sample", run, "--prompt", "def ", "-n", "12", "--seed", "5")
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith("def ") and "syncer checkpoint 20 (bytes), up to 12 tokens" in first.stderr
    assert invoke("sample", run, "--prompt", "def ", "-n", "12", "--seed", "5").stdout == first.stdout
    greedy = [invoke("sample", run, "-p", "x", "-n", "8", "-t", "0", "--seed", str(s)).stdout for s in (1, 2)]
    assert greedy[0] == greedy[1]  # temperature 0: the likeliest token, whatever the seed


# (case, arguments after the run directory, fragments of the one error line)
BAD = [
    ("prompt-beyond-context", ["--prompt", "x" * 64], ["--prompt is 64 tokens", "model.context_len", "shorten"]),
    ("no-such-checkpoint", ["--checkpoint", "15"], ["no checkpoint 15", "it holds 10, 20"]),
    ("learner-out-of-range", ["--learner", "5"], ["--learner 5", "learners 0 to 1"]),
    ("learner-without-checkpoint", ["--learner", "0"], ["no checkpoint in", "learner-0"]),
    ("negative-temperature", ["-t", "-1"], ["--temperature=-1.0", "0 (greedy) or more"]),
    ("no-tokens", ["-n", "0"], ["--max-tokens=0", "at least 1"]),
    ("top-k-zero", ["--top-k", "0"], ["--top-k=0"]),
]


@pytest.mark.parametrize(("args", "fragments"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_sample_refuses_bad_input_in_one_line(args, fragments, tmp_path):
    write_run(tmp_path / "run")
    assert_user_error(invoke("sample", str(tmp_path / "run"), *args), *fragments)


def test_a_run_without_a_checkpoint_yet_or_a_global_model_is_refused(tmp_path):
    write_run(tmp_path / "early", syncer_steps=())
    assert_user_error(invoke("sample", str(tmp_path / "early")), "no checkpoint in", "has not saved one yet")
    write_run(tmp_path / "none", "algorithm=none", syncer_steps=())
    assert_user_error(invoke("sample", str(tmp_path / "none")), "algorithm=none", "pass --learner I")


def last_json(result) -> dict:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eval_scores_the_held_out_split_as_the_runs_evaluations_do(tmp_path):
    from dlc.core.evaluate import Evaluator
    from dlc.data.plan import plan_data

    write_run(tmp_path / "run")
    model = load_run_model(tmp_path / "run")
    graphdef, _ = build_model(model.recipe.model, 0)
    expected, expected_bpb = Evaluator(model.recipe, graphdef, plan_data(model.recipe).eval)(model.params)
    result = last_json(invoke("eval", str(tmp_path / "run")))
    assert result["loss"] == pytest.approx(expected, abs=1e-5)
    assert result["bits_per_byte"] == pytest.approx(expected_bpb, abs=1e-5)
    assert result["data"] == "the run's held-out split" and result["bytes_per_token"] == 1.0


def test_eval_reads_any_text_with_the_runs_tokenizer(tmp_path):
    write_run(tmp_path / "run")
    (tmp_path / "a.txt").write_text("héllo world " * 100)  # 1,300 bytes: 20 windows of 64, 16 to a batch
    result = last_json(invoke("eval", str(tmp_path / "run"), "--data", str(tmp_path / "a.txt")))
    assert result["tokens"] == 20 * 64 and result["bytes_per_token"] == 1.0
    assert result["bits_per_byte"] == pytest.approx(result["loss"] / math.log(2))


def test_eval_reads_another_runs_held_out_split(tmp_path):
    write_run(tmp_path / "run")
    write_run(tmp_path / "other", "run.seed=1")  # another split of the same corpus
    own = last_json(invoke("eval", str(tmp_path / "run")))
    other = last_json(invoke("eval", str(tmp_path / "run"), "--data", str(tmp_path / "other")))
    assert other["data"] == f"the held-out split of run {tmp_path / 'other'}" and other["loss"] != own["loss"]
    assert other["tokens"] == own["tokens"]  # the same windows: eval.batches x eval.batch_size x seq_len


EVAL_BAD = [
    ("data-matches-nothing", lambda tmp: ["--data", str(tmp / "none*.txt")], ["matches no"]),
    ("data-too-short", lambda tmp: ["--data", str(_text(tmp, "short"))], ["fewer than one window"]),
    ("dataset-of-a-larger-vocabulary", lambda tmp: ["--data", str(_bytes_dataset(tmp))], ["vocabulary of 257"]),
]


def _text(tmp: Path, text: str) -> Path:
    (tmp / "t.txt").write_text(text)
    return tmp / "t.txt"


def _bytes_dataset(tmp: Path) -> Path:
    from dlc.data.prepare import prepare

    for i in range(20):
        (tmp / f"d{i}.txt").write_text(f"document {i} " * 50)
    prepare([str(tmp / "d*.txt")], tmp / "ds", tokenizer="bytes", eval_fraction=0.3, workers=1)
    return tmp / "ds"


@pytest.mark.parametrize(("make", "fragments"), [c[1:] for c in EVAL_BAD], ids=[c[0] for c in EVAL_BAD])
def test_eval_refuses_bad_data_in_one_line(make, fragments, tmp_path):
    write_run(tmp_path / "run")
    assert_user_error(invoke("eval", str(tmp_path / "run"), *make(tmp_path)), *fragments)
