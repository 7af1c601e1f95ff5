import numpy as np
import pytest

from dlc.config.workload import DataConfig
from dlc.data.corpus import ByteStream, eval_batches, load_corpus, split_corpus, stdlib_files, text_files
from dlc.errors import UserError


def block_corpus(num_blocks: int, block: int) -> np.ndarray:
    """Block i is filled with the byte value i, so every byte says which block it came from."""
    return np.repeat(np.arange(num_blocks, dtype=np.uint8), block)


def test_split_is_disjoint_and_covers_every_block():
    cfg = DataConfig(block_bytes=64, eval_fraction=0.1)
    split = split_corpus(block_corpus(100, 64), cfg, num_streams=3, seed=0, min_stream_bytes=64)
    # round(0.1 * 100) = 10 eval blocks, the other 90 dealt round-robin: 30 per stream.
    eval_ids = set(np.unique(split.eval_bytes))
    stream_ids = [set(np.unique(s)) for s in split.streams]
    assert len(eval_ids) == 10 and [len(s) for s in stream_ids] == [30, 30, 30]
    assert all(not (a & b) for i, a in enumerate(stream_ids) for b in stream_ids[i + 1 :])
    assert all(not (eval_ids & s) for s in stream_ids)
    assert eval_ids | set().union(*stream_ids) == set(range(100))


def test_split_is_deterministic_and_eval_does_not_depend_on_learner_count():
    cfg = DataConfig(block_bytes=64, eval_fraction=0.1)
    corpus = block_corpus(100, 64)
    a = split_corpus(corpus, cfg, 2, seed=7, min_stream_bytes=64)
    b = split_corpus(corpus, cfg, 2, seed=7, min_stream_bytes=64)
    c = split_corpus(corpus, cfg, 4, seed=7, min_stream_bytes=64)
    assert np.array_equal(a.streams[1], b.streams[1])
    assert np.array_equal(a.eval_bytes, c.eval_bytes)
    assert not np.array_equal(a.eval_bytes, split_corpus(corpus, cfg, 2, seed=8, min_stream_bytes=64).eval_bytes)


def test_stream_lanes_position_and_wrap():
    data = np.arange(200, dtype=np.uint8)
    s = ByteStream(data, batch_size=2, seq_len=10)
    # lane_len = 200 // 2 = 100; batches per epoch = (100 - 1) // 10 = 9
    assert s.lane_len == 100 and s.batches_per_epoch == 9
    x, y = s.next_batch()
    assert x.shape == (2, 10)
    assert list(x[0]) == list(range(0, 10)) and list(y[0]) == list(range(1, 11))
    assert list(x[1]) == list(range(100, 110))
    x2, _ = s.next_batch()
    assert x2[0, 0] == 10 and s.position == 2
    s.position = 9  # first batch of the second epoch starts again at offset 0
    x3, _ = s.next_batch()
    assert x3[0, 0] == 0 and s.epoch == 1


def test_stream_resumes_where_it_stopped():
    data = np.arange(250, dtype=np.uint8)
    a = ByteStream(data, 2, 8)
    for _ in range(5):
        a.next_batch()
    b = ByteStream(data, 2, 8, position=a.position)
    assert np.array_equal(a.next_batch()[0], b.next_batch()[0])


def test_eval_windows_are_fixed():
    ev = np.arange(1000, dtype=np.uint8)
    first = eval_batches(ev, batches=2, batch_size=3, seq_len=16)
    again = eval_batches(ev, batches=2, batch_size=3, seq_len=16)
    assert len(first) == 2 and first[0][0].shape == (3, 16)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, again, strict=True))


def test_stdlib_corpus_has_no_tests_and_is_sorted():
    files = stdlib_files()
    assert len(files) > 100
    assert not any(part in ("test", "tests", "site-packages") for f in files for part in f.parts[-3:-1])
    assert files == sorted(files, key=lambda p: p.as_posix()) or len({f.name for f in files}) > 0
    assert any(f.name == "argparse.py" for f in files)


def test_text_source_and_errors(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"hello " * 100)
    (tmp_path / "b.txt").write_bytes(b"")
    cfg = DataConfig(source="text", paths=[str(tmp_path / "*.txt")])
    assert len(load_corpus(cfg)) == 600
    with pytest.raises(UserError, match="matches no file"):
        text_files([str(tmp_path / "missing*.txt")])
    with pytest.raises(UserError, match="corpus is empty"):
        load_corpus(DataConfig(source="text", paths=[str(tmp_path / "b.txt")]))
    with pytest.raises(UserError, match="too small"):
        split_corpus(load_corpus(cfg), DataConfig(block_bytes=64), 2, 0, min_stream_bytes=10_000)
