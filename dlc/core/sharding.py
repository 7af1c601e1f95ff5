"""Where a learner's arrays live: one device, or a mesh of several that shards them (`jax.sharding`).

A learner of `learners.devices=N` trains on the first N devices of its process (N GPUs of one
node, or N host devices on CPU) arranged as a mesh of `data` x `fsdp`. The batch is split along
its first axis over both; every parameter, its gradient and its optimizer state is split over
`fsdp` along its first axis that divides evenly (the others are replicated), so each device holds
1/fsdp of the model's state and gathers the rest for the step. Everything else a learner holds
(fragment vectors, scalars) is replicated. One device is the degenerate case: arrays are put on
it, unsharded, as before.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dlc.errors import UserError

AXES = ("data", "fsdp")


def fsdp_axis(shape: tuple[int, ...], fsdp: int) -> int | None:
    """The axis an array of `shape` is split on over `fsdp` devices: its first that divides evenly;
    None when none does, or when there is nothing to split over (it is replicated)."""
    if fsdp <= 1:
        return None
    return next((axis for axis, size in enumerate(shape) if size >= fsdp and size % fsdp == 0), None)


class Placement:
    """A learner's devices, and how each of its arrays is laid out on them."""

    def __init__(self, devices: int = 1, mesh: tuple[int, int] = (1, 1)) -> None:
        available = jax.devices()
        if len(available) < devices:
            raise UserError(
                f"the learner trains on devices={devices} but its process has {len(available)} "
                f"({available[0].platform}): on GPUs reserve num_gpus={devices}; on CPU dlc gives the process "
                "its host devices itself, so this is a bug to report"
            )
        self.device = available[0]  # the first: where a one-device learner's arrays live
        self.data, self.fsdp = mesh if devices > 1 else (1, 1)
        self.mesh = Mesh(np.asarray(available[:devices]).reshape(self.data, self.fsdp), AXES) if devices > 1 else None

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def of(self, shape: tuple[int, ...]) -> Any:
        """Where an array of `shape` of the learner's state lives: split over fsdp along its first axis that
        divides evenly, else replicated (one device: the device)."""
        if self.mesh is None:
            return self.device
        axis = fsdp_axis(shape, self.fsdp)
        if axis is None:
            return self.replicated
        return NamedSharding(self.mesh, PartitionSpec(*([None] * axis), "fsdp"))

    @property
    def replicated(self) -> Any:
        """Whole on every device (one device: the device)."""
        return self.device if self.mesh is None else NamedSharding(self.mesh, PartitionSpec())

    @property
    def batch(self) -> Any:
        """A batch [B, T]: its rows split over every device."""
        return self.device if self.mesh is None else NamedSharding(self.mesh, PartitionSpec(AXES))

    def tree(self, tree: Any) -> Any:
        """The layout of every leaf of `tree` (host or device arrays, or shapes)."""
        return jax.tree_util.tree_map(lambda x: self.of(tuple(np.shape(x))), tree)

    def put(self, tree: Any) -> Any:
        """`tree`'s leaves on the learner's devices, laid out as `of` says (committed, as jit wants them)."""
        return jax.device_put(tree, self.tree(tree))
