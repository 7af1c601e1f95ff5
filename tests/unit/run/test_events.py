"""The events' declarations: what they allow, and the run directory checking each event it writes."""

from __future__ import annotations

import json

import pytest

from dlc.run.events import CHECK_VARIABLE, EVENTS, catalog_markdown, undeclared
from dlc.run.rundir import RunDir


def test_a_declared_event_passes_and_anything_else_is_named():
    assert undeclared({"t": 1.0, "kind": "learner_died", "learner": 2, "step": 10, "data_position": 3}) is None
    assert "'learner_exploded' is not declared" in str(undeclared({"kind": "learner_exploded"}))
    assert "fields ['colour'] are not declared" in str(undeclared({"kind": "learner_died", "colour": "red"}))
    assert undeclared({"kind": "chaos", "phase": "injected", "anything": 1}) is None  # a chaos.jsonl line's fields


def test_the_catalog_lists_every_kind_with_its_fields():
    catalog = catalog_markdown()
    assert all(f"| `{kind}` |" in catalog for kind in EVENTS)
    assert "| `push_lost` | `learner`, `fragment`, `seq`, `version`, `bytes`, `reason` |" in catalog


def test_the_run_directory_refuses_an_undeclared_event_when_checking(tmp_path, monkeypatch):
    rundir = RunDir(tmp_path / "run", recipe_text="")
    rundir.path.mkdir()
    monkeypatch.setenv(CHECK_VARIABLE, "1")
    rundir.event("learner_left", learner=1)
    with pytest.raises(ValueError, match="fields \\['mood'\\] are not declared"):
        rundir.event("learner_left", learner=1, mood="glad")
    monkeypatch.delenv(CHECK_VARIABLE)
    rundir.event("learner_left", learner=1, mood="glad")  # a run outside the tests writes what it has
    rundir.begin()
    rundir.close()
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert kinds == ["learner_left", "learner_left"]
