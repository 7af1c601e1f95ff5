"""Tokenizers: the bytes tokenizer's fast path against its own tokenizer.json, a BPE trained here, a
tokenizer read from a path (its end-of-document token found), and the specs refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlc.data.tokenizer import (
    EOS_TOKEN,
    MIN_BPE_VOCAB,
    Tokenizer,
    byte_symbols,
    bytes_tokenizer,
    load_tokenizer,
    parse_spec,
    train_bpe,
)
from dlc.errors import UserError

# Each test imports `tokenizers` itself: `pytest -m gpu` collects this file on a GPU machine where dlc
# was installed with --no-deps beside the machine's own JAX, and tokenizers may be missing there.

TEXT = "naïve café — 日本語 🙂 tab\tnewline\n\x00 end"
CORPUS = [f"def function_{i}(value):\n    return value * {i} + offset  # naïve\n" for i in range(200)]


def test_byte_symbols_are_the_byte_level_alphabet():
    from tokenizers import pre_tokenizers

    symbols = byte_symbols()
    assert len(set(symbols)) == 256 and set(symbols) == set(pre_tokenizers.ByteLevel.alphabet())
    assert symbols[ord("A")] == "A" and symbols[ord(" ")] == "Ġ"  # GPT-2's stand-in for a space


def test_bytes_fast_path_equals_its_tokenizer_json():
    from tokenizers import Tokenizer as HFTokenizer

    tok = bytes_tokenizer()
    assert (tok.vocab_size, tok.eos_id, tok.eos_token) == (257, 256, EOS_TOKEN)
    [fast] = tok.encode_batch([TEXT])
    assert fast.tolist() == list(TEXT.encode("utf-8"))
    # Any Hugging Face reader of the file gives the same ids, and decodes them back to the text.
    hf = HFTokenizer.from_str(tok.to_json())
    assert hf.encode(TEXT, add_special_tokens=False).ids == fast.tolist()
    assert hf.token_to_id(EOS_TOKEN) == 256 and hf.get_vocab_size() == 257
    assert hf.decode(fast.tolist()) == TEXT and tok.decode(fast) == TEXT
    assert tok.decode([*fast.tolist(), 256]) == TEXT + EOS_TOKEN


def test_bytes_tokenizer_read_back_from_file_takes_the_fast_path(tmp_path):
    (tmp_path / "tokenizer.json").write_text(bytes_tokenizer().to_json())
    tok = Tokenizer.from_file(tmp_path)  # the directory; the file is recognised as the bytes tokenizer
    assert tok.spec == "bytes" and tok.encode_batch([TEXT])[0].dtype == np.uint8


def test_a_document_spelling_the_end_token_is_text():
    for tok in (bytes_tokenizer(), train_bpe(CORPUS, 300)):
        [ids] = tok.encode_batch([f"a{EOS_TOKEN}b"])
        assert tok.eos_id not in ids.tolist() and tok.decode(ids) == f"a{EOS_TOKEN}b"


def test_train_bpe_merges_and_round_trips():
    tok = train_bpe(CORPUS, 320)
    # 256 bytes + the end token + merges, at most the 320 asked for
    assert MIN_BPE_VOCAB < tok.vocab_size <= 320 and tok.spec == "bpe:320"
    assert tok.eos_token == EOS_TOKEN and tok.eos_id < tok.vocab_size
    [ids] = tok.encode_batch([CORPUS[7]])
    assert len(ids) < len(CORPUS[7].encode()) / 2  # merges pay off on text it was trained on
    assert tok.decode(ids) == CORPUS[7]
    [ids] = tok.encode_batch([TEXT])  # text it never saw still round-trips, byte by byte
    assert tok.decode(ids) == TEXT
    assert ids.max() < tok.vocab_size


def test_train_bpe_on_a_tiny_corpus_records_the_vocabulary_it_got():
    from tokenizers import Tokenizer as HFTokenizer

    tok = train_bpe(["ab ab"], 1000)
    assert tok.vocab_size < 1000 and tok.vocab_size == HFTokenizer.from_str(tok.to_json()).get_vocab_size()


def test_bpe_below_the_minimum_is_refused():
    with pytest.raises(UserError, match="at least 257"):
        parse_spec("bpe:256")
    with pytest.raises(UserError, match="at least 257"):
        train_bpe(CORPUS, 100)
    assert parse_spec("bpe:257").bpe_vocab == 257


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpt2", "bytes, bpe:N or a path to tokenizer.json or a tokenizer directory"),
        ("bpe:lots", "'lots' is not a whole number"),
        ("/nonexistent/tokenizer.json", "no such file or directory"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(UserError, match=message):
        parse_spec(spec)


def test_an_invalid_tokenizer_json_is_refused(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(UserError, match="not a valid Hugging Face tokenizer.json"):
        load_tokenizer(parse_spec(str(bad)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="directory without tokenizer.json"):
        load_tokenizer(parse_spec(str(tmp_path / "empty")))


def write_tokenizer(directory, eos: str, config: dict | None = None):
    directory.mkdir()
    (directory / "tokenizer.json").write_text(train_bpe(CORPUS, 300, eos=eos).to_json())
    if config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_path_tokenizer_finds_its_end_token(tmp_path):
    # the usual names, tried in order
    tok = load_tokenizer(parse_spec(str(write_tokenizer(tmp_path / "plain", "</s>"))))
    assert tok.eos_token == "</s>" and tok.spec == str(tmp_path / "plain" / "tokenizer.json")
    # tokenizer_config.json names it, as a string or as {"content": ...}
    for name, declared in (("str", "<|im_end|>"), ("dict", {"content": "<|im_end|>"})):
        path = write_tokenizer(tmp_path / name, "<|im_end|>", {"eos_token": declared})
        tok = load_tokenizer(parse_spec(str(path)))
        assert tok.eos_token == "<|im_end|>" and tok.eos_id == tok._hf.token_to_id("<|im_end|>")
    # none of them: --eos is asked for, and then used
    bare = write_tokenizer(tmp_path / "bare", "<|im_end|>")
    with pytest.raises(UserError, match="pass --eos TOKEN"):
        load_tokenizer(parse_spec(str(bare)))
    assert load_tokenizer(parse_spec(str(bare)), eos="<|im_end|>").eos_token == "<|im_end|>"
    with pytest.raises(UserError, match="'<nope>' is not a token"):
        load_tokenizer(parse_spec(str(bare)), eos="<nope>")


def test_eos_with_bytes_is_refused():
    with pytest.raises(UserError, match="--eos '</s>' with --tokenizer bytes"):
        load_tokenizer(parse_spec("bytes"), eos="</s>")
