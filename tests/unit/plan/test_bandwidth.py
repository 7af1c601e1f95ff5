"""dlc bandwidth: closed forms against hand arithmetic, the link simulation, and bad options."""

from __future__ import annotations

import inspect
import json

import pytest

from dlc.cli.bandwidth import bandwidth_command
from dlc.errors import UserError
from dlc.plan.bandwidth import (
    bytes_per_step,
    codec_bits_per_value,
    decoupled_gbps,
    decoupled_sim_gbps,
    diloco_gbps,
    diloco_sim_gbps,
    dp_gbps,
    dp_sim_gbps,
    plan,
)
from dlc.plan.inputs import LinkSetup, SettingError
from tests.helpers import invoke

PAPER = LinkSetup()  # 5B params, bf16, 2 sites, 1 s steps, 90% utilisation, H=100, P=24, tau=2


def test_dp_needs_about_104_gbit_at_5b_bf16_two_sites():
    # S = 2 (1 - 1/2) * 16 bits * 5e9 = 8e10 bits per step.
    # Window = T_bwd + T (1/CU - 1) = 2/3 + (1/0.9 - 1) = 0.6667 + 0.1111 = 0.7778 s.
    # B = 8e10 / 0.7778 = 1.02857e11 bit/s = 102.857 Gbit/s; the paper rounds its setup to 104.
    assert PAPER.sync_bits(16) == 8e10
    assert dp_gbps(PAPER) == pytest.approx(102.857, rel=1e-4)
    assert dp_gbps(PAPER) == pytest.approx(104, rel=0.02)


def test_dp_at_eight_sites():
    # S = 2 (1 - 1/8) * 16 * 5e9 = 1.4e11 bits; 1.4e11 / 0.7778 s = 180 Gbit/s (the paper says 198).
    assert dp_gbps(LinkSetup(sites=8)) == pytest.approx(180.0, rel=1e-6)


def test_blocking_diloco():
    # Same S every H = 100 steps, window = 2/3 + 100 * 0.1111 = 11.7778 s:
    # 8e10 / 11.7778 = 6.7925 Gbit/s.
    assert diloco_gbps(PAPER) == pytest.approx(6.7925, rel=1e-4)
    # H = 1 is DP.
    assert diloco_gbps(LinkSetup(H=1)) == pytest.approx(dp_gbps(PAPER))


def test_decoupled_deadline_and_sustained_rate():
    # P = 24 fragments of 8e10 / 24 = 3.333e9 bits, each back within tau = 2 s:
    # 3.333e9 / 2 = 1.667 Gbit/s (the paper's 1.7). Sustained: 8e10 / (100 * 1 s) = 0.8, not binding.
    assert decoupled_gbps(PAPER, 16) == pytest.approx(1.6667, rel=1e-4)
    # int4 with a float32 scale per 64 values: 4 + 32/64 = 4.5 bits -> 1.6667 * 4.5 / 16 = 0.46875.
    assert PAPER.int4_bits == 4.5
    assert decoupled_gbps(PAPER, PAPER.int4_bits) == pytest.approx(0.46875, rel=1e-6)
    # H = P = 24 sends a fragment every step: the mean rate binds, 8e10 / 24 s = 3.333 Gbit/s.
    assert decoupled_gbps(LinkSetup(H=24), 16) == pytest.approx(3.3333, rel=1e-4)


def test_dp_simulation_adds_the_last_bucket():
    # The link is the bottleneck (S/B > T_bwd), so it is busy from the first bucket's release,
    # t_fwd + T_bwd / 32 = 1/3 + 2/3/32 = 0.35417 s, until T / CU = 1.1111 s:
    # B = 8e10 / (1.1111 - 0.35417) = 8e10 / 0.75694 = 105.69 Gbit/s.
    assert dp_sim_gbps(PAPER) == pytest.approx(105.69, rel=1e-3)
    assert dp_sim_gbps(PAPER) > dp_gbps(PAPER)
    # Many buckets shrink the gap to the closed form.
    assert dp_sim_gbps(LinkSetup(buckets=4096)) == pytest.approx(dp_gbps(PAPER), rel=1e-3)


def test_diloco_and_decoupled_simulations_agree_with_closed_forms():
    assert diloco_sim_gbps(PAPER) == pytest.approx(diloco_gbps(PAPER), rel=0.01)
    for setup in (PAPER, LinkSetup(H=24), LinkSetup(H=24, tau=0.5)):
        for bits in (16.0, 4.5):
            assert decoupled_sim_gbps(setup, bits) == pytest.approx(decoupled_gbps(setup, bits), rel=2e-3)


def test_plan_orders_the_approaches():
    rows = {r.approach: r for r in plan(PAPER)}
    assert list(rows) == ["dp", "diloco", "decoupled_bf16", "decoupled_int4"]
    assert rows["dp"].gbps > rows["diloco"].gbps > rows["decoupled_bf16"].gbps > rows["decoupled_int4"].gbps


def test_bytes_per_step():
    # 5e9 values * 4.5 bits / 8 = 2.8125e9 bytes per full sync, once per 100 steps: 28.125e6 B/step.
    assert bytes_per_step(5_000_000_000, 24, 100, 4.5) == pytest.approx(28.125e6)
    # Plus 24 headers of 64 B per 100 steps (15.36 B/step), and bf16 replies of 5e9 * 2 B / 100 = 1e8 B/step
    # with their own 24 headers.
    got = bytes_per_step(5_000_000_000, 24, 100, 4.5, reply_bits_per_value=16, header_bytes=64)
    assert got == pytest.approx(28.125e6 + 1e8 + 2 * 15.36)
    with pytest.raises(UserError):
        bytes_per_step(0, 24, 100, 4.5)


def test_codec_bits_per_value():
    assert codec_bits_per_value("none") == 32
    assert codec_bits_per_value("bf16") == 16
    assert codec_bits_per_value("int8") == 8.5  # 8 + 32/64
    assert codec_bits_per_value("int4", block_size=128, scale_bits=16) == 4.125  # 4 + 16/128
    with pytest.raises(UserError, match="not one of"):
        codec_bits_per_value("fp8")


def test_cli_defaults_are_the_setup_defaults():
    params = inspect.signature(bandwidth_command).parameters
    for name, value in LinkSetup().model_dump().items():
        if name == "params":
            assert params[name].default == "5B" and value == 5e9
        else:
            assert params["inner_steps" if name == "H" else name].default == value, name


def test_the_setup_names_its_fields():
    with pytest.raises(SettingError, match=r"^H=0 is out of range: pass 1 or more$"):
        LinkSetup(H=0)
    with pytest.raises(SettingError, match=r"^step_time_s=inf must be a finite number"):
        LinkSetup(step_time_s=float("inf"))


def test_bandwidth_json():
    result = invoke("bandwidth", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert list(out) == ["dp", "diloco", "decoupled_bf16", "decoupled_int4"]
    assert out["dp"]["gbps"] == pytest.approx(102.857, rel=1e-4)
    assert out["decoupled_int4"]["bits_per_value"] == 4.5


def test_bandwidth_table():
    result = invoke("bandwidth", "--params", "1.2B", "--sites", "4", "-H", "50")
    assert result.exit_code == 0, result.output
    assert "1.2B params, 4 sites" in result.stdout and "decoupled_int4" in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--params=-5B"], "--params='-5B' must be positive"),
        (["--params", "big"], "--params='big' is not a count"),
        (["--sites", "1"], "--sites=1 is out of range"),
        (["--utilisation", "1.5"], "--utilisation=1.5 is out of range"),
        (["--tau", "0"], "--tau=0 is out of range"),
        (["-H", "0"], "--inner-steps=0 is out of range"),
    ],
)
def test_bad_options_exit_2_without_traceback(args, fragment):
    result = invoke("bandwidth", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert "Traceback" not in result.output
