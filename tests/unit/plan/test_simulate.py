"""dlc simulate: the pause arithmetic by hand, the paper's table, and the command's errors."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from dlc.cli.options import parse_count
from dlc.cli.simulate import simulate_command
from dlc.plan.inputs import FailureModel, RepairDist, SettingError
from dlc.plan.simulate import (
    PAPER_CHIPS,
    PAPER_GOODPUT_PCT,
    absorbing_pauses,
    cell_rng,
    simulate_all,
    simulate_decoupled,
    simulate_dp,
    simulate_elastic,
    sweep,
    union_intervals,
)
from tests.helpers import REPO, invoke

YEAR_S = 365.25 * 86400


def test_absorbing_pauses_by_hand():
    # Pauses of 10 s. 0 starts [0, 10) and absorbs 5; 12 starts [12, 22) and absorbs 13
    # and 21.9; 22 is exactly at the end so starts [22, 32); 40 starts [40, 41) (1 s pause).
    times = np.array([0.0, 5.0, 12.0, 13.0, 21.9, 22.0, 40.0])
    lengths = np.array([10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 1.0])
    starts, ends = absorbing_pauses(times, lengths)
    assert starts.tolist() == [0.0, 12.0, 22.0, 40.0]
    assert ends.tolist() == [10.0, 22.0, 32.0, 41.0]


def test_absorbing_pauses_matches_a_plain_loop():
    rng = np.random.default_rng(3)
    for _ in range(50):
        times = np.sort(rng.uniform(0, 500, rng.integers(0, 400)))
        lengths = rng.choice([2.0, 8.0, 30.0], times.size)
        expected, end = [], -np.inf
        for t, length in zip(times, lengths, strict=True):
            if t >= end:
                end = t + length
                expected.append((t, end))
        starts, ends = absorbing_pauses(times, lengths)
        assert list(zip(starts, ends, strict=True)) == expected


def test_union_intervals_by_hand():
    # [0,2) and [1,3) overlap -> [0,3); [3,4) touches it -> [0,4); [5,9) holds [6,7); [9.5,10) is alone.
    starts = np.array([5.0, 0.0, 1.0, 3.0, 6.0, 9.5])
    ends = np.array([9.0, 2.0, 3.0, 4.0, 7.0, 10.0])
    merged_starts, merged_ends = union_intervals(starts, ends)
    assert merged_starts.tolist() == [0.0, 5.0, 9.5]
    assert merged_ends.tolist() == [4.0, 9.0, 10.0]


def test_plain_dp_matches_the_renewal_formula():
    # Mean fraction of slices in repair: 64 chips * 4.2 h / 8766 h = 0.030664; spares 3x that = 0.091993.
    # Job chips 1.2M * (1 - 0.091993) = 1.089608M; lambda = 1.089608e6 / 31_557_600 s = 0.034528 /s.
    # Up time ~ Exp(lambda), then a 71.5 s outage: uptime = 1 / (1 + 0.034528 * 71.5)
    # = 1 / 3.46874 = 0.28829; goodput = 0.908007 * 0.28829 = 0.26177.
    model = FailureModel(horizon_days=5)
    assert model.dp_spare_fraction == pytest.approx(0.091993, rel=1e-4)
    r = simulate_dp(1.2e6, model, np.random.default_rng(0))
    assert r.uptime == pytest.approx(0.28829, abs=0.008)
    assert r.goodput == pytest.approx(0.26177, abs=0.008)


def test_elastic_with_no_pauses_loses_only_slices_in_repair():
    # Slices of 64 chips fail at 64 / 8766 h; each is out 4.2 h, so the mean fraction in
    # repair is 64 * 4.2 / 8766 = 0.03066 and goodput = 1 - 0.03066 = 0.9693.
    model = FailureModel(pause_on_failure_s=1e-6, pause_on_return_s=1e-6, repair_dist=RepairDist.FIXED)
    assert model.repair_fraction == pytest.approx(64 * 4.2 / 8766, rel=1e-3)
    model = model.model_copy(update={"horizon_days": 2.0})
    r = simulate_elastic(300e3, model, np.random.default_rng(1))
    assert r.goodput == pytest.approx(1 - 64 * 4.2 / 8766, abs=0.003)
    assert r.uptime == pytest.approx(1.0, abs=1e-3)


def test_paper_column_at_1_2m_chips_with_a_short_horizon():
    # Paper, 1.2M chips: DP 27, elastic 58, decoupled M=2/4/8/16: 70 / 82 / 88 / 93.
    model = FailureModel(horizon_days=3)
    column = {("dp", 1): 27, ("elastic_dp", 1): 58, ("decoupled", 2): 70}
    column.update({("decoupled", 4): 82, ("decoupled", 8): 88, ("decoupled", 16): 93})
    for (system, m), paper in column.items():
        r = simulate_all(1.2e6, m, 1, model, seed=7)[system]
        assert 100 * r.goodput == pytest.approx(paper, abs=3.0), (system, m)


def test_defaults_reproduce_every_cell_of_the_paper_table():
    rows = sweep(PAPER_CHIPS, [1, 2, 4, 8, 16], 1, FailureModel(), seed=0)
    for row in rows:
        paper = PAPER_GOODPUT_PCT[(row.system, row.learners)]
        ours = [100 * r.goodput for r in row.results]
        assert ours == pytest.approx(paper, abs=3.0), row.label


def test_one_decoupled_learner_is_elastic_dp_within_noise():
    model = FailureModel(horizon_days=5)
    for chips in (150e3, 1.2e6):
        elastic = simulate_elastic(chips, model, np.random.default_rng(11))
        decoupled = simulate_decoupled(chips, 1, 1, model, np.random.default_rng(12))
        assert decoupled.goodput == pytest.approx(elastic.goodput, abs=0.01)
        assert decoupled.uptime == pytest.approx(elastic.uptime, abs=0.01)


def test_rule_of_thumb_m_learners_behave_like_elastic_at_chips_over_m():
    model = FailureModel(horizon_days=5)
    eight = simulate_decoupled(1.2e6, 8, 1, model, cell_rng(0, "decoupled", 1.2e6, 8))
    elastic = simulate_elastic(150e3, model, cell_rng(0, "elastic_dp", 150e3, 1))
    assert eight.goodput == pytest.approx(elastic.goodput, abs=0.01)


def test_quorum_of_all_learners_needs_every_one_stepping():
    # Two independent learners each stepping a fraction u of the time: both step u^2.
    model = FailureModel(horizon_days=5)
    one = simulate_elastic(600e3, model, np.random.default_rng(5))
    both = simulate_decoupled(1.2e6, 2, 2, model, np.random.default_rng(6))
    assert both.uptime == pytest.approx(one.uptime**2, abs=0.02)
    assert simulate_decoupled(1.2e6, 2, 1, model, np.random.default_rng(6)).uptime > both.uptime


def test_same_seed_same_numbers():
    model = FailureModel(horizon_days=1)
    assert simulate_all(300e3, 4, 1, model, seed=3) == simulate_all(300e3, 4, 1, model, seed=3)


def test_2_4m_chips_for_30_days_takes_seconds():
    start = time.perf_counter()
    simulate_all(2.4e6, 8, 1, FailureModel(), seed=0)
    assert time.perf_counter() - start < 5.0


def test_cli_defaults_are_the_model_defaults():
    params = inspect.signature(simulate_command).parameters
    for name, value in FailureModel().model_dump(mode="json").items():
        if name != "mtbi_chip_years":
            assert params[name].default == value, name


def test_the_model_names_its_fields_and_the_command_its_options():
    with pytest.raises(SettingError) as caught:
        FailureModel(dp_spare_ratio=3.0, repair_mean_h=60.0)
    # 64 chips * 60 h / 8766 h = 43.8% of slices in repair; 3x that = 131% of chips as spares.
    assert str(caught.value) == (
        "dp_spare_ratio=3.0 with 43.8% of slices in repair reserves 131% of chips as spares: "
        "shorten repair_mean_h, shrink chips_per_slice or lower the ratio"
    )
    result = invoke("simulate", "--repair-mean-h", "60")
    assert "shorten --repair-mean-h, shrink --chips-per-slice" in result.stderr


def test_parse_count():
    assert parse_count("150k", "--chips") == 150_000
    assert parse_count("1.2M", "--chips") == 1_200_000
    assert parse_count("2_400_000", "--chips") == 2_400_000
    assert parse_count("5B", "--params") == 5e9


def test_sweep_json_holds_every_row_and_the_paper_figures():
    args = ["simulate", "--sweep", "chips=150k,1.2M", "learners=2", "--horizon-days", "0.5", "--no-plot", "--json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["chips"] == [150_000, 1_200_000]
    assert [r["label"] for r in out["rows"]] == ["DP, no elasticity", "DP, elastic", "decoupled M=2"]
    assert out["rows"][2]["paper_goodput_pct"] == [94, 70]


def test_simulate_json_is_fractions_and_constants():
    result = invoke("simulate", "--chips", "150k", "--horizon-days", "1", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["systems"]) == {"dp", "elastic_dp", "decoupled"}
    for system in out["systems"].values():
        assert 0 < system["goodput"] <= system["uptime"] <= 1
    assert out["constants"]["pause_on_failure_s"] == FailureModel().pause_on_failure_s
    assert out["constants"]["learners"] == 8


def test_sweep_prints_the_paper_layout_and_writes_a_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "g.png"
    args = ["simulate", "--sweep", "chips=150k,1.2M", "learners=1,8", "--horizon-days", "1", "--plot-file", str(png)]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["DP,", "DP,", "decoupled"]
    assert "(88)" in result.stdout  # the paper's M=8 figure at 1.2M beside ours
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--chips=-5"], "--chips='-5' must be positive"),
        (["--chips", "lots"], "--chips='lots' is not a count"),
        (["-M", "4", "-K", "5"], "--quorum=5 must be between 1 and --learners=4"),
        (["--learners", "0"], "--learners=0 must be at least 1"),
        (["--repair-dist", "weibull"], "--repair-dist='weibull' is not one of"),
        (["--horizon-days", "0"], "--horizon-days=0.0 must be positive"),
        (["--dp-spare-ratio", "0.5"], "--dp-spare-ratio=0.5 holds fewer spares than there are slices in repair"),
        (["--repair-mean-h", "60"], "shorten --repair-mean-h"),
        (["--failures-per-chip-year", "2", "--mtbi-chip-years", "1"], "give one of them"),
        (["chips=1M"], "add --sweep"),
        (["--sweep", "gpus=8"], "sweep axis 'gpus=8' is not chips=... or learners=..."),
        (["--sweep", "learners=1,x"], "'x' is not a whole number"),
        (["--sweep", "learners=1,2,4", "--quorum", "5"], "--quorum=5 must be between 1 and --learners=4"),
    ],
)
def test_bad_options_exit_2_without_traceback(args, fragment):
    result = invoke("simulate", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_importing_the_commands_pulls_in_nothing_heavy():
    heavy = "{'jax', 'ray', 'numpy', 'matplotlib'}"
    code = f"import sys, dlc.cli.simulate, dlc.cli.bandwidth; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
