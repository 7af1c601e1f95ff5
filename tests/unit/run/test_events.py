"""The events as typed records: written as JSON lines, read back as the same records, checked against their
field types when the tests write them, and listed in the generated catalog."""

from __future__ import annotations

import json

import pytest

from dlc.run import events
from dlc.run.rundir import RunDir


def test_a_record_is_written_as_its_line_and_read_back_as_itself():
    died = events.LearnerDied(learner=2, step=10, data_position=3, pid=None)
    line = json.loads(json.dumps(died.record()))
    assert line == {"kind": "learner_died", "learner": 2, "step": 10, "data_position": 3, "pid": None}
    back = events.parse({"t": 5.0, **line})
    assert back == events.LearnerDied(t=5.0, learner=2, step=10, data_position=3, pid=None)
    rounds = events.RoundClosed(
        fragment=1,
        version=4,
        contributors=[0, 1],
        weights=[0.5, 0.5],
        tokens=[8, 8],
        seqs=[3, 7],
        merged=[(0, 3), (1, 6), (1, 7)],
    )
    assert events.parse(json.loads(json.dumps(rounds.record()))) == rounds  # JSON's lists back as pairs


def test_reading_leaves_out_what_this_dlc_cannot_read_and_ignores_fields_it_does_not_know():
    assert events.parse({"kind": "learner_exploded", "learner": 1}) is None  # a newer dlc's kind
    assert events.parse({"kind": "learner_died", "learner": "two", "data_position": 0}) is None  # damaged
    assert events.parse({"kind": "learner_left"}) is None  # a field with no default missing
    assert events.parse({"kind": "learner_left", "learner": 1, "mood": "glad"}) == events.LearnerLeft(learner=1)
    assert events.parse({"kind": "learner_stopped", "learner": 1, "reason": "run_end"}) == events.LearnerStopped(
        learner=1, reason="run_end"
    )  # a field the writer may not know reads as None
    lines = [{"kind": "syncer_died", "t": 1}, {"kind": "?"}, {"kind": "learner_left", "learner": 0, "t": 2}]
    assert events.parse_all(lines) == [events.SyncerDied(t=1.0), events.LearnerLeft(t=2.0, learner=0)]


def test_a_chaos_copy_keeps_every_field_of_its_chaos_jsonl_line():
    line = {"t": 9.0, "fault": "stall", "phase": "injected", "learner": 1, "duration_s": 4, "origin": "plan"}
    copy = events.Chaos.of(line)
    assert (copy.fault, copy.learner, copy.duration_s, copy.more) == ("stall", 1, 4.0, {"origin": "plan"})
    assert copy.record() == {"kind": "chaos", **{k: v for k, v in line.items() if k != "t"}}
    assert events.parse(copy.record()) == copy


def test_the_check_names_a_field_of_the_wrong_type():
    assert events.wrong(events.LearnerDied(learner=2, step=None, data_position=3, pid=7)) is None
    wrong = events.wrong(events.LearnerDied(learner="two", step=None, data_position=3, pid=7))  # type: ignore[arg-type]
    assert wrong is not None and wrong.startswith("event learner_died: learner:")


def test_the_catalog_lists_every_kind_with_its_fields_in_its_group():
    catalog = events.catalog_markdown()
    assert all(f"| `{kind}` |" in catalog for kind in events.KINDS)
    fields = "`learner` integer, `fragment` integer, `seq` integer, `version` integer, `bytes` integer, `reason` string"
    assert f"| `push_lost` | {fields} |" in catalog
    assert "`step` integer or null" in catalog  # a field the writer may not know
    assert catalog.index("## The run") < catalog.index("`learner_died`") < catalog.index("## The protocol")
    assert sum(len(kinds) for kinds in events.GROUPS.values()) == len(events.KINDS)


def test_a_kind_is_declared_once_and_says_what_it_means():
    with pytest.raises(ValueError, match="declared twice"):

        @events.base.declared(events.base.RUN, "learner_died")
        class Again(events.Event):
            """Again."""

    with pytest.raises(ValueError, match="says what it means"):

        @events.base.declared(events.base.RUN, "learner_mute")
        class Mute(events.Event):
            pass


def test_the_run_directory_refuses_a_record_of_the_wrong_type_when_checking(tmp_path, monkeypatch):
    rundir = RunDir(tmp_path / "run", recipe_text="")
    rundir.path.mkdir()
    monkeypatch.setenv(events.CHECK_VARIABLE, "1")
    rundir.event(events.LearnerLeft(learner=1))
    with pytest.raises(ValueError, match="event learner_left: learner:"):
        rundir.event(events.LearnerLeft(learner="one"))  # type: ignore[arg-type]
    monkeypatch.delenv(events.CHECK_VARIABLE)
    rundir.event(events.LearnerLeft(learner="one"))  # type: ignore[arg-type]  # outside the tests: what it has
    rundir.begin()
    rundir.close()
    lines = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [(line["kind"], line["learner"]) for line in lines] == [("learner_left", 1), ("learner_left", "one")]
    assert all(isinstance(line["t"], float) for line in lines)
