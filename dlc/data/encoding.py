"""A batch of documents tokenized, in this process or in a worker of `dlc prepare`'s pool.

Each document's tokens are followed by the end-of-document token; with them come each document's
length in tokens and in UTF-8 bytes of text, which the manifest's counts are made of. A pool's
worker loads the tokenizer once (`start_worker`) and leaves Ctrl-C to its parent.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

import numpy as np

from dlc.data.tokenizer import Tokenizer


@dataclass
class Encoded:
    tokens: np.ndarray  # every document's tokens, each followed by the end-of-document token
    lengths: np.ndarray  # tokens per document, its end-of-document token included
    text_bytes: np.ndarray  # UTF-8 bytes per document


def encode(tok: Tokenizer, texts: list[str], dtype: np.dtype) -> Encoded:
    ids = tok.encode_batch(texts)
    lengths = np.fromiter((len(i) + 1 for i in ids), dtype=np.int64, count=len(ids))
    tokens = np.empty(int(lengths.sum()), dtype=dtype)
    ends = np.cumsum(lengths)
    for end, length, doc in zip(ends, lengths, ids, strict=True):
        tokens[end - length : end - 1] = doc
    tokens[ends - 1] = tok.eos_id
    if tok.spec == "bytes":
        sizes = lengths - 1  # a token per byte
    else:
        sizes = np.fromiter(
            (len(t) if t.isascii() else len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=len(texts)
        )
    return Encoded(tokens, lengths, sizes)


_worker_tokenizer: Tokenizer | None = None


def start_worker(tokenizer_json: str, spec: str, eos_token: str) -> None:
    global _worker_tokenizer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops the pool
    _worker_tokenizer = Tokenizer.from_json(tokenizer_json, spec, eos_token)


def encode_in_worker(texts: list[str], dtype: str) -> Encoded:
    assert _worker_tokenizer is not None, "the pool's initializer loads the tokenizer"
    return encode(_worker_tokenizer, texts, np.dtype(dtype))
