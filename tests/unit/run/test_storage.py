"""Run storage: a node that cannot see or write the run's storage says so by name, and a URL run.dir
keeps its checkpoints (and a copy of the recipe) there and the driver's files in a local directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlc.config.load import load_recipe
from dlc.errors import UserError
from dlc.run.rundir import RunDir
from dlc.run.storage import RunStorage, storage_path
from tests.helpers import TINY, run_started

NODE = "10.0.0.7 (gpu-7, id 3f2a9c1e)"


def test_a_node_that_sees_the_storage_and_can_write_passes(tmp_path: Path):
    storage = RunStorage(str(tmp_path / "run"))
    token = storage.mark()
    assert storage.check(token, NODE) is None
    assert not [p for p in storage.checkpoints.iterdir()]  # the probe file is gone again


def test_a_node_with_a_directory_of_its_own_by_that_name_is_named(tmp_path: Path):
    # The node does not mount the shared path: what it finds there is not what the driver wrote.
    storage = RunStorage(str(tmp_path / "run"))
    storage.mark()
    problem = storage.check("the-token-of-this-start", NODE)
    assert problem is not None and problem.startswith(f"node {NODE} cannot see run.dir=")
    assert "every node mounts" in problem
    unmounted = RunStorage(str(tmp_path / "nothing-here"))
    assert "cannot see" in (unmounted.check("t", NODE) or "")


def test_a_node_that_cannot_write_the_storage_is_named(tmp_path: Path):
    storage = RunStorage(str(tmp_path / "run"))
    token = storage.mark()
    (tmp_path / "run" / "checkpoints").write_text("a file where the checkpoint directory must be")
    problem = storage.check(token, NODE)
    assert problem is not None and problem.startswith(f"node {NODE} cannot write run.dir=")
    assert "make it writable from every node" in problem and "\n" not in problem


def test_storage_locations(tmp_path: Path):
    assert str(storage_path(f"file://{tmp_path}/r")) == f"{tmp_path}/r"
    assert str(storage_path("relative/r")).startswith("/")  # other nodes do not share our working directory
    with pytest.raises(UserError, match="cannot write ftp:// URLs"):
        storage_path("ftp://host/r")
    with pytest.raises(UserError, match="needs an absolute path"):
        storage_path("file://relative/r")


def test_a_url_run_dir_keeps_checkpoints_there_and_the_drivers_files_here(tmp_path: Path):
    url, local = f"file://{tmp_path}/bucket/exp1", tmp_path / "local"
    recipe = load_recipe(TINY, [f"run.dir={url}", f"run.local_dir={local}"])
    layout = RunDir.check(recipe, fresh=False)
    assert layout.path == local and layout.storage.location == url and not layout.resume
    assert not local.exists() and not (tmp_path / "bucket").exists()  # checking writes nothing
    rundir = RunDir.create(layout, recipe)
    rundir.event(run_started(local))
    rundir.close()
    assert (local / "events.jsonl").is_file() and (local / "recipe.yaml").is_file()
    stored = tmp_path / "bucket" / "exp1"
    assert (stored / "recipe.yaml").read_text() == (local / "recipe.yaml").read_text()
    assert json.loads((stored / "storage.json").read_text())["token"] == rundir.storage_token
    assert rundir.storage.learner_dir(2) == storage_path(f"{stored}/checkpoints/learner-2")

    # A checkpoint there: a resume (from any machine) checks the recipe saved beside it.
    (stored / "checkpoints" / "learner-0").mkdir(parents=True)
    assert RunDir.check(load_recipe(TINY, [f"run.dir={url}", f"run.local_dir={tmp_path / 'other'}"]), False).resume
    other_model = load_recipe(TINY, [f"run.dir={url}", "model.width=32", "model.num_heads=2"])
    with pytest.raises(UserError, match="holds a checkpoint of a different run .*model.num_heads, model.width"):
        RunDir.check(other_model, fresh=False)
    other_fragments = load_recipe(TINY, [f"run.dir={url}", "syncer.fragments=4"])
    with pytest.raises(UserError, match=r"different run \(changed: syncer.fragments from 16 to 4\)"):
        RunDir.check(other_fragments, fresh=False)
    # Placement may change on resume, and recomputation: neither shapes any state.
    moved = load_recipe(TINY, [f"run.dir={url}", "learners.placement=pack", "learners.num_cpus=2", "model.remat=block"])
    assert RunDir.check(moved, fresh=False).resume
    fresh = RunDir.create(RunDir.check(recipe, fresh=True), recipe)
    fresh.close()
    assert not (stored / "checkpoints").exists()
    # The default local directory is named after the URL's last part.
    assert RunDir.check(load_recipe(TINY, [f"run.dir={url}"]), False).path == Path("runs/exp1")


def test_run_local_dir_is_only_for_a_url_run_dir(tmp_path: Path):
    with pytest.raises(UserError, match="run.local_dir=.* is only for a URL run.dir"):
        load_recipe(TINY, [f"run.dir={tmp_path}", f"run.local_dir={tmp_path}/x"])
