"""Tokenizers: text to token ids, and the `tokenizer.json` a prepared dataset carries.

Three kinds, named by a spec: `bytes` (a token per UTF-8 byte, id = the byte, and `<|endoftext|>` as
256), `bpe:N` (a byte-level BPE of N tokens trained on the corpus) and a path to a Hugging Face
`tokenizer.json` or a directory holding one. Every kind is a `tokenizers.Tokenizer` inside, so the
file a dataset carries reads the same way whichever kind wrote it; `bytes` encodes with NumPy.

A document is text: a special token's text inside it (`<|endoftext|>` written in a file) is encoded
as text, never as the special token. The end-of-document token is appended by `dlc prepare` alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dlc.errors import UserError

EOS_TOKEN = "<|endoftext|>"
# Tried in order when neither --eos nor tokenizer_config.json names the end-of-document token.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MIN_BPE_VOCAB = 256 + 1  # the byte alphabet and the end-of-document token
SPEC_HELP = "bytes, bpe:N or a path to tokenizer.json or a tokenizer directory"


def byte_symbols() -> list[str]:
    """The ByteLevel alphabet's symbol for each byte 0..255 (GPT-2's printable stand-ins).

    Printable Latin-1 bytes stand for themselves; the rest (controls, space, a few Latin-1 ones)
    take the code points from 256 up, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    extra = 256
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(extra)
            extra += 1
    return [symbols[b] for b in range(256)]


class Tokenizer:
    """A `tokenizers.Tokenizer` with its spec and end-of-document token; used by one thread."""

    def __init__(self, hf: Any, spec: str, eos_token: str) -> None:
        eos_id = hf.token_to_id(eos_token)
        if eos_id is None:
            raise UserError(
                f"the tokenizer {spec!r} has no token {eos_token!r} to end documents with: "
                "pass --eos naming one of its tokens"
            )
        hf.encode_special_tokens = True  # a document's text is text, whatever tokens it spells
        self._hf = hf
        self.spec = spec
        self.eos_token = eos_token
        self.eos_id: int = eos_id
        self.vocab_size: int = max(hf.get_vocab(with_added_tokens=True).values()) + 1
        self._bytes = spec == "bytes"

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The token ids of each text, without an end-of-document token."""
        if self._bytes:
            return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]
        # One text per call: a batch would spread over threads, and the workers are the parallelism.
        return [
            np.asarray(self._hf.encode_batch_fast([text], add_special_tokens=False)[0].ids, dtype=np.uint32)
            for text in texts
        ]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens written out."""
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        """The Hugging Face tokenizer.json text."""
        return self._hf.to_str()

    @classmethod
    def from_json(cls, text: str, spec: str, eos_token: str) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_str(text), spec, eos_token)

    @classmethod
    def from_file(cls, path: str | Path, spec: str | None = None, eos: str | None = None) -> Tokenizer:
        """Load a tokenizer.json (a file, or a directory holding one), offline.

        `spec` is what the dataset's manifest recorded (`bytes` takes the NumPy fast path; left out, a
        file equal to the bytes tokenizer's is recognised). `eos` names the end-of-document token; left
        out, tokenizer_config.json beside the file or the usual names decide.
        """
        file, config = _tokenizer_files(Path(path).expanduser())
        hf = _read_hf(file)
        if spec is None:
            spec = "bytes" if hf.to_str() == bytes_tokenizer().to_json() else str(file)
        return cls(hf, spec, eos or _eos_token(hf, config, str(file)))


def bytes_tokenizer() -> Tokenizer:
    """One token per UTF-8 byte (id = the byte) and `<|endoftext|>` as 256: vocabulary 257.

    Its tokenizer.json is a byte-level BPE without merges whose symbol for byte b has id b, so any
    Hugging Face reader gives the ids the NumPy fast path gives.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    hf = HFTokenizer(models.BPE(vocab={s: b for b, s in enumerate(byte_symbols())}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf, "bytes", EOS_TOKEN)


def train_bpe(texts: Iterable[str], vocab_size: int, eos: str = EOS_TOKEN) -> Tokenizer:
    """A byte-level BPE of at most `vocab_size` tokens trained on `texts`, `eos` among them.

    A small corpus may give fewer tokens than asked: the tokenizer's `vocab_size` is what it has.
    """
    check_bpe_vocab(vocab_size)
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[eos],
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(hf, f"bpe:{vocab_size}", eos)


def check_bpe_vocab(vocab_size: int) -> None:
    if vocab_size < MIN_BPE_VOCAB:
        raise UserError(
            f"--tokenizer bpe:{vocab_size} is too small: a byte-level BPE needs at least {MIN_BPE_VOCAB} tokens "
            f"(256 bytes and the end-of-document token): use bpe:{MIN_BPE_VOCAB} or more, e.g. bpe:4096"
        )


@dataclass(frozen=True)
class TokenizerSpec:
    """What --tokenizer asked for: `bytes`, a BPE to train of `bpe_vocab` tokens, or the tokenizer at `path`."""

    text: str
    kind: Literal["bytes", "bpe", "file"]
    bpe_vocab: int = 0
    path: Path | None = None


def parse_spec(spec: str) -> TokenizerSpec:
    """Parse --tokenizer; a path must exist. UserError for anything else."""
    if spec == "bytes":
        return TokenizerSpec(spec, "bytes")
    if spec.startswith("bpe:"):
        size = spec.removeprefix("bpe:")
        try:
            vocab = int(size)
        except ValueError:
            raise UserError(
                f"--tokenizer {spec!r}: {size!r} is not a whole number of tokens: write e.g. bpe:4096"
            ) from None
        check_bpe_vocab(vocab)
        return TokenizerSpec(spec, "bpe", bpe_vocab=vocab)
    path = Path(spec).expanduser()
    if not path.exists():
        if "/" not in spec and "." not in spec and ":" not in spec:  # a word, not a path: a typo of a kind
            raise UserError(f"--tokenizer {spec!r} is not a tokenizer: give {SPEC_HELP}")
        raise UserError(f"--tokenizer {spec!r}: no such file or directory; give {SPEC_HELP}")
    return TokenizerSpec(spec, "file", path=path)


def load_tokenizer(spec: TokenizerSpec, eos: str | None = None) -> Tokenizer:
    """The tokenizer `spec` names, read offline; a BPE to train is refused (see `train_bpe`)."""
    assert spec.kind != "bpe", "a BPE is trained on the corpus, not loaded"
    if spec.kind == "bytes":
        if eos not in (None, EOS_TOKEN):
            raise UserError(
                f"--eos {eos!r} with --tokenizer bytes: its end-of-document token is {EOS_TOKEN!r}; "
                "leave --eos out, or give a tokenizer that has the token"
            )
        return bytes_tokenizer()
    assert spec.path is not None
    file, config = _tokenizer_files(spec.path)
    hf = _read_hf(file)
    token = eos or _eos_token(hf, config, spec.text)
    if hf.token_to_id(token) is None:
        raise UserError(
            f"--eos {token!r} is not a token of {str(file)!r}: name a token of its vocabulary "
            f"(e.g. one of {', '.join(repr(t) for t in _specials(hf)[:5]) or 'its special tokens'})"
        )
    return Tokenizer(hf, str(file), token)


def _tokenizer_files(path: Path) -> tuple[Path, Path | None]:
    """tokenizer.json and, when there is one beside it, tokenizer_config.json."""
    file = path / TOKENIZER_JSON if path.is_dir() else path
    if not file.is_file():
        raise UserError(
            f"--tokenizer {str(path)!r} is a directory without {TOKENIZER_JSON}: give a directory that holds one "
            "(e.g. a Hugging Face model's), or the file itself"
        )
    config = file.parent / TOKENIZER_CONFIG
    return file, config if config.is_file() else None


def _read_hf(file: Path) -> Any:
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a bare Exception for any malformed file
        raise UserError(
            f"{str(file)!r} is not a valid Hugging Face tokenizer.json ({exc}): give the tokenizer.json of a "
            "tokenizers/transformers tokenizer"
        ) from None


def _eos_token(hf: Any, config: Path | None, name: str) -> str:
    """tokenizer_config.json's eos_token, else the first usual end-of-text token the vocabulary has."""
    if config is not None:
        try:
            declared = json.loads(config.read_text()).get("eos_token")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            declared = None  # a config we cannot read names no token; the vocabulary still may
        if isinstance(declared, dict):
            declared = declared.get("content")
        if isinstance(declared, str) and hf.token_to_id(declared) is not None:
            return declared
    for token in EOS_CANDIDATES:
        if hf.token_to_id(token) is not None:
            return token
    raise UserError(
        f"the tokenizer {name!r} has none of the usual end-of-document tokens ({', '.join(EOS_CANDIDATES)}): "
        "pass --eos TOKEN naming the one to put after every document"
    )


def _specials(hf: Any) -> list[str]:
    return [t.content for _, t in sorted(hf.get_added_tokens_decoder().items())]
