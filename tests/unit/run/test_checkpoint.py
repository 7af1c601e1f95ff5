"""Checkpoints written in the background: what was saved is what the caller held at the save, a second
save waits for the first, and what runs once a checkpoint is complete runs once."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dlc.run.checkpoint import Checkpointer


def test_a_background_save_holds_the_values_of_its_moment_and_the_next_save_waits_for_it(tmp_path):
    store = Checkpointer(tmp_path / "ck", keep=2)
    anchors = np.arange(6, dtype=np.float32)
    done: list[int] = []
    tree = {"params": {"w": jnp.ones((2, 3))}, "anchors": [anchors]}
    store.save(1, tree, {"step": 1}, wait=False, then=lambda: done.append(1))
    anchors += 100.0  # its owner goes on changing it while the write goes on
    store.save(2, {"params": {"w": jnp.zeros((2, 3))}, "anchors": [anchors]}, {"step": 2}, wait=False)
    assert done == [1]  # the first was complete before the second began
    store.wait()
    assert store.latest_step() == 2
    store.close()

    reader = Checkpointer(tmp_path / "ck", keep=2)
    like = {"params": {"w": jnp.zeros((2, 3))}, "anchors": [np.zeros(6, np.float32)]}
    tree, meta = reader.restore(like)
    assert meta == {"step": 2} and np.array_equal(tree["anchors"][0], np.arange(6) + 100.0)
    assert np.array_equal(np.asarray(tree["params"]["w"]), np.zeros((2, 3)))
    reader.close()
    import orbax.checkpoint as ocp

    first = ocp.CheckpointManager(tmp_path / "ck").restore(
        1, args=ocp.args.Composite(state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore())
    )
    assert np.array_equal(first["state"]["anchors"][0], np.arange(6))  # not the values changed after the save
    assert np.array_equal(np.asarray(first["state"]["params"]["w"]), np.ones((2, 3)))


def test_a_background_write_that_failed_is_raised_by_the_next_wait_and_written_again(tmp_path, monkeypatch):
    store = Checkpointer(tmp_path / "ck", keep=2)
    write = store._manager.save

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(store._manager, "save", disk_full)
    tree = {"w": jnp.ones(3)}
    store.save(3, tree, {"step": 3}, wait=False, then=lambda: pytest.fail("ran after a failed write"))
    with pytest.raises(OSError, match="No space left"):
        store.wait()
    store.wait()  # raised once
    monkeypatch.setattr(store._manager, "save", write)
    store.save(3, tree, {"step": 3})  # not taken for saved: written now
    assert store.latest_step() == 3
    store.close()


@pytest.mark.parametrize(
    ("like", "said"),
    [
        (
            {"params": {"w": np.zeros((2, 3), np.float32)}, "scales": np.ones(2, np.float32)},
            "1 array(s) missing, such as scales",
        ),
        ({"params": {}}, "1 this run does not make, such as params/w"),
        ({"params": {"w": np.zeros((4, 3), np.float32)}}, "params/w shaped (2, 3) where this run has (4, 3)"),
    ],
)
def test_a_checkpoint_of_other_state_is_refused_with_what_differs_before_anything_is_read(tmp_path, like, said):
    """A run directory from an older dlc (its optimizer lacked a part) or another model: named, not a
    restore that fails deep in orbax or, for a shape, quietly hands back the saved one."""
    from dlc.errors import UserError

    store = Checkpointer(tmp_path / "ck", keep=2)
    store.save(3, {"params": {"w": np.ones((2, 3), np.float32)}}, {"step": 3})
    store.close()
    reader = Checkpointer(tmp_path / "ck", keep=2)
    with pytest.raises(UserError, match="holds other state than this run trains") as refused:
        reader.restore(like)
    assert said in str(refused.value) and "another version of dlc" in str(refused.value)
    assert "--fresh" in str(refused.value)
    reader.close()
