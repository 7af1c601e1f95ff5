"""The blocking baselines on the real CLI and a real local Ray cluster: dp and diloco learn.

Two learners each, a short run: the point is that each algorithm trains end to end, that its
barrier holds every learner to the same versions, that its bytes are what its messages weigh,
and that time blocked on the (emulated) network is filed as waiting. diloco's messages go as Ray
actor calls, dp's on the direct channel.
"""

import json

import pytest

from dlc.config.load import load_recipe
from dlc.core.codec import get_codec
from dlc.core.model import build_model, count_params
from tests.helpers import TINY, read_jsonl, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.untimed, pytest.mark.timeout(900)]


def train(tmp_path, *overrides):
    run_dir = tmp_path / "run"
    result = run_cli(
        "train", str(TINY), f"run.dir={run_dir}", "learners.count=2", "eval.every_steps=1000", *overrides, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def test_dp_steps_together_and_learns(tmp_path):
    # 25 ms each way on every link: at least 50 ms of every step is spent waiting on the network.
    # On an empty compilation cache, as a fresh machine's first run.
    steps = 60
    run_dir, summary = train(
        tmp_path,
        "algorithm=dp",
        f"run.max_steps={steps}",
        "learners.latency_ms=25",
        f"run.compile_cache_dir={tmp_path}/xla",
        "profile.learners=[1]",  # a JAX profiler trace of learner 1's steps 5 to 8
        "profile.steps=[5,8]",
    )
    assert summary["status"] == "completed"
    assert summary["eval_loss_final"] < 0.65 * summary["eval_loss_initial"]
    assert summary["rounds"] == steps and summary["versions"] == [steps] and summary["mean_contributors"] == 2.0
    assert [learner["step"] for learner in summary["learners"]] == [steps, steps]
    n = count_params(build_model(load_recipe(TINY).model, 0)[1])
    assert summary["bytes_up"] == steps * 2 * 4 * n  # one fp32 gradient per learner per step
    assert summary["bytes_down"] == (steps + 1) * 2 * 4 * n  # the model on admission, then after every step
    assert summary["badput"]["waiting"] >= 2 * steps * 0.05
    events = read_jsonl(run_dir / "events.jsonl")
    assert [e["kind"] for e in events].count("members_admitted") == 1
    assert not [e for e in events if e["kind"] == "reconfigure"]  # nobody failed: no pause
    # The two learners compile the same functions: one compiled them, and the other loaded what it
    # compiled from the cache (having waited for it, or come after it).
    training = [e for e in events if e["kind"] == "learner_training"]
    assert sorted(e["compiled_from"] for e in training) == ["cache", "xla"]
    (traced,) = [e for e in events if e["kind"] == "profile_written"]
    assert traced["learner"] == 1 and traced["steps"] == [5, 8] and traced["dir"] == str(run_dir / "profile/learner-1")
    (trace,) = (run_dir / "profile" / "learner-1" / "plugins" / "profile").glob("*/perfetto_trace.json.gz")
    assert trace.stat().st_size > 0 and list(trace.parent.glob("*.xplane.pb"))  # Perfetto's, and TensorBoard's


def test_blocking_diloco_syncs_every_h_steps_and_learns(tmp_path):
    recipe = load_recipe(TINY)
    H = recipe.syncer.sync_interval_steps
    steps = 4 * H
    # Its messages go as Ray actor calls (syncer.channel=ray); every other end-to-end run uses the
    # direct channel, the default.
    run_dir, summary = train(tmp_path, "algorithm=diloco", f"run.max_steps={steps}", "syncer.channel=ray")
    assert summary["status"] == "completed"
    assert summary["eval_loss_final"] < 0.65 * summary["eval_loss_initial"]
    assert summary["rounds"] == 4 and summary["mean_contributors"] == 2.0
    n = count_params(build_model(recipe.model, 0)[1])
    push = get_codec(recipe.syncer.codec, recipe.syncer.codec_block_values).encoded_nbytes(n)
    assert summary["bytes_up"] == 4 * 2 * push  # the whole model's outer gradient, int4, every H steps
    closed = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "round_closed"]
    assert [e["version"] for e in closed] == [1, 2, 3, 4] and all(e["contributors"] == [0, 1] for e in closed)
