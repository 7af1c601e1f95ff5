"""`dlc prepare` as a user meets it: a summary on success, one `error:` line and exit code 2 on bad
input, and `dlc --help` without the data libraries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlc.data.manifest import read_manifest
from tests.helpers import REPO, assert_user_error, invoke, run_cli

DOCS = [f"document {i}: {'some text ' * (i % 5)}\n" for i in range(100)]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return path


def test_prepare_writes_a_dataset_and_says_what_it_made(tmp_path, corpus):
    result = invoke("prepare", str(corpus), "--out", str(tmp_path / "ds"), "--eval-fraction", "0.1", "--seed", "2")
    assert result.exit_code == 0, result.output
    manifest = read_manifest(tmp_path / "ds")
    assert manifest.seed == 2 and manifest.eval_fraction == 0.1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"prepared {tmp_path / 'ds'}: ") and "from 1 source(s)" in lines[0]
    train = lines[2].split()
    assert train[0] == "train" and train[1:3] == [f"{manifest.train.documents:,}", f"{manifest.train.tokens:,}"]
    assert "tokenizer bytes: 257 tokens, end of document '<|endoftext|>' = 256, stored as uint16" in result.stdout
    assert "tokenizing" in result.stderr  # no terminal: one plain line per phase


def test_prepare_with_a_bpe_in_a_subprocess(tmp_path, corpus):
    result = run_cli(
        "prepare", str(corpus), "-o", str(tmp_path / "ds"), "--tokenizer", "bpe:300", "--workers", "2", timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert read_manifest(tmp_path / "ds").tokenizer.spec == "bpe:300"
    assert "BPE merges" in result.stderr and "tokenizer bpe:300" in result.stdout


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["missing.jsonl"], ["source 'missing.jsonl' matches no file"]),
        (["CORPUS", "--tokenizer", "gpt2"], ["--tokenizer 'gpt2' is not a tokenizer: give bytes, bpe:N"]),
        (["CORPUS", "--tokenizer", "bpe:100"], ["bpe:100 is too small", "at least 257"]),
        (["CORPUS", "--eval-fraction", "0.7"], ["--eval-fraction 0.7 must be above 0 and below 0.5"]),
        (["CORPUS", "--field", "body"], ["docs.jsonl:1: no field 'body'", "pass --field"]),
        (["BAD"], ["bad.jsonl:2: not JSON"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, corpus, args, fragments):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    args = [{"CORPUS": str(corpus), "BAD": str(bad)}.get(a, a) for a in args]
    result = invoke("prepare", *args, "--out", str(tmp_path / "ds"))
    assert_user_error(result, *fragments)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / "ds").exists()


def test_an_existing_dataset_is_kept_unless_overwrite(tmp_path, corpus):
    out = str(tmp_path / "ds")
    assert invoke("prepare", str(corpus), "--out", out).exit_code == 0
    assert_user_error(invoke("prepare", str(corpus), "--out", out), "already holds a prepared dataset", "--overwrite")
    assert invoke("prepare", str(corpus), "--out", out, "--overwrite", "--seed", "9").exit_code == 0
    assert read_manifest(out).seed == 9


def test_hub_source_offline_is_one_error(tmp_path):
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = run_cli("prepare", "hf:someone/no-such-corpus", "--out", str(tmp_path / "ds"), env=offline, timeout=60)
    assert_user_error(result, "Hugging Face hub is switched off here", "save_to_disk")
    assert result.stderr.count("\n") == 1 and not (tmp_path / "ds").exists()


def test_help_imports_no_data_library():
    code = (
        "import sys, dlc.cli.app; "
        "print(sorted({'tokenizers', 'pyarrow', 'datasets', 'concurrent.futures.process'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
    result = run_cli("prepare", "--help")
    assert result.returncode == 0 and "--tokenizer" in result.stdout and "--eval-fraction" in result.stdout
