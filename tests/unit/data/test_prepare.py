"""`prepare`: the shards hold every document's tokens and an end token, split by document; the
output is the same for any worker count; bad input is refused before writing, and a failed or
interrupted prepare leaves nothing behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlc.data import prepare as prepare_module
from dlc.data.manifest import MANIFEST_FILE, Manifest, read_manifest
from dlc.data.prepare import Progress, held_out, prepare
from dlc.data.tokenizer import Tokenizer
from dlc.errors import UserError
from tests.helpers import REPO, snapshot

# Every document says which it is, so a token sequence says which documents it holds.
DOCS = [f"document {i}: {'lorem ipsum ' * (i % 7)}ünï {i * i}\n" for i in range(120)]

ONE_SHARD_EACH = ["eval-00000.bin", MANIFEST_FILE, "tokenizer.json", "train-00000.bin"]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def split_tokens(out: Path, manifest: Manifest, split: str) -> np.ndarray:
    info = manifest.split(split)
    parts = [np.fromfile(out / s.file, dtype=np.dtype(manifest.dtype).newbyteorder("<")) for s in info.shards]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=manifest.dtype)


def expected_bytes(docs: list[str]) -> list[int]:
    return [t for d in docs for t in [*d.encode(), 256]]


def test_bytes_dataset_holds_each_split_s_documents_in_order(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS[:50] + [""] + DOCS[50:])  # an empty document: skipped
    events: list[Progress] = []
    manifest = prepare([str(src)], tmp_path / "out", eval_fraction=0.1, seed=3, on_progress=events.append)
    out = tmp_path / "out"
    assert read_manifest(out) == manifest
    held = [held_out(3, i, 0.1) for i in range(len(DOCS))]  # numbered without the empty one
    train_docs = [d for d, h in zip(DOCS, held, strict=True) if not h]
    eval_docs = [d for d, h in zip(DOCS, held, strict=True) if h]
    assert 0 < len(eval_docs) < len(DOCS) // 4
    assert split_tokens(out, manifest, "train").tolist() == expected_bytes(train_docs)
    assert split_tokens(out, manifest, "eval").tolist() == expected_bytes(eval_docs)
    assert (manifest.train.documents, manifest.eval.documents) == (len(train_docs), len(eval_docs))
    assert manifest.train.text_bytes == sum(len(d.encode()) for d in train_docs)  # UTF-8 bytes, not characters
    assert manifest.train.tokens == manifest.train.text_bytes + len(train_docs)
    assert manifest.skipped_documents == 1 and manifest.replaced_characters == 0
    assert manifest.dtype == "uint16" and manifest.tokenizer.spec == "bytes" and manifest.tokenizer.eos_id == 256
    [source] = manifest.sources
    assert (source.kind, source.documents, source.bytes) == ("jsonl", 120, src.stat().st_size)
    assert source.tokens == manifest.train.tokens + manifest.eval.tokens
    assert sorted(p.name for p in out.iterdir()) == ONE_SHARD_EACH
    assert Tokenizer.from_file(out / "tokenizer.json", spec=manifest.tokenizer.spec).vocab_size == 257
    last = events[-1]
    assert (last.phase, last.done, last.total) == ("tokenize", source.bytes, source.bytes)
    assert last.tokens == source.tokens and last.text_bytes == manifest.train.text_bytes + manifest.eval.text_bytes


def test_shards_cut_every_shard_tokens_and_documents_span_them(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS[:30])
    manifest = prepare([str(src)], tmp_path / "out", shard_tokens=100, eval_fraction=0.2)
    shards = manifest.train.shards
    assert [s.file for s in shards] == [f"train-{i:05d}.bin" for i in range(len(shards))]
    assert all(s.tokens == 100 for s in shards[:-1]) and 0 < shards[-1].tokens <= 100
    for shard in shards:
        assert (tmp_path / "out" / shard.file).stat().st_size == 2 * shard.tokens
    # one stream across the cuts: the documents' bytes, each followed by the end token
    train_docs = [d for i, d in enumerate(DOCS[:30]) if not held_out(0, i, 0.2)]
    assert split_tokens(tmp_path / "out", manifest, "train").tolist() == expected_bytes(train_docs)
    assert split_tokens(tmp_path / "out", manifest, "train")[99] != 256  # the first cut falls inside a document


def test_split_is_by_document_deterministic_and_seeded(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)

    def eval_set(seed: int, name: str) -> set[str]:
        manifest = prepare([str(src)], tmp_path / name, seed=seed, eval_fraction=0.1)
        ids = split_tokens(tmp_path / name, manifest, "eval").tolist()
        text = bytes(t for t in ids if t != 256).decode()
        train = bytes(t for t in split_tokens(tmp_path / name, manifest, "train").tolist() if t != 256).decode()
        held = {d for d in DOCS if d in text}
        assert held and not any(d in train for d in held)  # a held-out document is never trained on
        return held

    first = eval_set(0, "a")
    assert eval_set(0, "b") == first and eval_set(1, "c") != first


def test_held_out_is_a_fixed_hash():
    # Fixed numbers: a different Python, process or platform holds out the same documents.
    assert [i for i in range(40) if held_out(0, i, 0.1)] == [i for i in range(40) if held_out(0, i, 0.1)]
    assert sum(held_out(5, i, 0.25) for i in range(4000)) in range(900, 1100)  # about a quarter
    code = "from dlc.data.prepare import held_out; print([i for i in range(200) if held_out(7, i, 0.05)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert other.stdout.strip() == str([i for i in range(200) if held_out(7, i, 0.05)])


def test_workers_give_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "BATCH_TEXT_BYTES", 4096)  # many batches of a small corpus
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS * 20)
    kwargs = {"tokenizer": "bpe:300", "eval_fraction": 0.05, "shard_tokens": 5000}
    events: list[Progress] = []
    one = prepare([str(src)], tmp_path / "one", workers=1, **kwargs)
    two = prepare([str(src)], tmp_path / "two", workers=2, on_progress=events.append, **kwargs)
    assert len(one.train.shards) > 1 and events[-1].workers == 2
    assert one.model_copy(update={"created": ""}) == two.model_copy(update={"created": ""})
    files_one, files_two = snapshot(tmp_path / "one"), snapshot(tmp_path / "two")
    del files_one[MANIFEST_FILE], files_two[MANIFEST_FILE]
    assert files_one == files_two


def test_bpe_trains_on_the_training_split_only(tmp_path):
    # Held-out documents repeat a word the training documents never use: no merge may spell it.
    docs = [f"plain words number {i} again and again\n" for i in range(60)]
    held = [i for i in range(60) if held_out(0, i, 0.2)]
    for i in held:
        docs[i] = "qzxjv " * 50
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    events: list[Progress] = []
    manifest = prepare([str(src)], tmp_path / "out", tokenizer="bpe:400", eval_fraction=0.2, on_progress=events.append)
    tok = Tokenizer.from_file(tmp_path / "out" / "tokenizer.json")
    assert manifest.tokenizer.spec == "bpe:400" and manifest.vocab_size == tok.vocab_size <= 400
    assert not [t for t in tok._hf.get_vocab() if "qz" in t or "zx" in t or "xj" in t]
    assert len(tok.encode_batch(["plain words number"])[0]) < 6
    assert {e.phase for e in events} == {"bpe", "tokenize"}


def test_bpe_sample_is_capped(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    events: list[Progress] = []
    prepare([str(src)], tmp_path / "out", tokenizer="bpe:300", bpe_sample_bytes=500, on_progress=events.append)
    bpe = [e for e in events if e.phase == "bpe"]
    assert bpe[-1].total == 500 and 500 <= bpe[-1].text_bytes < 500 + 4  # the last document cut to fit


def test_path_tokenizer(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    prepare([str(src)], tmp_path / "a", tokenizer="bpe:300")
    # the first dataset's tokenizer, read from its directory: the same tokens
    events: list[Progress] = []
    manifest = prepare([str(src)], tmp_path / "b", tokenizer=str(tmp_path / "a"), workers=2, on_progress=events.append)
    assert events[-1].workers == 1  # one batch of text: no pool for it
    assert manifest.tokenizer.spec == str(tmp_path / "a" / "tokenizer.json")
    assert manifest.tokenizer.eos_token == "<|endoftext|>"
    assert snapshot(tmp_path / "b")["train-00000.bin"] == snapshot(tmp_path / "a")["train-00000.bin"]


# -- bad input, and what is left behind -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (["missing.txt"], {}, "'missing.txt' matches no file"),
        (["SRC"], {"tokenizer": "gpt2"}, "bytes, bpe:N or a path"),
        (["SRC"], {"tokenizer": "bpe:100"}, "at least 257"),
        (["SRC"], {"eval_fraction": 0.5}, "--eval-fraction 0.5 must be above 0 and below 0.5"),
        (["SRC"], {"eval_fraction": 0.0}, "must be above 0"),
        (["SRC"], {"shard_tokens": 0}, "--shard-tokens 0 must be at least 1"),
        (["PARQUET"], {}, "has no column 'text'; its columns: body"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, args, kwargs, message):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "d.parquet")
    args = [{"SRC": str(src), "PARQUET": str(tmp_path / "d.parquet")}.get(a, a) for a in args]
    with pytest.raises(UserError, match=message):
        prepare(args, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_a_bad_line_found_midway_removes_what_was_written(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", DOCS * 20)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + "oops\n")
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty"):
        with pytest.raises(UserError, match=f"{bad}:2: not JSON"):
            prepare([str(good), str(bad)], out, shard_tokens=1000)
    assert not (tmp_path / "new").exists() and list((tmp_path / "empty").iterdir()) == []


def test_no_held_out_document_is_an_error(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("a single document")
    with pytest.raises(UserError, match=r"1 non-empty document\(s\) .* none was held out for eval: add documents"):
        prepare([str(one)], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_interrupt_removes_what_was_written(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS * 20)

    def interrupt(progress: Progress) -> None:
        assert (tmp_path / "out" / "tokenizer.json").exists()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare([str(src)], tmp_path / "out", on_progress=interrupt)
    assert not (tmp_path / "out").exists()


def test_a_killed_prepare_leaves_no_dataset(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS * 20)
    code = (
        "import os, signal, sys\n"
        "from dlc.data.prepare import prepare\n"
        "def kill(progress):\n"
        "    if progress.tokens:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        f"prepare([{str(src)!r}], {str(tmp_path / 'out')!r}, shard_tokens=1000, on_progress=kill)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert any(p.suffix == ".bin" for p in (tmp_path / "out").iterdir())  # it got as far as writing shards
    with pytest.raises(UserError, match="holds no manifest.json"):
        read_manifest(tmp_path / "out")
    # and the next prepare into it takes the leftovers for its own
    manifest = prepare([str(src)], tmp_path / "out", shard_tokens=1000)
    assert read_manifest(tmp_path / "out") == manifest


def test_output_directory_rules(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    out = tmp_path / "out"
    first = prepare([str(src)], out, shard_tokens=1000)
    with pytest.raises(UserError, match="already holds a prepared dataset.*--overwrite replaces it"):
        prepare([str(src)], out)
    assert read_manifest(out) == first  # untouched
    second = prepare([str(src)], out, overwrite=True, seed=1)  # fewer, larger shards: the old ones go
    assert second.seed == 1 and len(list(out.glob("*.bin"))) == len(second.train.shards) + len(second.eval.shards)
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    with pytest.raises(UserError, match="holds 'notes.txt', which dlc prepare did not write"):
        prepare([str(src)], out, overwrite=True)
    assert snapshot(out) == before  # nothing removed, even with --overwrite
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a directory"):
        prepare([str(src)], tmp_path / "file")


def test_leftovers_of_an_unfinished_prepare_are_cleaned_and_reused(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("train-00000.bin", "train-00007.bin", "eval-00000.bin", "tokenizer.json", ".manifest.json.tmp"):
        (out / name).write_bytes(b"stale")
    manifest = prepare([str(src)], out)
    assert sorted(p.name for p in out.iterdir()) == ONE_SHARD_EACH
    assert (out / "train-00000.bin").stat().st_size == 2 * manifest.train.tokens


def test_replaced_characters_reach_the_manifest(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"fine text \xff\xfe and more")
    (tmp_path / "b.txt").write_bytes("another document, already \ufffd".encode())
    write_jsonl(tmp_path / "c.jsonl", DOCS)
    manifest = prepare([str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), str(tmp_path / "c.jsonl")], tmp_path / "o")
    assert manifest.replaced_characters == 2
    assert [s.kind for s in manifest.sources] == ["text", "text", "jsonl"]
    assert sum(s.tokens for s in manifest.sources) == manifest.train.tokens + manifest.eval.tokens
