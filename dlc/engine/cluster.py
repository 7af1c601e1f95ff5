"""The Ray cluster a run's processes live in: an embedded one on loopback, or one to join."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray

from dlc.config.schema import ClusterConfig
from dlc.errors import UserError


def start_cluster(cfg: ClusterConfig, cpus_needed: float) -> dict[str, Any]:
    """Join `cfg.address`, or start an embedded single-node cluster on loopback."""
    common: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR", "include_dashboard": False}
    if cfg.address:
        try:
            ray.init(address=cfg.address, **common)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"cannot join the Ray cluster at cluster.address={cfg.address!r}: {exc}") from None
        available = ray.cluster_resources().get("CPU", 0.0)
        if available < cpus_needed:
            ray.shutdown()
            raise UserError(
                f"the Ray cluster at {cfg.address} has {available:g} CPUs, the recipe reserves {cpus_needed:g}: "
                "lower learners.num_cpus, learners.spares, learners.join_streams or syncer.num_cpus, or add nodes"
            )
    else:
        # Logical CPUs, not cores: learners are paced by XLA threads, not by Ray's accounting.
        num_cpus = cfg.num_cpus or max(float(os.cpu_count() or 1), cpus_needed)
        ray.init(num_cpus=int(np.ceil(num_cpus)), _node_ip_address="127.0.0.1", **common)
    return {"address": cfg.address or "embedded", "nodes": [n["NodeManagerAddress"] for n in ray.nodes()]}


def stop_cluster() -> None:
    if ray.is_initialized():
        ray.shutdown()
