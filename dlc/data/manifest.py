"""The prepared dataset's contract: `manifest.json`, the one file that says a directory is a dataset.

`dlc prepare` writes the token shards and `tokenizer.json` first and the manifest last (renamed into
place), so a directory without a readable manifest is never a dataset, whatever else it holds.

A split's token sequence is its shards concatenated in order: each document's tokens followed by one
end-of-document token (`TokenizerInfo.eos_id`). A shard is a raw little-endian array of `dtype`, no
header, so a learner memory-maps it; its length in tokens is in the manifest, and a file of any other
size is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dlc.errors import UserError

MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT: Final = "dlc-tokens"
FORMAT_VERSION = 1
UINT16_VOCAB = 2**16  # the largest vocabulary whose token ids fit uint16

Dtype = Literal["uint16", "uint32"]
SplitName = Literal["train", "eval"]
SourceKind = Literal["text", "jsonl", "parquet", "hf_disk", "hf_hub", "stdlib"]


def dtype_for(vocab_size: int) -> Dtype:
    """The smallest shard dtype that holds every token id below `vocab_size`."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenizerInfo(_Strict):
    spec: str = Field(description="What --tokenizer said: bytes, bpe:N, or the path read.")
    vocab_size: int = Field(ge=2, description="Token ids are 0 .. vocab_size - 1.")
    eos_id: int = Field(ge=0, description="The end-of-document token, after every document.")
    eos_token: str = Field(description="Its text in tokenizer.json.")
    file: str = TOKENIZER_FILE
    sha256: str = Field(description="Of tokenizer.json.")


class SourceInfo(_Strict):
    name: str = Field(description="The source as given (a path, a glob's match, stdlib, hf:NAME).")
    kind: SourceKind
    bytes: int = Field(ge=0, description="Its size as read (on disk, or the text of a dataset).")
    sha256: str
    documents: int = Field(ge=0)
    tokens: int = Field(ge=0, description="Tokens its documents gave, end-of-document tokens included.")


class ShardInfo(_Strict):
    file: str
    tokens: int = Field(ge=1)
    sha256: str


class SplitInfo(_Strict):
    documents: int = Field(ge=0)
    tokens: int = Field(ge=0, description="End-of-document tokens included.")
    text_bytes: int = Field(ge=0, description="UTF-8 bytes of its documents' text.")
    shards: list[ShardInfo]

    @model_validator(mode="after")
    def _shards_add_up(self) -> SplitInfo:
        if sum(s.tokens for s in self.shards) != self.tokens:
            raise ValueError(f"its shards hold {sum(s.tokens for s in self.shards)} tokens, not {self.tokens}")
        return self

    @property
    def bytes_per_token(self) -> float:
        return self.text_bytes / self.tokens if self.tokens else 0.0


class Manifest(_Strict):
    format: Literal["dlc-tokens"] = FORMAT
    version: int = FORMAT_VERSION
    dlc_version: str
    created: str = Field(description="UTC, ISO 8601.")
    tokenizer: TokenizerInfo
    dtype: Dtype
    seed: int = Field(description="Chose which documents are held out.")
    eval_fraction: float = Field(ge=0, lt=1)
    sources: list[SourceInfo]
    train: SplitInfo
    eval: SplitInfo
    replaced_characters: int = Field(0, ge=0, description="Undecodable input replaced by U+FFFD.")
    skipped_documents: int = Field(0, ge=0, description="Empty documents, left out.")

    @model_validator(mode="after")
    def _vocabulary_fits(self) -> Manifest:
        if self.version != FORMAT_VERSION:
            raise ValueError(f"format version {self.version}; this dlc reads version {FORMAT_VERSION}")
        if self.tokenizer.vocab_size > np.iinfo(self.dtype).max + 1:
            raise ValueError(f"a vocabulary of {self.tokenizer.vocab_size} does not fit {self.dtype}")
        if self.tokenizer.eos_id >= self.tokenizer.vocab_size:
            raise ValueError(f"eos_id {self.tokenizer.eos_id} is outside the vocabulary")
        return self

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, name: SplitName) -> SplitInfo:
        return self.train if name == "train" else self.eval

    def write(self, directory: Path) -> None:
        """Write manifest.json into `directory` atomically: it appears whole or not at all."""
        tmp = directory / f".{MANIFEST_FILE}.tmp"
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, directory / MANIFEST_FILE)


def read_manifest(directory: str | Path, what: str = "data.path") -> Manifest:
    """The manifest of the prepared dataset in `directory`, checked; one UserError naming `what` if there is none."""
    directory = Path(directory).expanduser()
    path = directory / MANIFEST_FILE
    fix = "prepare it with `dlc prepare SOURCES --out DIR`"
    if not directory.is_dir():
        raise UserError(f"{what}={str(directory)!r} is not a directory: {fix}")
    if not path.is_file():
        raise UserError(
            f"{what}={str(directory)!r} holds no {MANIFEST_FILE}, so it is not a prepared dataset "
            f"(or its prepare did not finish): {fix}"
        )
    try:
        data = json.loads(path.read_text())
        return Manifest.model_validate(data)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{str(path)!r} cannot be read as JSON ({exc}): the dataset is damaged; {fix} again") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the manifest"
        raise UserError(
            f"{str(path)!r} is damaged or not a dlc dataset manifest ({where}: {first['msg']}): {fix} again"
        ) from None
