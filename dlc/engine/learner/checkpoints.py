"""A learner's checkpoints in the run's storage: its learner's state and its sync's, saved and restored together.

Each learner saves every `checkpoint.every_steps` steps and at its stop. A resumed learner goes
on from its latest checkpoint, but numbers its next pushes above every one the restored syncer has
seen: after a hard stop its checkpoint is older than the syncer's state, and a seq used again would
be refused as a duplicate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlc.algo.protocol import SEQ_STRIDE
from dlc.run.checkpoint import Checkpointer

if TYPE_CHECKING:
    from etils import epath

    from dlc.algo.protocol import LearnerSync
    from dlc.core.learner import Learner


class LearnerCheckpoints:
    """One learner's checkpoints, in `directory`, keeping the newest `keep`."""

    def __init__(self, directory: epath.Path, keep: int, learner: Learner, sync: LearnerSync) -> None:
        self._store = Checkpointer(directory, keep)
        self.learner = learner
        self.sync = sync

    def latest_step(self) -> int | None:
        return self._store.latest_step()

    def tree(self) -> dict[str, Any]:
        return {"learner": self.learner.state_tree(), "sync": self.sync.state()[0]}

    def save(self, wait: bool = True) -> None:
        """Checkpoint now; with `wait=False` the files are written while the learner trains on."""
        self.learner.flush()
        meta = {**self.learner.state_meta(), "sync": self.sync.state()[1]}
        self._store.save(self.learner.step, self.tree(), meta, wait=wait)

    def restore(self, next_seq: int) -> dict[str, Any]:
        """Load the latest checkpoint, if any; returns its step, data position and incarnation.

        `next_seq` is the lowest seq the restored syncer has not seen from this learner. The
        incarnation is the one those seqs belong to, so a later restart numbers its pushes above
        every earlier process's.
        """
        found = self._store.latest_step() is not None
        if found:
            tree, meta = self._store.restore(self.tree())
            self.learner.load_state(tree["learner"], meta)
            self.sync.load(tree["sync"], meta["sync"])
        self.sync.seq = max(self.sync.seq, next_seq)
        self.sync.incarnation = self.sync.seq // SEQ_STRIDE
        return {
            "step": self.learner.step,
            "data_position": self.learner.position,
            "incarnation": self.sync.incarnation,
            "checkpoint": found,
        }

    def close(self) -> None:
        self._store.close()
