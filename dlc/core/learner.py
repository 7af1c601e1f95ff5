"""One learner: parameters, AdamW state and a data stream, stepped by a host loop.

The jitted step stays pure; everything with a side effect (pacing, metrics, checkpoints, and
later pushing fragments to the syncer) happens here, around it. Metrics of step t are read
after step t+1 has been dispatched so the host never waits on the device for them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from dlc.config.schema import Recipe
from dlc.core.model import Params, build_model
from dlc.core.sharding import Placement
from dlc.core.steps import LeafScales, make_grad_step, make_optimizer, make_train_step
from dlc.data.plan import StreamSource, open_stream


@dataclass(frozen=True)
class StepRecord:
    """What one finished inner step reports to the host loop."""

    step: int
    tokens: int
    loss: float
    grad_norm: float
    step_time_s: float


class Learner:
    def __init__(self, recipe: Recipe, index: int, source: StreamSource | None) -> None:
        self.index = index
        self.batch_size = recipe.learners.resolved(index).batch_size
        self.seq_len = recipe.learners.seq_len
        self.pace_s = recipe.learners.resolved(index).step_time_s
        self.graphdef, params = build_model(recipe.model, recipe.run.seed)
        self.optimizer = make_optimizer(recipe.inner, recipe.schedule_steps())
        self.z_loss = recipe.inner.z_loss
        # Every array the jitted functions see is committed to this learner's devices: jit compiles a
        # function once per mix of committed and uncommitted inputs.
        settings = recipe.learners.resolved(index)
        self.placement = Placement(settings.devices, settings.mesh)
        self.params: Params = self.place(params)
        self.opt_state: Any = self.place(self.optimizer.init(self.params))
        self._scales_at = self.opt_state[-1].scales.sharding  # the tensors' lr factors (`set_leaf_scales`)
        self._factored = recipe.lr_feedback()  # whether the syncer sets them; if not they stay 1
        # None: a hot spare, which holds no data until it takes a learner's slot (`rebind`).
        self.stream: Any = None if source is None else open_stream(source, self.batch_size, self.seq_len)
        shardings = None
        if self.placement.sharded:
            layouts = (self.placement.tree(self.params), self.placement.tree(self.opt_state))
            shardings = (*layouts, self.placement.batch, self.placement.replicated)
        self._train_step = make_train_step(self.graphdef, self.optimizer, shardings, self.z_loss)
        self._step_fn: Any = None  # the compiled train step: `compile`
        self._compiling = threading.Lock()  # the engine compiles in a thread of its own
        self._grad_step: Any = None  # compiled on first use: only data-parallel learners need it
        self.step = 0
        self.tokens = 0
        self._pending: tuple[int, int, dict[str, jax.Array], float] | None = None
        self._finished: list[StepRecord] = []  # records not yet collected by the host loop
        self._last_start = 0.0

    def place(self, tree: Any) -> Any:
        """Host or device arrays, committed to this learner's devices (sharded over several)."""
        return self.placement.put(tree)

    def leaf_scales_to_device(self, scales: np.ndarray) -> jax.Array:
        """Each tensor's factor (`set_leaf_scales`) where the optimizer holds them; any thread."""
        return jax.device_put(np.asarray(scales, dtype=np.float32), self._scales_at)

    def set_leaf_scales(self, scales: jax.Array) -> None:
        """Multiply each tensor's steps from the next on by its factor, in `jax.tree_util.tree_leaves`
        order (`syncer.lr_feedback`), as `leaf_scales_to_device` placed them: the optimizer's last part
        (`steps.scale_by_leaf`) holds them."""
        *rest, _ = self.opt_state
        self.opt_state = (*rest, LeafScales(scales))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def compile(self) -> None:
        """Compile the train step for this learner's shapes now (or load it from the persistent
        cache), once: every later call runs this executable, whatever state is loaded."""
        with self._compiling:
            if self._step_fn is None:
                batch = jax.ShapeDtypeStruct((self.batch_size, self.seq_len), np.int32)
                self._step_fn = self._train_step.lower(self.params, self.opt_state, batch, batch).compile()

    def compile_gradient(self) -> None:
        """The data-parallel learner's step, compiled once like `compile`."""
        with self._compiling:
            if self._grad_step is None:
                batch = jax.ShapeDtypeStruct((self.batch_size, self.seq_len), np.int32)
                self._grad_step = make_grad_step(self.graphdef, self.z_loss).lower(self.params, batch, batch).compile()

    def rebind(self, index: int, recipe: Recipe, source: StreamSource) -> None:
        """Become learner `index` with its data stream (a hot spare taking a slot over).

        A slot whose batch size differs from the spare's compiles its own step at the first step.
        """
        settings = recipe.learners.resolved(index)
        with self._compiling:  # not while a compilation for the old batch size is under way
            if settings.batch_size != self.batch_size:
                self._step_fn = self._grad_step = None
            self.index, self.batch_size, self.pace_s = index, settings.batch_size, settings.step_time_s
        self.stream = open_stream(source, self.batch_size, self.seq_len)

    def _pace(self) -> float:
        if self.pace_s:
            wait = self._last_start + self.pace_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        self._last_start = time.monotonic()
        return self._last_start

    def train_step(self) -> StepRecord | None:
        """Dispatch one inner step; return the previous step's record (None on the first)."""
        start = self._pace()
        x_BxT, y_BxT = self.stream.next_batch()
        if self._step_fn is None:
            self.compile()
        self.params, self.opt_state, metrics = self._step_fn(self.params, self.opt_state, x_BxT, y_BxT)
        self.step += 1
        self.tokens += self.tokens_per_step
        previous, self._pending = self._pending, (self.step, self.tokens, metrics, start)
        return self._finish(previous, start) if previous else None

    def compute_gradient(self) -> dict[str, Any]:
        """The gradient of the loss on the next batch at the current parameters, on the host.

        Counts as a step (tokens, step counter, record); the parameters do not change here.
        """
        self.flush()
        if self._grad_step is None:
            self.compile_gradient()
        start = self._pace()
        x_BxT, y_BxT = self.stream.next_batch()
        loss, grads, norm = jax.device_get(self._grad_step(self.params, x_BxT, y_BxT))
        self.step += 1
        self.tokens += self.tokens_per_step
        now = time.monotonic()
        self._finished.append(StepRecord(self.step, self.tokens, float(loss), float(norm), now - start))
        return grads

    def set_params(self, params: Params) -> None:
        """Replace the parameters with host arrays of the same structure (the global model)."""
        self.flush()
        self.params = self.place(params)

    def flush(self) -> StepRecord | None:
        """Wait for the step in flight and return its record."""
        pending, self._pending = self._pending, None
        return self._finish(pending, time.monotonic()) if pending else None

    def take_records(self) -> list[StepRecord]:
        """Every record finished since the last call, whoever flushed it (a checkpoint, a copy)."""
        records, self._finished = self._finished, []
        return records

    def _finish(self, pending: tuple[int, int, dict[str, jax.Array], float], now: float) -> StepRecord:
        step, tokens, metrics, started = pending
        host = jax.device_get(metrics)
        record = StepRecord(step, tokens, float(host["loss"]), float(host["grad_norm"]), now - started)
        self._finished.append(record)
        return record

    # -- state, for checkpoints and (later) copies to a rejoining peer -----------------------

    def state_tree(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state}

    def state_meta(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "data_position": self.position}

    @property
    def position(self) -> int:
        """Batches read from this learner's stream (0 for a spare that has none yet)."""
        return self.stream.position if self.stream is not None else 0

    def load_state(self, tree: dict[str, Any], meta: dict[str, Any]) -> None:
        self.flush()
        host = jax.device_get(tree)
        self.params = self.place(host["params"])
        self.opt_state = self.place(host["opt_state"])
        if not self._factored:  # a checkpoint of a run with the feedback, resumed without it
            self.set_leaf_scales(self.leaf_scales_to_device(np.ones(self.opt_state[-1].scales.shape)))
        self.step = int(meta["step"])
        self.tokens = int(meta["tokens"])
        self.stream.position = int(meta["data_position"])
