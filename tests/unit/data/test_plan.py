"""What a run reads, decided before anything starts: the vocabulary from the dataset, every
stream's share, the dataset a recipe prepares on first use."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dlc.config.load import load_recipe
from dlc.data.plan import DataPlan, ensure_prepared, plan_data, planned_vocab, resolve_data
from dlc.data.prepare import prepare
from dlc.data.tokens import EvalSpec, StreamSpec
from dlc.errors import UserError
from tests.helpers import TINY

TINY_BPE = TINY.parent / "tiny-bpe.yaml"


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 documents of ~5 kB: enough for 2 learners of tiny and a held-out split."""
    root = tmp_path_factory.mktemp("texts")
    for i in range(60):
        (root / f"{i:02d}.txt").write_text(" ".join(f"word{(i * 7 + j) % 97} é{j % 13}" for j in range(700)))
    return root


@pytest.fixture(scope="module")
def byte_dataset(texts: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ds") / "bytes"
    prepare([str(texts)], out, tokenizer="bytes", eval_fraction=0.1, workers=1)
    return out


def prepared(path: Path, *extra: str):
    return load_recipe(TINY, ["data.source=prepared", f"data.path={path}", "learners.count=2", *extra])


def test_the_model_takes_its_vocabulary_from_the_dataset(byte_dataset):
    recipe, manifest = resolve_data(prepared(byte_dataset))
    assert manifest is not None and recipe.model.vocab_size == manifest.vocab_size == 257
    padded, _ = resolve_data(prepared(byte_dataset, "model.vocab_size=384"))  # larger: padding, kept
    assert padded.model.vocab_size == 384
    with pytest.raises(UserError, match=r"model.vocab_size=256 is smaller than .* 257 tokens: drop model.vocab_size"):
        resolve_data(prepared(byte_dataset, "model.vocab_size=256"))


def test_a_byte_corpus_keeps_256_tokens():
    recipe, manifest = resolve_data(load_recipe(TINY))
    assert manifest is None and recipe.model.vocab_size is None  # the shapes' default: 256


def test_each_learner_and_joiner_is_sent_a_path_and_an_index(byte_dataset):
    recipe, manifest = resolve_data(prepared(byte_dataset, "learners.join_streams=1"))
    plan = plan_data(recipe, manifest)
    assert plan.streams == tuple(StreamSpec(str(byte_dataset.resolve()), i, 3, 4096) for i in range(3))
    assert isinstance(plan.eval, EvalSpec) and plan.eval.bytes_per_token == manifest.eval.bytes_per_token
    assert plan.bytes_per_token < 1.1  # a byte per token, and an end-of-document token per document
    assert (plan.train_tokens, plan.eval_tokens, plan.tokenizer) == (
        manifest.train.tokens,
        manifest.eval.tokens,
        "bytes",
    )


def test_a_dataset_too_small_for_the_learners_is_refused_before_the_start(byte_dataset):
    # ~420k training tokens are 3 blocks of 131,072: the second joiner's stream gets none.
    recipe, manifest = resolve_data(prepared(byte_dataset, "data.block_tokens=131072"))
    with pytest.raises(UserError, match="too small"):
        plan_data(recipe, manifest)


def test_a_byte_corpus_plan_is_one_token_per_byte():
    recipe = load_recipe(TINY, ["data.max_corpus_bytes=300000", "data.block_bytes=1024"])
    plan = plan_data(recipe)
    assert isinstance(plan, DataPlan) and plan.bytes_per_token == 1.0 and plan.tokenizer == "bytes"
    assert plan.train_tokens + plan.eval_tokens <= 300_000
    assert len(plan.streams) == recipe.learners.count + recipe.learners.join_streams


def test_a_recipe_prepares_its_dataset_on_first_use_only(texts, tmp_path):
    path = tmp_path / "cache" / "bpe"
    recipe = load_recipe(
        TINY_BPE,
        [
            f"data.path={path}",
            f"data.prepare.sources=[{texts}]",
            "data.prepare.tokenizer=bpe:300",
            "data.eval_fraction=0.1",
        ],
    )
    manifest = ensure_prepared(recipe)
    assert manifest is not None and manifest.tokenizer.spec == "bpe:300" and (path / "manifest.json").is_file()
    assert ensure_prepared(recipe) is None  # there now: read, not prepared again
    resolved, _ = resolve_data(recipe)
    assert resolved.model.vocab_size == manifest.vocab_size <= 300
    # Asked for another tokenizer, the cached dataset is refused rather than silently used.
    other = load_recipe(TINY_BPE, [f"data.path={path}", f"data.prepare.sources=[{texts}]"])
    with pytest.raises(UserError, match=r"prepared with tokenizer 'bpe:300', but data.prepare.tokenizer is 'bpe:4096'"):
        ensure_prepared(other)


def test_a_plan_before_the_run_counts_the_vocabulary_the_data_will_have(byte_dataset):
    assert planned_vocab(load_recipe(TINY_BPE)).model.vocab_size == 4096  # not prepared yet: bpe:4096 at most
    assert planned_vocab(prepared(byte_dataset)).model.vocab_size == 257
    assert planned_vocab(load_recipe(TINY)).model.vocab_size is None


def test_bits_per_byte_divide_the_loss_by_the_bytes_a_token_stands_for():
    from dlc.data.plan import bits_per_byte

    assert bits_per_byte(math.log(256)) == pytest.approx(8.0)
    assert bits_per_byte(math.log(2) * 6, bytes_per_token=3.0) == pytest.approx(2.0)
