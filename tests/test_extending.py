"""The worked examples of docs/internals/extending.md, applied to a copy of the repository and run there."""

from __future__ import annotations

import filecmp
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "internals" / "extending.md"


def section_code(title: str) -> list[str]:
    """The fenced Python blocks of the page's section `## title`, in order."""
    text = PAGE.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], re.S)


def copy_repo(into: Path) -> Path:
    for part in ("dlc", "recipes", "chaos"):
        shutil.copytree(REPO / part, into / part, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def changed_files(copy: Path) -> list[str]:
    """Files of dlc/ and chaos/ in the copy that are new or differ from the repository's."""
    out = []
    for path in sorted([*(copy / "dlc").rglob("*.py"), *(copy / "chaos").rglob("*.py")]):
        original = REPO / path.relative_to(copy)
        if not original.exists() or not filecmp.cmp(path, original, shallow=False):
            out.append(str(path.relative_to(copy)))
    return out


def _line_starting(lines: list[str], anchor: str) -> int:
    at = [i for i, line in enumerate(lines) if line.startswith(anchor)]
    assert len(at) == 1, f"{len(at)} lines start with {anchor!r}"
    return at[0]


def insert(text: str, anchor: str, block: str, before: bool = False) -> str:
    """`block` put after (or before) the one line of `text` that starts with `anchor`."""
    lines = text.splitlines(keepends=True)
    i = _line_starting(lines, anchor) + (0 if before else 1)
    return "".join([*lines[:i], block, *lines[i:]])


def replace_line(text: str, anchor: str, line: str) -> str:
    """The one line of `text` that starts with `anchor` replaced by `line`."""
    lines = text.splitlines(keepends=True)
    lines[_line_starting(lines, anchor)] = line.rstrip("\n") + "\n"
    return "".join(lines)


def apply_example(tmp_path: Path, new: dict[str, str], edits: dict[str, Callable[[str], str]]) -> Path:
    """A copy of the repository with the example's new files written and its edits made; nothing else differs."""
    copy = copy_repo(tmp_path)
    for path, text in new.items():
        (copy / path).write_text(text)
    for path, edit in edits.items():
        (copy / path).write_text(edit((copy / path).read_text()))
    assert changed_files(copy) == sorted([*new, *edits])
    return copy


# Every check first makes sure it runs the copy's dlc, not the repository's.
FROM_THE_COPY = """
from pathlib import Path as _Path
import dlc as _dlc
assert _Path(_dlc.__file__).resolve().parent == _Path("dlc").resolve(), _dlc.__file__
"""


def run_in(copy: Path, script: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", FROM_THE_COPY + script],
        cwd=copy,
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


FAMILY_CHECK = """
import jax, jax.numpy as jnp, numpy as np
from dlc.config.load import load_recipe
from dlc.core.decode import generate
from dlc.core.model import apply_model, build_model, flatten_params
from dlc.core.steps import make_optimizer, make_train_step
from dlc.use.export import architecture, dlc_params, hf_config, hf_tensors

overrides = ["model.arch=qwen2", "model.num_kv_heads=2", "model.width=32", "model.num_layers=2", "model.init_std=0.2"]
cfg = load_recipe("recipes/tiny.yaml", overrides).model
graphdef, params = build_model(cfg, seed=0)
assert {"blocks/0/attn/q/bias", "blocks/0/attn/k/bias", "blocks/0/attn/v/bias"} <= set(flatten_params(params))

# It trains: the loss falls on a batch seen again and again.
recipe = load_recipe("recipes/tiny.yaml", overrides)
step = make_train_step(graphdef, make_optimizer(recipe.inner, 40))
opt_state = make_optimizer(recipe.inner, 40).init(params)
tokens = np.random.default_rng(0).integers(0, 256, (4, 65)).astype(np.int32)
trained, losses = jax.tree.map(jnp.array, params), []
for _ in range(40):
    trained, opt_state, metrics = step(trained, opt_state, tokens[:, :-1], tokens[:, 1:])
    losses.append(float(metrics["loss"]))
assert losses[-1] < 0.9 * losses[0], losses

# It decodes with the cache as the model computes without one.
prompt = [5, 17, 3]
cached = list(generate(cfg, params, prompt, max_new_tokens=6, temperature=0))
uncached = list(prompt)
for _ in range(6):
    logits = apply_model(graphdef, params, jnp.asarray([uncached]))
    uncached.append(int(jnp.argmax(logits[0, -1])))
assert cached == uncached[len(prompt):], (cached, uncached)

# It exports in Qwen2's layout and reads back.
tensors = hf_tensors(cfg, params)
assert architecture(cfg) == "Qwen2ForCausalLM" and hf_config(cfg, None)["model_type"] == "qwen2"
assert "model.layers.0.self_attn.q_proj.bias" in tensors
back = flatten_params(dlc_params(cfg, tensors, params, "the export"))
assert all(np.array_equal(back[k], v) for k, v in flatten_params(params).items())
print("ok", losses[0], losses[-1])
"""


@pytest.mark.timeout(600)
def test_a_block_family_is_one_module_and_its_name(tmp_path):
    module, entry = section_code("A block family (`model.arch`)")
    copy = apply_example(
        tmp_path,
        {"dlc/core/arch/qwen2.py": module},
        {"dlc/config/workload.py": lambda text: insert(text, "ARCHES = {", entry)},
    )
    assert run_in(copy, FAMILY_CHECK).startswith("ok")


TRACKER_CHECK = """
import csv
from pathlib import Path
from dlc.config.load import load_recipe
from dlc.observe.trackers import Trackers, check_trackers
from dlc.run import events

run_dir = Path("run")
run_dir.mkdir()
recipe = load_recipe("recipes/tiny.yaml", ["track=[csv]"])
check_trackers(recipe)
said = []
trackers = Trackers.open(recipe, run_dir, said.append)
trackers.metric({"kind": "train", "t": 100.0, "learner": 1, "step": 7, "loss": 2.5})
trackers.event(events.LearnerDied(t=101.0, learner=1, step=7, data_position=56, pid=None))
trackers.close()
rows = list(csv.reader((run_dir / "tracker.csv").open()))
assert rows[0] == ["t", "series", "step", "axis", "value"], rows
series = {row[1] for row in rows[1:]}
assert any(name.startswith("train/") for name in series) and "note/learner_died" in series, rows
assert said == [], said
print("ok")
"""


def test_a_tracker_is_one_module_and_its_name(tmp_path):
    module, line = section_code("An experiment tracker (`track`)")
    copy = apply_example(
        tmp_path,
        {"dlc/observe/trackers/csv.py": module},
        {"dlc/config/job.py": lambda text: replace_line(text, "TRACKERS = (", line)},
    )
    assert run_in(copy, TRACKER_CHECK).startswith("ok")


FAULT_CHECK = """
import random
from typer.testing import CliRunner
from chaos.faults import FaultKind
from chaos.plan import plan_from_dict, reference_markdown
from chaos.schedule import faults_until
from dlc.cli.app import app

flap = FaultKind("flap_link")
plan = plan_from_dict({"flap_link_per_learner_per_min": 6.0, "warmup_s": 0})
drawn = faults_until(plan, [0, 1], random.Random(0), 60.0)
assert drawn and all(f.kind is flap and f.duration_s == 2.0 for f in drawn), drawn
assert "flap_link 6/learner/min for 2 s" in plan.summary(), plan.summary()

calls = []
class Recorder:
    def __getattr__(self, name):
        return lambda *args: calls.append((name, args))
drawn[0].inject(Recorder())
assert calls == [("cut_link", (drawn[0].learner, 2.0))], calls

timed = plan_from_dict({"timeline": [{"at_s": 30, "fault": "flap_link", "learner": 1}]})
assert timed.fault_of(timed.timeline[0]).describe() == "link cut for 2 s, a flap"
try:
    plan_from_dict({"timeline": [{"at_s": 30, "fault": "flap_link", "learner": 1, "until_end": True}]})
    raise AssertionError("until_end accepted")
except Exception as exc:
    assert "a moment's cut" in str(exc), exc
try:
    plan_from_dict({"flap_link_rate": 1})
    raise AssertionError("an alias accepted as a key")
except Exception as exc:
    assert "did you mean flap_link_per_learner_per_min?" in str(exc), exc

assert "--flap-link-rate" in CliRunner().invoke(app, ["chaos", "--help"], env={"COLUMNS": "200"}).output
assert "`flap_link_for_s` | `2.0`" in reference_markdown()
print("ok")
"""


def test_a_fault_with_a_mechanism_of_its_own_is_one_spec(tmp_path):
    (member,) = section_code("A chaos fault")
    copy = apply_example(
        tmp_path,
        {},
        {"chaos/faults.py": lambda text: insert(text, "    def __new__(cls, spec: Spec)", member + "\n", before=True)},
    )
    assert run_in(copy, FAULT_CHECK).startswith("ok")


OUTER_CHECK = """
import numpy as np
from dlc.algo.outer import make_outer
from dlc.config.load import load_recipe

recipe = load_recipe("recipes/tiny.yaml", ["syncer.outer.kind=heavy_ball", "syncer.outer.momentum=0.5"])
step = make_outer(recipe.syncer.outer, 2)
theta = step.step(np.array([1.0, 1.0]), np.array([0.1, -0.2]))  # buf = g
theta = step.step(theta, np.array([0.2, 0.0]))  # buf = 0.5 * buf + g
np.testing.assert_allclose(theta, [1.0 - 0.1 - 0.25, 1.0 + 0.2 - (-0.1)], rtol=1e-6)
again = make_outer(recipe.syncer.outer, 2)
again.load(step.state())  # as a journal or a checkpoint hands it back
np.testing.assert_array_equal(again.step(theta, np.zeros(2)), step.step(theta, np.zeros(2)))
try:
    load_recipe("recipes/tiny.yaml", ["syncer.outer.kind=heavy_ball", "syncer.outer.delay_rounds=2"])
    raise AssertionError("a key the section does not declare was accepted")
except Exception as exc:
    assert "delay_rounds" in str(exc), exc
print("ok")
"""


def test_an_outer_step_is_a_section_and_a_class(tmp_path):
    section, kinds, union, imported, step, registered = section_code("An outer step (`syncer.outer.kind`)")
    union_line = '    Annotated[NesterovOuter, Tag("nesterov")] | Annotated[DelayedNesterovOuter'
    copy = apply_example(
        tmp_path,
        {},
        {
            "dlc/config/outer.py": lambda text: replace_line(
                replace_line(insert(text, "def _kind_of(", section + "\n\n", before=True), "OUTER_KINDS", kinds),
                union_line,
                union,
            ),
            "dlc/algo/outer.py": lambda text: insert(
                insert(
                    replace_line(text, "from dlc.config.outer import", imported), "# Each kind of", step + "\n\n", True
                ),
                '    "delayed_nesterov": DelayedNesterov,',
                registered,
            ),
        },
    )
    assert run_in(copy, OUTER_CHECK).startswith("ok")


EVENT_CHECK = """
import json, os
from pathlib import Path
from dlc.run import events
from dlc.run.rundir import RunDir

os.environ[events.CHECK_VARIABLE] = "1"  # as in the test suite: each record is checked as it is written
rundir = RunDir(Path("run"), recipe_text="")
rundir.path.mkdir()
rundir.begin()
rundir.event(events.DataWrapped(learner=1, step=4000, epoch=2))
rundir.close()
(line,) = [json.loads(text) for text in Path("run/events.jsonl").read_text().splitlines()]
assert events.parse(line) == events.DataWrapped(t=line["t"], learner=1, step=4000, epoch=2), line
assert "| `data_wrapped` | `learner` integer, `step` integer, `epoch` integer |" in events.catalog_markdown()
assert events.wrong(events.DataWrapped(learner=1, step="late", epoch=2)).startswith("event data_wrapped: step")
print("ok")
"""


def test_an_event_kind_is_one_record_and_its_export(tmp_path):
    (record,) = section_code("An event kind")
    name = re.search(r"^class (\w+)\(Event\)", record, re.M).group(1)  # the name the page says to export
    copy = apply_example(
        tmp_path,
        {},
        {
            "dlc/run/events/lifecycle.py": lambda text: text.rstrip("\n") + "\n\n\n" + record,
            "dlc/run/events/__init__.py": lambda text: replace_line(
                insert(text, "from dlc.run.events.lifecycle import (", f"    {name},\n"),
                "__all__ = [",
                f'__all__ = [\n    "{name}",',
            ),
        },
    )
    assert run_in(copy, EVENT_CHECK).startswith("ok")
