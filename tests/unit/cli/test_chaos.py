"""`dlc chaos`: a dry run on the latest run directory, bad input, and the link-fault flags."""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path
from typing import Any

import pytest

from dlc.cli.chaos import chaos_command
from dlc.errors import UserError
from dlc.run.files import CHAOS_FILE, CONTROL_FILE, resolve_run
from tests.helpers import REPO, write_status


def _args(**kw: Any) -> dict[str, Any]:
    """Every option of the command at its default (its fault options come from the fault specs), then `kw`."""
    return {**{name: p.default for name, p in inspect.signature(chaos_command).parameters.items()}, **kw}


def test_chaos_command_dry_run_on_the_latest_run(tmp_path: Path, monkeypatch, capsys, spawn):
    monkeypatch.chdir(tmp_path)
    old, new = tmp_path / "runs" / "old", tmp_path / "runs" / "new"
    victim = spawn(["sleep", "30"])
    for run in (old, new):
        run.mkdir(parents=True)
        write_status(run, {0: victim.pid, 1: 4242, 2: 4243})
    os.utime(old / "status.json", (time.time() - 100, time.time() - 100))
    assert resolve_run(None, live=True) == Path("runs/new")
    plan = tmp_path / "plan.yaml"
    plan.write_text("warmup_s: 0\ntimeline:\n  - {at_s: 0, fault: kill, learner: 0}\n  - {at_s: 0.1, fault: join}\n")
    chaos_command(**_args(plan=plan, dry_run=True, duration=2.0))
    out = capsys.readouterr().out
    assert "kill         learner 0   would SIGKILL" in out and "[dry_run]" in out
    assert out.splitlines()[-2].split() == ["total", "0", "1", "1", "0"]  # the join comes within min_gap_s: refused
    assert victim.poll() is None and not (new / CONTROL_FILE).exists()
    assert len((new / CHAOS_FILE).read_text().splitlines()) == 2 and not (old / CHAOS_FILE).exists()


def test_chaos_command_reports_bad_input(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="nothing to inject"):
        chaos_command(**_args())
    with pytest.raises(UserError, match="no run directory with a status.json under 'runs'"):
        chaos_command(**_args(kill_rate=1.0))
    with pytest.raises(UserError, match=r"--kill-rate=-1.0: Input should be greater than or equal to 0"):
        chaos_command(**_args(kill_rate=-1.0))
    # The default warm-up (20 s) would take the whole duration: nothing could ever fire.
    with pytest.raises(UserError, match=r"duration_s=20 ends before the warm-up does \(warmup_s=20\).*--warmup"):
        chaos_command(**_args(kill_rate=1.0, duration=20.0))
    with pytest.raises(UserError, match="no run directory with a status.json"):  # a warm-up that leaves room
        chaos_command(**_args(kill_rate=1.0, duration=20.0, warmup=5.0))
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    write_status(run, {0: 4242, 1: 4243}, state="completed")
    with pytest.raises(UserError, match="is not running \\(state: completed\\)"):
        chaos_command(**_args(run=Path("r1"), kill_rate=1.0))
    with pytest.raises(UserError, match="'nope' is not a run directory"):
        chaos_command(**_args(run=Path("nope"), kill_rate=1.0))
    write_status(run, {0: 4242, 1: 4243})
    with pytest.raises(UserError, match="targets learner 2"):
        chaos_command(**_args(run=run, plan=REPO / "chaos" / "plans" / "kill_storm.yaml"))


def test_chaos_command_link_flags(tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from dlc.cli.app import app

    runner = CliRunner()
    shown = runner.invoke(app, ["chaos", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and all(f in shown.stdout for f in ("--degrade-link-rate", "--link-factor",
                                                                    "--cut-link-rate"))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    bad = runner.invoke(app, ["chaos", "--degrade-link-rate", "1", "--link-factor", "1"])
    assert bad.exit_code == 2 and "--link-factor=1.0: Input should be greater than 1" in bad.stderr
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    write_status(run, {0: 4242, 1: 4243, 2: 4244})
    plan = tmp_path / "links.yaml"
    plan.write_text(
        "warmup_s: 0\nmin_gap_s: 0\nmax_concurrent: 2\ntimeline:\n  - {at_s: 0, fault: degrade_link, learner: 1}\n"
        "  - {at_s: 0, fault: cut_link, learner: 2, duration_s: 4}\n"
    )
    flags = ["--degrade-link-rate", "0.5", "--link-factor", "4", "--cut-link-rate", "0.25"]
    result = runner.invoke(app, ["chaos", "r1", "--plan", str(plan), *flags, "--duration", "0.3", "--dry-run"])
    assert result.exit_code == 0, result.output
    summary = "degrade_link 0.5/learner/min x4 for 30 s, cut_link 0.25/learner/min for 10 s, 2 timeline fault(s)"
    assert summary in result.stderr
    assert "degrade_link learner 1   would link bandwidth /4, latency x4 for 30 s [dry_run]" in result.stdout
    assert "cut_link     learner 2   would link cut for 4 s, messages held until it returns [dry_run]" in result.stdout
    assert not (run / CONTROL_FILE).exists()
