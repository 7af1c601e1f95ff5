"""TensorBoard event files for a run, written without TensorFlow or tensorboardX.

An event file is a sequence of records: little-endian uint64 length, masked CRC-32C of the
length, the payload, masked CRC-32C of the payload. Each payload is an `Event` protobuf; the
first carries `file_version`, the others a `Summary` of one scalar (`simple_value`). The few
protobuf fields needed are encoded here by hand, so training gains no dependency.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO

from dlc.run.files import TENSORBOARD_DIR

FILE_VERSION = "brain.Event:2"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli polynomial, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masking: a CRC of data that itself holds CRCs is then not degenerate."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc32c(length)) + payload + struct.pack("<I", masked_crc32c(payload))


# -- the protobuf wire format, only what Event and Summary need -------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are ten-byte two's complement varints
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field_bytes(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """Event{wall_time=1 double, step=2 int64, summary=5 {value=1 {tag=1, simple_value=2 float}}}."""
    summary_value = _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value)
    summary = _field_bytes(1, summary_value)
    return (
        _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _varint(2 << 3) + _varint(step) + _field_bytes(5, summary)
    )


def version_event(wall_time: float) -> bytes:
    return _varint(1 << 3 | 1) + struct.pack("<d", wall_time) + _field_bytes(3, FILE_VERSION.encode())


class TensorBoardWriter:
    """Appends scalars to `<run_dir>/tensorboard/events.out.tfevents.<time>.<host>.<pid>`.

    Each record is flushed at once, so `tensorboard --logdir runs` sees a live run; a resumed
    run adds a new file beside the old ones and TensorBoard reads them as one series.
    """

    def __init__(self, run_dir: Path) -> None:
        directory = Path(run_dir) / TENSORBOARD_DIR
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = directory / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}"
        self._file: BinaryIO | None = open(self.path, "ab")
        self._write(version_event(now))

    def scalar(self, tag: str, value: float | None, step: int, wall_time: float | None = None) -> None:
        """One point of series `tag`; non-finite or missing values are skipped (not plottable)."""
        if value is None or not math.isfinite(value):
            return
        self._write(scalar_event(tag, float(value), int(step), time.time() if wall_time is None else wall_time))

    def metric(self, record: dict[str, Any]) -> None:
        """A metrics.jsonl record as scalars: train lines per learner, eval lines for the global model."""
        wall_time = record.get("t")
        if record.get("kind") == "train":
            i, step = record["learner"], record["step"]
            self.scalar(f"train/loss/learner_{i}", record.get("loss"), step, wall_time)
            self.scalar(f"train/grad_norm/learner_{i}", record.get("grad_norm"), step, wall_time)
            self.scalar(f"train/throughput(tok_per_s)/learner_{i}", record.get("tokens_per_s"), step, wall_time)
        elif record.get("kind") == "eval":
            step = round(record["step"])
            self.scalar("eval/loss", record.get("eval_loss"), step, wall_time)
            self.scalar("eval/bits_per_byte", record.get("eval_bpb"), step, wall_time)
            self.scalar("eval/loss_vs_tokens", record.get("eval_loss"), record.get("tokens", 0), wall_time)

    def _write(self, payload: bytes) -> None:
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        self._file.write(frame_record(payload))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
