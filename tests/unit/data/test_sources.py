"""Sources: each kind resolved and read (files made here), globs and directories in order, bad lines
named by file and line, missing columns caught before reading, undecodable text counted."""

from __future__ import annotations

import gzip
import hashlib
import json
import re

import pytest

from dlc.data.sources import Reading, Source, resolve_sources
from dlc.errors import UserError


def read(sources: list[Source]) -> tuple[list[str], Reading]:
    reading = Reading()
    return [doc for source in sources for doc in source.documents(reading)], reading


def jsonl(records: list[object]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def test_text_file_is_one_document(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("line one\nline two\n")
    [source] = resolve_sources([str(path)], "text")
    assert (source.name, source.kind, source.size) == (str(path), "text", 18)
    assert source.sha256() == hashlib.sha256(path.read_bytes()).hexdigest()
    docs, reading = read([source])
    assert docs == ["line one\nline two\n"] and reading.bytes_read == 18 and reading.replaced == 0


def test_glob_is_sorted_and_recursive(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt", "sub/deeper/d.txt", "skip.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    sources = resolve_sources([str(tmp_path / "**" / "*.txt")], "text")
    assert [s.name for s in sources] == [str(tmp_path / n) for n in ("a.txt", "b.txt", "sub/c.txt", "sub/deeper/d.txt")]
    with pytest.raises(UserError, match=r"source '.*\*\.csv' matches no file"):
        resolve_sources([str(tmp_path / "*.csv")], "text")
    with pytest.raises(UserError, match="'missing.txt' matches no file"):
        resolve_sources(["missing.txt"], "text")


def test_directory_reads_each_file_by_its_extension(tmp_path):
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("bee")
    (root / "a.jsonl").write_bytes(jsonl([{"text": "one"}, {"text": "two"}]))
    (root / "sub" / "c.jsonl.gz").write_bytes(gzip.compress(jsonl([{"text": "three"}])))
    (root / ".hidden").write_text("never read")
    [source] = resolve_sources([str(root)], "text")
    # a.jsonl, b.txt, sub/c.jsonl.gz: sorted by relative path; JSONL holds most of the bytes
    assert read([source])[0] == ["one", "two", "bee", "three"]
    assert source.kind == "jsonl" and source.name == str(root)
    before = source.sha256()
    assert before == resolve_sources([str(root)], "text")[0].sha256()
    (root / "b.txt").rename(root / "b2.txt")  # same bytes, another name: another hash
    assert resolve_sources([str(root)], "text")[0].sha256() != before


def test_directory_leaves_out_the_output_directory(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train-00000.bin").write_bytes(b"\x00\x01")
    [source] = resolve_sources([str(tmp_path)], "text", exclude=tmp_path / "out")
    assert read([source])[0] == ["a"]


@pytest.mark.parametrize("name", ["data.jsonl", "data.jsonl.gz", "data.json.gz"])
def test_jsonl_gives_a_document_per_line(tmp_path, name):
    raw = jsonl([{"text": "first", "id": 1}, {"text": ""}, {"text": "ünïcode"}]) + b"\n   \n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    [source] = resolve_sources([str(path)], "text")
    docs, reading = read([source])
    assert source.kind == "jsonl" and docs == ["first", "", "ünïcode"]  # blank lines skipped; empty kept
    assert reading.bytes_read == path.stat().st_size


@pytest.mark.parametrize("name", ["bom.jsonl", "bom.jsonl.gz"])
def test_jsonl_that_begins_with_a_byte_order_mark_is_read(tmp_path, name):
    raw = b"\xef\xbb\xbf" + jsonl([{"text": "first"}, {"text": "second"}])
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    assert read(resolve_sources([str(path)], "text"))[0] == ["first", "second"]


def test_jsonl_other_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(jsonl([{"content": "x", "text": 5}]))
    assert read(resolve_sources([str(path)], "content"))[0] == ["x"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "an array, not a JSON object"),
        ('{"body": "x"}', "no field 'text' (its fields: 'body'): pass --field"),
        ('{"text": 3}', "field 'text' is a number, not a string"),
        ('{"text": null}', "field 'text' is null, not a string"),
    ],
)
def test_bad_jsonl_line_is_named_by_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n\n' + line + "\n")
    [source] = resolve_sources([str(path)], "text")
    with pytest.raises(UserError, match=f"{re.escape(str(path))}:3: .*{re.escape(message)}"):
        read([source])


def test_undecodable_text_is_replaced_and_counted(tmp_path):
    text = tmp_path / "broken.txt"
    # \xff and \xfe are no UTF-8: 2 replaced; the U+FFFD already written there is not counted
    text.write_bytes(b"ok \xff\xfe then \xef\xbf\xbd done")
    lines = tmp_path / "broken.jsonl"
    # a bad byte inside a JSON string, and an escaped lone surrogate, which is no character
    lines.write_bytes(b'{"text": "a\xc3b"}\n{"text": "x\\ud800y \\ud83d\\ude00"}\n')
    docs, reading = read(resolve_sources([str(text), str(lines)], "text"))
    assert docs == ["ok \ufffd\ufffd then \ufffd done", "a\ufffdb", "x\ufffdy 😀"]
    assert reading.replaced == 4


def write_parquet(path, columns: dict, row_group_size: int = 2) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)


def test_parquet_column(tmp_path):
    path = tmp_path / "d.parquet"
    write_parquet(path, {"id": [1, 2, 3, 4, 5], "text": ["a", None, "ccc", "", "é"]})
    [source] = resolve_sources([str(path)], "text")
    docs, reading = read([source])
    assert source.kind == "parquet" and docs == ["a", "", "ccc", "", "é"]  # a null is an empty document
    assert reading.bytes_read == path.stat().st_size


def test_parquet_without_the_column_is_refused_before_reading(tmp_path):
    path = tmp_path / "d.parquet"
    write_parquet(path, {"id": [1], "body": ["x"]})
    with pytest.raises(UserError, match=r"has no column 'text'; its columns: id, body: pass --field"):
        resolve_sources([str(path)], "text")
    with pytest.raises(UserError, match="column 'id' holds int64, not text"):
        resolve_sources([str(path)], "id")


def test_saved_hf_dataset(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["one", "", "three"], "n": [1, 2, 3]}).save_to_disk(tmp_path / "ds")
    [source] = resolve_sources([str(tmp_path / "ds")], "text")
    docs, reading = read([source])
    assert source.kind == "hf_disk" and docs == ["one", "", "three"]
    assert source.size == reading.bytes_read == 8  # text bytes: 3 + 0 + 5
    assert len(source.sha256()) == 64
    with pytest.raises(UserError, match=r"has no column 'body'; its columns: text, n"):
        resolve_sources([str(tmp_path / "ds")], "body")


def test_saved_hf_dataset_dict_uses_train(tmp_path):
    import datasets

    split = datasets.Dataset.from_dict
    datasets.DatasetDict({"train": split({"text": ["t"]}), "test": split({"text": ["e"]})}).save_to_disk(
        tmp_path / "dd"
    )
    assert read(resolve_sources([str(tmp_path / "dd")], "text"))[0] == ["t"]
    datasets.DatasetDict({"validation": split({"text": ["v"]})}).save_to_disk(tmp_path / "nt")
    with pytest.raises(UserError, match="splits validation and no 'train'"):
        resolve_sources([str(tmp_path / "nt")], "text")


def test_stdlib_resolves_to_the_standard_library(tmp_path):
    [source] = resolve_sources(["stdlib"], "text")
    assert source.kind == "stdlib" and source.size > 1_000_000
    first = next(iter(source.documents(Reading())))  # one file read, not the whole library
    assert isinstance(first, str) and first


def test_hub_unreachable_is_one_error_fast(monkeypatch):
    # a closed local port instead of the hub: the check fails at once, with a way to do it instead
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(UserError, match=r"cannot be reached from here: download it .*save_to_disk"):
        resolve_sources(["hf:someone/corpus:validation"], "text")


def test_no_source_given():
    with pytest.raises(UserError, match="no source given"):
        resolve_sources([], "text")
