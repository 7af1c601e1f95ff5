"""Readers of what the experiment trackers wrote, for the tests: TensorBoard event files, a W&B offline
run's records, an MLflow run's metric history, and the environment that keeps W&B off the network.

Each reads with the tracker's own message classes or client, never with dlc's code.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

# W&B offline and silent, its error reports off, its server a closed loopback port: nothing leaves the machine.
WANDB_OFFLINE = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_BASE_URL": "http://127.0.0.1:9",
}


def wandb_env(home: Path) -> dict[str, str]:
    """WANDB_OFFLINE, with W&B's cache, config and data under `home` instead of ~."""
    return {
        **WANDB_OFFLINE,
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_DATA_DIR": str(home / "data"),
    }


# -- TensorBoard -------------------------------------------------------------------------------------


def _tfrecords(path: Path) -> list[bytes]:
    """The payloads of a TFRecord file: length, its CRC, payload, its CRC."""
    data, out, at = path.read_bytes(), [], 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append(data[at + 12 : at + 12 + length])
        at += 16 + length
    return out


def tensorboard_events(directory: Path) -> list[Any]:
    """Every Event of every event file in `directory`, oldest file first (tensorboardX's protobuf classes)."""
    from tensorboardX.proto.event_pb2 import Event

    files = sorted(directory.glob("events.out.tfevents.*"))
    return [Event.FromString(payload) for path in files for payload in _tfrecords(path)]


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] over all the event files in `directory`."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for event in tensorboard_events(directory):
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                out[value.tag].append((event.step, value.simple_value))
    return dict(out)


def tensorboard_texts(directory: Path, tag: str) -> list[tuple[int, str]]:
    """[(step, text)] of a text summary."""
    out = []
    for event in tensorboard_events(directory):
        for value in event.summary.value:
            if value.tag.startswith(tag) and value.metadata.plugin_data.plugin_name == "text":
                out += [(event.step, s.decode()) for s in value.tensor.string_val]
    return out


# -- W&B offline runs ----------------------------------------------------------------------------------

_BLOCK = 32768  # the LevelDB log format W&B writes its .wandb files in
_HEADER = 7  # ":W&B", a 2-byte magic, a version byte


def wandb_records(path: Path) -> list[Any]:
    """The Record messages of a .wandb file (W&B's protobuf classes), whole records only."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, parts, at = [], b"", _HEADER
    while at + 7 <= len(data):
        left = _BLOCK - at % _BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            at += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if length == 0 and kind == 0:
            at += left
            continue
        parts += data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # FULL, or the LAST part of a record split across blocks
            records.append(wandb_internal_pb2.Record.FromString(parts))
            parts = b""
    return records


def wandb_runs(run_dir: Path) -> list[Path]:
    """The offline run directories under RUN/wandb, oldest first."""
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def wandb_run_id(offline_run: Path) -> str:
    """The W&B run an offline run directory belongs to, as its run record says."""
    (path,) = offline_run.glob("run-*.wandb")
    return next(r.run.run_id for r in wandb_records(path) if r.WhichOneof("record_type") == "run")


def wandb_history(offline_run: Path) -> list[dict[str, Any]]:
    """The rows an offline run logged: key -> value (JSON-decoded)."""
    import json

    (path,) = offline_run.glob("run-*.wandb")
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def wandb_series(offline_run: Path, name: str, axis: str) -> list[tuple[int, float]]:
    """[(axis value, value)] of one series in an offline run."""
    return [(int(row[axis]), row[name]) for row in wandb_history(offline_run) if name in row]


# -- MLflow ---------------------------------------------------------------------------------------------


def mlflow_series(tracking_uri: str, run_id: str, name: str) -> list[tuple[int, float]]:
    """[(step, value)] of a metric of an MLflow run, in the order logged."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, name)
    return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.timestamp, m.step))]
