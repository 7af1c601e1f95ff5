"""Checkpoints with orbax: a PyTree of arrays plus a small JSON record, written atomically.

A save can return before its files are written (`wait=False`): the caller's arrays are copied where
they are (a device copy of each JAX array, which a later step may donate; a host copy of each NumPy
array, which its owner changes in place), and a thread of the checkpointer's own has orbax write the
copies while training goes on: the caller's loop stands still only for the copies. (orbax's own
asynchronous save still spends a few hundred milliseconds of the caller's time on each save: its
directories, metadata and host transfers.) The next save, `wait()` and `close()` wait for the write
in flight, and raise what it raised. orbax writes into a temporary directory and renames it when
complete, so a process that dies mid-write leaves the last complete checkpoint the newest.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from dlc.core.fragment_ops import leaf_names
from dlc.errors import UserError

# orbax logs every save at INFO through absl; the run's own event log already records them.
logging.getLogger("absl").setLevel(logging.WARNING)


def _quiet_abandoned_reads() -> None:
    """Keep orbax's abandoned reads of a damaged checkpoint off stderr, once one was refused.

    A read that fails ends the event loop orbax restores in while its other reads are in flight;
    each of those then reports `RuntimeError('Event loop is closed')` as an unraisable exception
    with a traceback, at any moment afterwards. The user already has the one line that says the
    checkpoint is unreadable; every other unraisable exception still reaches the hook before.
    """
    previous = sys.unraisablehook
    if getattr(previous, "dlc_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if not (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"):
            previous(unraisable)

    hook.dlc_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


class Checkpointer:
    """Numbered checkpoints under one directory; keeps the newest `keep`."""

    def __init__(self, directory: Path | epath.Path, keep: int) -> None:
        # A local path or a URL (gs://...): orbax writes either through etils.
        self.directory = directory.absolute() if isinstance(directory, Path) else directory
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False, create=True),
        )
        self._saved: int | None = None  # the step this instance last saved or restored
        self._writer: threading.Thread | None = None  # the write in flight
        self._failed: BaseException | None = None  # what it raised
        self._then: Callable[[], None] | None = None  # what to do once it is complete

    def save(
        self, step: int, tree: Any, meta: dict[str, Any], wait: bool = True, then: Callable[[], None] | None = None
    ) -> None:
        """Save `tree` at `step`, the newest checkpoint from now on; with `wait=False`, return once its
        arrays are copied and write in the background. `then` runs once the checkpoint is complete (at
        the latest by the next save, `wait()` or `close()`).

        Checkpoints at `step` or later left by an earlier process of the learner (a restart that
        copied a peer behind it, or started from the global model) describe a state that is gone:
        they are removed first, or a resume would take the stale one for the newest.
        """
        self.wait()  # a second save waits for the first
        if step == self._saved:
            if then is not None:
                then()
            return  # already saved at this step (an interval save just before exit)
        self._saved, self._then = step, then
        if wait:
            self._write(step, tree, meta)
            self.wait()
            return
        copies = jax.tree.map(_copy, tree)
        self._writer = threading.Thread(
            target=self._write_aside, args=(step, copies, meta), name="checkpoint-writer", daemon=True
        )
        self._writer.start()

    def _write(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        for stale in [s for s in self._manager.all_steps() if s >= step]:
            self._manager.delete(stale)
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def _write_aside(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        try:
            self._write(step, tree, meta)
        except BaseException as exc:  # noqa: BLE001 - raised again by whoever waits for it
            self._failed = exc

    def wait(self) -> None:
        """Until the write in flight, if any, is complete (and its `then` has run); raises what it raised."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        failed, self._failed = self._failed, None
        if failed is not None:
            self._then, self._saved = None, None  # not saved: a save at that step again must write
            raise failed
        then, self._then = self._then, None
        if then is not None:
            then()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, like: Any) -> tuple[Any, dict[str, Any]]:
        """The newest checkpoint, shaped like `like`."""
        step = self.latest_step()
        if step is None:
            raise UserError(f"no checkpoint in {self.directory}: pass --fresh to start over")
        where = self.directory / str(step)
        try:
            saved = ocp.StandardCheckpointHandler().metadata(epath.Path(where) / "state").tree
        except Exception:  # noqa: BLE001 - no readable metadata: the restore below says what is wrong
            saved = None
        if saved is not None and (differs := _differences(saved, like)):
            raise UserError(
                f"checkpoint {where} holds other state than this run trains ({differs}): it was written by "
                "another version of dlc or for another model or optimizer; pass --fresh to start over, or "
                "choose another run.dir"
            )
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore())
            )
        except Exception as exc:  # orbax raises many types for a damaged or foreign checkpoint
            _quiet_abandoned_reads()
            raise UserError(
                f"checkpoint {where} is unreadable ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'}): pass --fresh to start "
                "over, or choose another run.dir"
            ) from None
        self._saved = step
        return restored["state"], dict(restored["meta"])

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()


def _differences(saved: Any, like: Any) -> str:
    """What sets a saved tree (orbax's metadata) apart from the tree a restore expects, or ''."""

    def leaves(tree: Any) -> dict[str, Any]:
        return dict(zip(leaf_names(tree), jax.tree_util.tree_leaves(tree), strict=True))

    have, want = leaves(saved), leaves(like)
    parts = []
    if missing := sorted(want.keys() - have.keys()):
        parts.append(f"{len(missing)} array(s) missing, such as {missing[0]}")
    if extra := sorted(have.keys() - want.keys()):
        parts.append(f"{len(extra)} this run does not make, such as {extra[0]}")
    for name in sorted(want.keys() & have.keys()):
        saved_shape = getattr(have[name], "shape", None)
        shape = want[name].shape if hasattr(want[name], "shape") else np.shape(want[name])
        if saved_shape is not None and tuple(saved_shape) != tuple(shape):
            parts.append(f"{name} shaped {tuple(saved_shape)} where this run has {tuple(shape)}")
            break
    return "; ".join(parts)


def _copy(leaf: Any) -> Any:
    """A leaf the caller may change or donate after the save returns, copied (where it is)."""
    if isinstance(leaf, jax.Array):
        return leaf.copy()
    return np.array(leaf, copy=True) if isinstance(leaf, np.ndarray) else leaf


def read_checkpoint(directory: Path | epath.Path, step: int | None = None) -> tuple[Any, dict[str, Any], int]:
    """(tree, record, step) of checkpoint `step` (default: the newest) in `directory`, read as saved.

    For readers of a run (`dlc sample`): nothing is created or removed, and a run still training may
    be read, since orbax renames a checkpoint into place only once it is complete.
    """
    if not directory.is_dir():
        raise UserError(f"no checkpoint in {directory}: the run has not saved one yet")
    absl = logging.getLogger("absl")
    level, absl.level = absl.level, logging.ERROR  # orbax warns that a read-only manager saves nothing
    try:
        manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False, read_only=True))
    finally:
        absl.setLevel(level)
    try:
        steps = sorted(manager.all_steps())
        if not steps:
            raise UserError(f"no checkpoint in {directory}: the run has not saved one yet")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise UserError(f"no checkpoint {step} in {directory}: it holds {', '.join(map(str, steps))}")
        try:
            restored = manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
            )
        except Exception as exc:  # orbax raises many types for a damaged or foreign checkpoint
            _quiet_abandoned_reads()
            raise UserError(
                f"checkpoint {directory / str(step)} is unreadable ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200] if str(exc) else 'no detail'})"
            ) from None
        return restored["state"], dict(restored["meta"]), step
    finally:
        manager.close()
