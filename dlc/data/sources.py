"""Sources of `dlc prepare`: what each argument names, and the documents (strings) read from it.

An argument is `stdlib` (the interpreter's standard library, a document per file), `hf:NAME[:SPLIT]`
(a Hugging Face hub dataset), a saved Hugging Face dataset directory, another directory (its files,
recursively, hidden ones left out), a file or a glob (sorted, `**` recursive). A file is read by its
extension: `.jsonl`, `.jsonl.gz`, `.json.gz` give a document per line (its `--field`), `.parquet` a
document per row (its `--field` column), anything else is one document of text.

Everything that can be checked without reading the documents (files exist, Parquet and dataset
columns) is checked when the arguments are resolved, before anything is written. Undecodable text
becomes U+FFFD and is counted, never an error.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import sysconfig
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dlc.data import hub
from dlc.data.manifest import SourceKind
from dlc.errors import UserError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz")
DATA_EXTRA = "pip install 'dlc[data]'"
_READ_CHUNK = 1 << 20
_REPLACEMENT = b"\xef\xbf\xbd"  # U+FFFD in UTF-8: already in the input, so not counted as replaced
_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}

FileKind = Literal["text", "jsonl", "parquet"]


@dataclass
class Reading:
    """What one pass over the sources has counted so far."""

    bytes_read: int = 0  # of the sources' `size`: on disk, or the text of a dataset
    replaced: int = 0  # undecodable characters replaced by U+FFFD
    skipped: int = 0  # empty documents, left out (counted by whoever leaves them out)


class Source:
    """One resolved source argument (a glob gives one per match)."""

    name: str
    kind: SourceKind
    size: int  # bytes: on disk, or the text of a dataset

    def documents(self, reading: Reading) -> Generator[str, None, None]:
        """Its documents in order, empty ones included; counts into `reading` as it goes."""
        raise NotImplementedError

    def sha256(self) -> str:
        raise NotImplementedError


# -- resolving arguments ---------------------------------------------------------------------------


def resolve_sources(args: list[str], field: str, exclude: Path | None = None) -> list[Source]:
    """The sources the arguments name, in order; files under `exclude` (the output) are left out."""
    if not args:
        raise UserError("no source given: name text files, JSONL or Parquet files, a directory, stdlib or hf:NAME")
    sources: list[Source] = []
    for arg in args:
        if arg == "stdlib":
            sources.append(_stdlib(field))
        elif arg.startswith("hf:"):
            sources.append(_hub(arg, field))
        else:
            sources.extend(_paths(arg, field, exclude))
    return sources


def _paths(arg: str, field: str, exclude: Path | None) -> list[Source]:
    pattern = os.path.expanduser(arg)
    if os.path.exists(pattern):  # a name, even one with glob characters in it
        matches = [Path(pattern)]
    else:
        # A glob's directories are left out (its files are its matches), saved datasets excepted.
        matches = [Path(m) for m in sorted(glob.glob(pattern, recursive=True))]
        matches = [m for m in matches if (m.is_file() or _is_saved_dataset(m)) and not _inside(m, exclude)]
    if not matches:
        raise UserError(
            f"source {arg!r} matches no file: check the path or the glob pattern "
            "(a source is a file, a directory, a glob, stdlib or hf:NAME)"
        )
    found: list[Source] = []
    for path in matches:
        if _is_saved_dataset(path):
            found.append(_saved_dataset(path, field))
        elif path.is_dir():
            found.append(_directory(path, field, exclude))
        else:
            found.append(FileSource(str(path), [path], None, field))
    return found


def _inside(path: Path, directory: Path | None) -> bool:
    return directory is not None and path.resolve().is_relative_to(directory.resolve())


def file_kind(path: Path) -> FileKind:
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def _stdlib(field: str) -> FileSource:
    from dlc.data.corpus import stdlib_files

    return FileSource("stdlib", stdlib_files(), Path(sysconfig.get_paths()["stdlib"]), field, kind="stdlib")


def _directory(path: Path, field: str, exclude: Path | None) -> FileSource:
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(path):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not _inside(here / d, exclude)]
        for d in dirnames:
            if _is_saved_dataset(here / d):
                raise UserError(
                    f"directory {str(path)!r} holds a saved Hugging Face dataset at {str(here / d)!r}: "
                    "pass that dataset as a source of its own and the other files by name or glob"
                )
        files.extend(here / f for f in filenames if not f.startswith("."))
    if not files:
        raise UserError(f"source {str(path)!r} is a directory without files: point it at text, JSONL or Parquet files")
    files.sort(key=lambda f: f.relative_to(path).as_posix())
    return FileSource(str(path), files, path, field)


# -- files -----------------------------------------------------------------------------------------


class FileSource(Source):
    """Files read by extension: one file, a directory's files, or the standard library's.

    A directory's kind is its files' kind; when they mix kinds, the kind that holds most of its bytes.
    """

    def __init__(
        self, name: str, files: list[Path], root: Path | None, field: str, kind: SourceKind | None = None
    ) -> None:
        self.name, self.files, self.root, self.field = name, files, root, field
        sizes: dict[FileKind, int] = {}
        for path in files:
            try:
                size = path.stat().st_size
            except OSError as exc:
                raise UserError(f"cannot read source file {str(path)!r}: {exc.strerror}") from None
            sizes[file_kind(path)] = sizes.get(file_kind(path), 0) + size
            if file_kind(path) == "parquet":
                _check_parquet(path, field)
        self.size = sum(sizes.values())
        if kind is None:  # the kind that holds most of its bytes
            largest: FileKind = max(sizes, key=lambda k: sizes[k])
            kind = largest
        self.kind = kind

    def documents(self, reading: Reading) -> Generator[str, None, None]:
        for path in self.files:
            kind = file_kind(path)
            if kind == "jsonl":
                yield from _jsonl_documents(path, self.field, reading)
            elif kind == "parquet":
                yield from _parquet_documents(path, self.field, reading)
            else:
                raw = _read_bytes(path)
                reading.bytes_read += len(raw)
                yield _decode(raw, reading)

    def sha256(self) -> str:
        """Of the file's bytes; for a directory (or stdlib), of its files' relative names and bytes."""
        digest = hashlib.sha256()
        for path in self.files:
            if self.root is not None:
                name = path.relative_to(self.root).as_posix().encode()
                digest.update(len(name).to_bytes(8, "little") + name + path.stat().st_size.to_bytes(8, "little"))
            _hash_file(digest, path)
        return digest.hexdigest()


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read source file {str(path)!r}: {exc.strerror}") from None


def _hash_file(digest: Any, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            digest.update(chunk)


def _decode(raw: bytes, reading: Reading) -> str:
    """UTF-8 text, undecodable bytes replaced by U+FFFD and counted (U+FFFD already there is not)."""
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        reading.replaced += text.count("\ufffd") - raw.count(_REPLACEMENT)
    return text


def _no_surrogates(text: str, reading: Reading) -> str:
    """JSON may escape a lone surrogate (`"\\ud800"`), which is no character: U+FFFD, counted."""
    if text.isascii():
        return text
    fixed, count = _SURROGATE.subn("\ufffd", text)
    reading.replaced += count
    return fixed


def _jsonl_documents(path: Path, field: str, reading: Reading) -> Iterator[str]:
    where = str(path)
    fix = f"each line of {where!r} must be a JSON object whose {field!r} field is the text (--field names it)"
    try:
        with open(path, "rb") as raw:
            compressed = path.name.lower().endswith(".gz")
            lines = gzip.GzipFile(fileobj=raw) if compressed else raw
            counted = 0
            for number, line in enumerate(lines, 1):
                if compressed:
                    if number % 256 == 0:
                        reading.bytes_read += raw.tell() - counted
                        counted = raw.tell()
                else:
                    reading.bytes_read += len(line)
                text = _decode(line, reading)
                if number == 1:  # a byte-order mark, as Windows tools write: read past it
                    text = text.removeprefix("\ufeff")
                if not text.strip():
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise UserError(f"{where}:{number}: not JSON ({exc.msg}, column {exc.colno}): {fix}") from None
                if not isinstance(record, dict):
                    raise UserError(f"{where}:{number}: {_json_type(record)}, not a JSON object: {fix}")
                if field not in record:
                    fields = ", ".join(repr(k) for k in list(record)[:10]) or "none"
                    raise UserError(
                        f"{where}:{number}: no field {field!r} (its fields: {fields}): "
                        "pass --field naming the field that holds the text"
                    )
                document = record[field]
                if not isinstance(document, str):
                    raise UserError(
                        f"{where}:{number}: field {field!r} is {_json_type(document)}, not a string: "
                        "pass --field naming the field that holds the text"
                    )
                yield _no_surrogates(document, reading)
            if compressed:
                reading.bytes_read += raw.tell() - counted
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise UserError(f"{where!r} is not a whole gzip file ({exc}): compress it again, or name it .jsonl") from None
    except OSError as exc:
        raise UserError(f"cannot read source file {where!r}: {exc.strerror or exc}") from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _JSON_TYPES.get(type(value), type(value).__name__)


# -- Parquet ---------------------------------------------------------------------------------------


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"reading Parquet needs pyarrow: {DATA_EXTRA}") from None
    return pq


def _check_parquet(path: Path, field: str) -> None:
    pq = _pyarrow_parquet()
    import pyarrow as pa

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{str(path)!r} cannot be read as Parquet ({exc}): write it again, or rename it") from None
    if field not in schema.names:
        raise UserError(
            f"{str(path)!r} has no column {field!r}; its columns: {', '.join(schema.names)}: "
            "pass --field naming the column that holds the text"
        )
    column_type = schema.field(field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise UserError(
            f"{str(path)!r}: column {field!r} holds {column_type}, not text: pass --field naming a text column"
        )


def _parquet_documents(path: Path, field: str, reading: Reading) -> Iterator[str]:
    pq = _pyarrow_parquet()
    size = path.stat().st_size
    with pq.ParquetFile(path) as parquet:
        rows, done, counted = parquet.metadata.num_rows, 0, 0
        for batch in parquet.iter_batches(batch_size=1024, columns=[field]):
            for text in batch.column(0).to_pylist():
                yield text or ""  # a null is an empty document
            done += batch.num_rows
            reading.bytes_read += size * done // max(rows, 1) - counted
            counted = size * done // max(rows, 1)
    reading.bytes_read += size - counted


# -- Hugging Face datasets -------------------------------------------------------------------------


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(f"reading Hugging Face datasets needs the datasets package: {DATA_EXTRA}") from None
    return datasets


def _is_saved_dataset(path: Path) -> bool:
    """A directory `save_to_disk` wrote: a Dataset's or a DatasetDict's."""
    return ((path / "dataset_info.json").is_file() and (path / "state.json").is_file()) or (
        path / "dataset_dict.json"
    ).is_file()


class DatasetSource(Source):
    """A column of a Hugging Face dataset, read in Arrow batches from its memory-mapped files."""

    def __init__(self, name: str, kind: SourceKind, dataset: Any, field: str, root: Path | None) -> None:
        import pyarrow.compute as pc

        if field not in dataset.column_names:
            raise UserError(
                f"dataset {name!r} has no column {field!r}; its columns: {', '.join(dataset.column_names)}: "
                "pass --field naming the column that holds the text"
            )
        if getattr(dataset.features[field], "dtype", None) not in ("string", "large_string"):
            raise UserError(
                f"dataset {name!r}: column {field!r} holds {dataset.features[field]}, not text: "
                "pass --field naming a text column"
            )
        self.name, self.kind, self.field, self.root = name, kind, field, root
        self.dataset = dataset.select_columns([field])
        self.size = int(pc.sum(pc.binary_length(dataset.data.column(field))).as_py() or 0)

    def documents(self, reading: Reading) -> Generator[str, None, None]:
        import pyarrow.compute as pc

        for table in self.dataset.with_format("arrow").iter(batch_size=1024):
            column = table.column(0)
            for text in column.to_pylist():
                yield text or ""
            reading.bytes_read += int(pc.sum(pc.binary_length(column)).as_py() or 0)

    def sha256(self) -> str:
        """A saved dataset's: of its data files' names and bytes. A hub dataset's: its fingerprint."""
        if self.root is None:
            return str(self.dataset._fingerprint)  # datasets' own content hash; no public accessor
        digest = hashlib.sha256()
        for entry in self.dataset.cache_files:
            path = Path(entry["filename"]).resolve()
            name = path.relative_to(self.root).as_posix().encode()
            digest.update(len(name).to_bytes(8, "little") + name)
            _hash_file(digest, path)
        return digest.hexdigest()


def _saved_dataset(path: Path, field: str) -> DatasetSource:
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{str(path)!r} looks like a saved Hugging Face dataset but cannot be loaded ({exc}): save it again"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            splits = ", ".join(loaded)
            raise UserError(
                f"{str(path)!r} is a dataset with splits {splits} and no 'train': pass one split's directory, "
                f"e.g. {str(path / next(iter(loaded)))!r}"
            )
        loaded = loaded["train"]
    return DatasetSource(str(path), "hf_disk", loaded, field, path.resolve())


def _hub(arg: str, field: str) -> DatasetSource:
    name, _, split = arg.removeprefix("hf:").partition(":")
    split = split or "train"
    if not name:
        raise UserError(f"source {arg!r} names no dataset: write hf:NAME or hf:NAME:SPLIT")
    how = (
        f'download it where the network allows (python -c "import datasets; datasets.load_dataset({name!r}, '
        f"split={split!r}).save_to_disk('DIR')\"), bring DIR here and pass DIR as the source"
    )
    datasets = _datasets()
    offline = hub.offline()
    if not offline and not hub.reachable():
        raise UserError(f"source {arg!r}: the Hugging Face hub ({hub.host()}) cannot be reached from here: {how}")
    try:
        loaded = datasets.load_dataset(name, split=split)
    except (ConnectionError, FileNotFoundError, ValueError, OSError) as exc:
        if offline:
            raise UserError(
                f"source {arg!r}: the Hugging Face hub is switched off here (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE) "
                f"and the local cache does not hold the dataset: {how}"
            ) from None
        raise UserError(f"source {arg!r} cannot be loaded ({exc}): check the dataset's name and split") from None
    return DatasetSource(f"hf:{name}:{split}", "hf_hub", loaded, field, None)
