"""GPUs on the real CLI and a real local Ray cluster.

Without a GPU: a recipe reserving GPUs the cluster lacks, and a learner whose JAX has no GPU backend,
each end the run in one line with exit code 2; and where dlc's pure-Python dependencies are missing,
as on a GPU machine where it was installed with --no-deps, the GPU tests still collect and tiny
trains. With one (marker `gpu`, skipped where nvidia-smi shows none): recipes/gpu.yaml's 4 learners
share it with nothing set by hand, and recipes/mixed.yaml's GPU learner lifts the CPU learners'
global model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, assert_user_error, read_jsonl, run_cli, visible_gpus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
GPUS = visible_gpus()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="no NVIDIA GPU visible")


# What a GPU machine may lack: there dlc is installed with --no-deps beside the machine's own JAX (as
# .device/gpu-check.sh does), and its pure-Python dependencies and the test extras may be missing.
BESIDE_ITS_OWN_JAX = (
    *("tokenizers", "safetensors", "tensorboardX", "matplotlib"),  # dlc's own
    *("pyarrow", "datasets", "wandb", "mlflow"),  # its extras'
)


def without_packages(tmp_path: Path) -> str:
    """A PYTHONPATH entry whose sitecustomize makes every package of BESIDE_ITS_OWN_JAX fail to import,
    in the process and in every process it starts (Ray's workers inherit it)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({BESIDE_ITS_OWN_JAX!r}))\n")
    return str(site)


def kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in read_jsonl(run_dir / "events.jsonl")]


@pytest.mark.untimed
def test_a_machine_with_only_jax_and_the_packed_packages_collects_the_gpu_tests_and_trains(tmp_path):
    site = without_packages(tmp_path)
    # Of pytest's plugins, only pytest-timeout is packed: no pytest-xdist, whose options the suite's
    # configuration gives (tests/conftest.py accepts them without it).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, str(REPO)]), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    args = ["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-p", "pytest_timeout"]
    code = f"import sys, pytest; sys.exit(pytest.main({args!r}))"
    collected = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert collected.returncode == 0, collected.stdout[-3000:]
    assert "test_gpu.py::test_four_learners_share_one_gpu_with_nothing_set_by_hand" in collected.stdout
    # The recipe leaves `track` at its default: TensorBoard steps aside in one line, and the run trains.
    run_dir = tmp_path / "run"
    steps = ["learners.count=1", "run.max_steps=30", "eval.every_steps=30"]
    result = run_cli("train", str(TINY), f"run.dir={run_dir}", *steps, timeout=300, env={"PYTHONPATH": site})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no TensorBoard files for this run: tensorboardX is not installed" in result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["eval_loss_final"] < summary["eval_loss_initial"]
    assert not (run_dir / "tensorboard").exists()


@pytest.mark.untimed
@pytest.mark.skipif(GPUS >= 4, reason="this machine has the 4 GPUs the recipe asks for")
def test_gpus_the_cluster_lacks_are_refused_before_any_process_starts(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("train", str(TINY), f"run.dir={run_dir}", "learners.num_gpus=1", timeout=120)
    assert_user_error(result, "error: the recipe reserves 4 GPUs (4 learners x 1) but the Ray cluster has ")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not run_dir.exists()  # refused once the cluster started, before the run directory was made


@pytest.mark.untimed
@pytest.mark.skipif(GPUS > 0, reason="with a GPU and a CUDA jax the learners would train")
def test_a_learner_whose_jax_has_no_gpu_backend_ends_the_run_in_one_line(tmp_path):
    # Ray is told the machine has a GPU (it has none): the learners are placed, start JAX, find only CPU.
    run_dir = tmp_path / "run"
    result = run_cli(
        "train",
        str(TINY),
        f"run.dir={run_dir}",
        "learners.count=2",
        "learners.num_gpus=0.5",
        timeout=180,
        env={"RAY_OVERRIDE_RESOURCES": json.dumps({"GPU": 1})},
    )
    assert_user_error(result, "it reserved a GPU but JAX started on cpu (cpu); install JAX's CUDA plugin")
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: learner 0 (pid ") or line.startswith("error: learner 1 (pid "), line
    assert "pip install -e '.[cuda]'" in line and "learners.num_gpus=0 to run on CPU" in line
    assert "learner_started" not in kinds(run_dir) and not (run_dir / "summary.json").exists()


@pytest.mark.gpu
@needs_gpu
def test_four_learners_share_one_gpu_with_nothing_set_by_hand(tmp_path):
    run_dir = tmp_path / "gpu"
    result = run_cli(
        "train",
        str(REPO / "recipes" / "gpu.yaml"),
        f"run.dir={run_dir}",
        "run.max_steps=150",
        "inner.warmup_steps=30",
        "eval.every_steps=75",
        timeout=850,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    started = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "learner_started"]
    assert len(started) == 4 and all(e["platform"] == "gpu" and e["device"].startswith("gpu: ") for e in started)
    status = json.loads((run_dir / "status.json").read_text())
    assert all(row["device"].startswith("gpu: ") for row in status["learners"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and all(row["contributed"] > 0 for row in summary["learners"])
    assert summary["eval_loss_final"] < 0.8 * summary["eval_loss_initial"]


@pytest.mark.gpu
@needs_gpu
def test_a_gpu_learner_beside_cpu_learners_beats_the_cpu_learners_alone(tmp_path):
    mixed, alone = tmp_path / "mixed", tmp_path / "alone"
    recipe = str(REPO / "recipes" / "mixed.yaml")
    result = run_cli("train", recipe, f"run.dir={mixed}", "run.max_wall_s=90", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((mixed / "summary.json").read_text())["learners"]
    assert rows[0]["device"].startswith("gpu: ") and [r["device"] for r in rows[1:]] == ["cpu"] * 3
    assert all(row["contributed"] > 0 for row in rows)  # every learner's vote counted
    result = run_cli(
        "train", recipe, f"run.dir={alone}", "run.max_wall_s=90", "learners.count=3", "learners.overrides=[]"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loss = {p.name: json.loads((p / "summary.json").read_text())["eval_loss_final"] for p in (mixed, alone)}
    assert loss["mixed"] < loss["alone"], loss
