"""`dlc status` and `dlc report` as commands (in-process): output, JSON, the latest run, and bad
arguments; and the view modules stay free of JAX, Ray and matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.fixtures_runs import finished_run, make_run, status
from tests.helpers import REPO, invoke, row


def test_status_command(tmp_path, monkeypatch):
    path = make_run(tmp_path / "runs" / "tiny-1", status(updated_at=time.time()))
    result = invoke("status", str(path), "--once")
    assert result.exit_code == 0, result.output
    assert "tiny · decoupled · running" in result.output and row(result.output, 3)[1] == "training"
    snap = json.loads(invoke("status", str(path), "--json").output)
    assert snap["dp_equivalent"] == {"params": 219_520, "learner_steps": 400, "bytes_each_way": 351_232_000}
    assert snap["learners"][2]["rejected"] == 2 and snap["syncer"]["bytes_up"] == 3_512_320
    monkeypatch.chdir(tmp_path)
    assert json.loads(invoke("status", "--json").output)["run_dir"] == "runs/tiny-1"
    for args, message in (
        (["status", str(tmp_path / "nope")], "does not exist"),
        (["status", str(tmp_path)], "is not a run directory"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2 and message in result.output, result.output


def test_report_command(tmp_path, monkeypatch):
    run = finished_run(tmp_path / "runs" / "tiny-1")
    result = invoke("report", str(run))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == str(run / "report" / "report.md")
    monkeypatch.chdir(tmp_path)
    result = invoke("report", "--out", "cmp")  # the latest run under ./runs
    assert result.exit_code == 0 and (tmp_path / "cmp" / "bytes_sent.png").is_file(), result.output
    for args, message in (
        (["report", str(tmp_path / "nope")], "does not exist"),
        (["report", str(run), str(run)], "given twice"),
        (["report", str(run), "--out", str(run / "recipe.yaml")], "is not a directory"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2 and message in result.output, result.output


def test_view_modules_do_not_import_jax_ray_or_matplotlib():
    modules = "dlc.cli.view, dlc.observe.reader, dlc.observe.dashboard, dlc.observe.report, dlc.observe.trackers"
    # the trackers import their packages only when they open
    heavy = "{'jax', 'ray', 'flax', 'matplotlib', 'tensorboardX', 'wandb', 'mlflow'}"
    code = f"import sys, {modules}; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
