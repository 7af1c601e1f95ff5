"""MFU: FLOPs per token by hand, the peak table by the device names JAX reports, and the run's views."""

import pytest

from dlc.config.budget import Budget
from dlc.config.load import load_recipe
from dlc.core.abstract import param_count
from dlc.observe.mfu import flops_per_token, mfu, peak_flops
from dlc.observe.snapshot import RunView, Snapshots
from tests.helpers import TINY


@pytest.mark.parametrize(
    ("device", "dtype", "tflops"),
    [
        ("gpu: NVIDIA H100 80GB HBM3", "bfloat16", 989.5),
        ("gpu: NVIDIA H100 80GB HBM3", "float32", 494.7),  # TF32, JAX's default precision on the GPU
        ("gpu: NVIDIA H100 PCIe", "bfloat16", 756.0),
        ("gpu: NVIDIA H200", "bfloat16", 989.5),
        ("gpu: NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
        ("gpu: NVIDIA L4", "float32", 60.0),
        ("tpu: TPU v5 lite", "bfloat16", 197.0),
        ("tpu: TPU v5p", "bfloat16", 459.0),
        ("tpu: TPU v6 lite", "bfloat16", 918.0),
        ("tpu: TPU v6 lite", "float32", None),  # no float32 figure: unknown
        ("gpu: NVIDIA L40S", "bfloat16", None),  # not an L4, and not in the table
        ("cpu", "float32", None),
        (None, "float32", None),
    ],
)
def test_the_peak_of_a_device_by_the_name_jax_gives_it(device, dtype, tflops):
    assert peak_flops(device, dtype) == (None if tflops is None else tflops * 1e12)


def test_flops_per_token_are_six_n_plus_the_attention_by_hand():
    model = load_recipe(TINY).model  # 4 blocks of width 64
    assert flops_per_token(model, 64) == 6 * param_count(model) + 12 * 4 * 64 * 64
    assert mfu(100.0, 2e9, 1e12) == pytest.approx(0.2) and mfu(100.0, 2e9, 1e12, devices=2) == pytest.approx(0.1)
    assert mfu(1000.0, 2e9, None) is None


def test_status_and_summary_show_mfu_where_the_peak_is_known_and_none_on_a_cpu():
    recipe = load_recipe(TINY, ["model.compute_dtype=bfloat16", "learners.count=2"])
    snapshots = Snapshots(recipe, "runs/x", Budget(recipe), started=0.0)
    per_token = flops_per_token(recipe.model, recipe.learners.seq_len)
    rows = [
        {"id": 0, "state": "training", "device": "gpu: NVIDIA H100 80GB HBM3", "tokens_per_s": 1e6},
        {"id": 1, "state": "training", "device": "cpu", "tokens_per_s": 1e3, "steady_tokens_per_s": 1e3},
    ]
    rows[0]["steady_tokens_per_s"] = 2e6
    view = RunView(
        wall_s=1.0, step=1.0, tokens=0, learners=rows, goodput={"goodput": None, "badput": {}}, syncer={}, rejected={}
    )
    status = snapshots.status("running", view)
    on_gpu = 1e6 * per_token / 989.5e12
    assert [r["mfu"] for r in status["learners"]] == [round(on_gpu, 4), None]
    assert status["mfu"] == round(on_gpu, 4)  # the learners of known peak: the CPU's is unknown, not zero
    summary = snapshots.summary("completed", view, None)
    assert [r["mfu"] for r in summary["learners"]] == [round(2 * on_gpu, 4), None]
    assert summary["mfu"] == round(2 * on_gpu, 4)
    cpu_only = RunView(**{**view.__dict__, "learners": [rows[1]]})
    assert (
        snapshots.status("running", cpu_only)["mfu"] is None
        and snapshots.summary("completed", cpu_only, None)["mfu"] is None
    )
