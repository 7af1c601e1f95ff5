"""The TensorBoard event files training writes, read back by independent readers."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from dlc.observe.tensorboard import TensorBoardWriter, crc32c, masked_crc32c
from tests.fixtures_runs import T0


def test_crc32c_by_known_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720, B.4)
    assert crc32c(b"") == 0 and masked_crc32c(b"") == 0xA282EAD8  # rotate(0) + the mask constant


def write_events(run_dir: Path) -> Path:
    with TensorBoardWriter(run_dir) as tb:
        tb.scalar("eval/loss", 5.5, 0, wall_time=T0)
        tb.scalar("eval/loss", 3.25, 100, wall_time=T0 + 1)
        tb.scalar("eval/loss", float("nan"), 200)  # skipped
        tb.metric({"t": T0 + 2, "kind": "train", "learner": 2, "step": 50, "loss": 3.0, "tokens_per_s": 2048.0})
    (path,) = (run_dir / "tensorboard").iterdir()
    assert path.name.startswith("events.out.tfevents.")
    return path


def records(path: Path) -> list[bytes]:
    """Split a TFRecord file, checking both masked CRCs of every record."""
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header)
        payload = data[at + 12 : at + 12 + length]
        assert struct.unpack("<I", data[at + 12 + length : at + 16 + length])[0] == masked_crc32c(payload)
        out.append(payload)
        at += 16 + length
    return out


def event_class() -> type:
    """tensorflow's Event/Summary messages, declared here from the .proto field numbers."""
    pb = pytest.importorskip("google.protobuf")
    del pb
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="dlc_test_event.proto", package="dlctest")
    fields = {
        "Value": [("tag", 1, F.TYPE_STRING, ""), ("simple_value", 2, F.TYPE_FLOAT, "")],
        "Summary": [("value", 1, F.TYPE_MESSAGE, ".dlctest.Value")],
        "Event": [
            ("wall_time", 1, F.TYPE_DOUBLE, ""),
            ("step", 2, F.TYPE_INT64, ""),
            ("file_version", 3, F.TYPE_STRING, ""),
            ("summary", 5, F.TYPE_MESSAGE, ".dlctest.Summary"),
        ],
    }
    for name, specs in fields.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, type_name in specs:
            label = F.LABEL_REPEATED if (name, field) == ("Summary", "value") else F.LABEL_OPTIONAL
            message.field.add(name=field, number=number, type=kind, label=label, type_name=type_name or None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("dlctest.Event"))


def test_tensorboard_events_decode_with_protobuf(tmp_path):
    Event = event_class()
    events = [Event.FromString(payload) for payload in records(write_events(tmp_path))]
    assert events[0].file_version == "brain.Event:2"
    scalars = [(e.summary.value[0].tag, e.step, e.summary.value[0].simple_value, e.wall_time) for e in events[1:]]
    assert scalars == [
        ("eval/loss", 0, 5.5, T0),
        ("eval/loss", 100, 3.25, T0 + 1),
        ("train/loss/learner_2", 50, 3.0, T0 + 2),
        ("train/throughput(tok_per_s)/learner_2", 50, 2048.0, T0 + 2),
    ]


def test_tensorboard_reads_the_events(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_events(tmp_path)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("eval/loss")] == [(0, 5.5), (100, 3.25)]
    assert [(s.step, s.value) for s in acc.Scalars("train/loss/learner_2")] == [(50, 3.0)]
