"""`dlc bandwidth`: the WAN bandwidth per site that each approach needs, or the traffic of a recipe.

Thin: parse the options into a `LinkSetup`, call dlc.plan.bandwidth, render a table or JSON. NumPy
is imported inside the command so importing this module stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dlc.cli.options import format_count, parse_count, takes_settings
from dlc.cli.tables import print_table
from dlc.errors import UserError
from dlc.plan.inputs import LinkSetup

# 50x the largest models trained (about 2T parameters): past it a figure says only that an input is wrong.
MAX_PARAMS = 1e14


@takes_settings(
    LinkSetup,
    after="params",
    skip={"params"},
    renamed={"H": "inner_steps"},
    short={"H": "-H"},
    shown_defaults={"backward_fraction": "2/3"},
)
def bandwidth_command(
    params: Annotated[str, typer.Option(help="Model parameters: 5B, 1.2B, 350M.")] = "5B",
    json_out: Annotated[bool, typer.Option("--json", help="Print only JSON.")] = False,
    recipe: Annotated[
        Path | None,
        typer.Option(help="Predict the bytes per learner step of `dlc train RECIPE` instead.", show_default=False),
    ] = None,
    **link: Any,
) -> None:
    """WAN bandwidth per site that DP, blocking DiLoCo and decoupled need to hit a utilisation target."""
    if recipe is not None:
        _recipe_traffic(recipe, json_out)
        return
    from dlc.plan.bandwidth import plan

    count = parse_count(params, "--params")
    if count > MAX_PARAMS:
        raise UserError(
            f"--params={params} is {count:.3g} parameters, more than 100T (1e14): 50x the "
            "largest models trained; give the model's size, e.g. 5B"
        )
    setup = LinkSetup(params=count, **link)
    rows = plan(setup)
    if json_out:
        out = {
            r.approach: {
                "gbps": round(r.gbps, 4),
                "sim_gbps": round(r.sim_gbps, 4),
                "bits_per_value": r.bits_per_value,
                "gbit_per_step": round(r.gbit_per_step, 4),
            }
            for r in rows
        }
        typer.echo(json.dumps(out))
        return
    table = [
        [r.approach, f"{r.bits_per_value:g}", f"{r.gbps:.3g}", f"{r.sim_gbps:.3g}", f"{r.gbit_per_step:.3g}"]
        for r in rows
    ]
    title = (
        f"{format_count(setup.params)} params, {setup.sites} sites, {setup.step_time_s:g} s steps, "
        f"{100 * setup.utilisation:g}% utilisation, H={setup.H}, P={setup.fragments}, tau={setup.tau:g}"
    )
    header = ["approach", "bits/value", "closed form(Gbit/s)", "step sim(Gbit/s)", "mean sent(Gbit/step)"]
    print_table(
        title, header, table, "decoupled never waits: it needs the mean rate and each fragment back in tau steps"
    )


def _recipe_traffic(path: Path, json_out: bool) -> None:
    from dlc.config.load import load_recipe
    from dlc.core.abstract import param_count
    from dlc.data.plan import planned_vocab
    from dlc.plan.bandwidth import recipe_traffic

    recipe = planned_vocab(load_recipe(path))
    count = param_count(recipe.model)  # before the fragments, which trace every block
    if count > MAX_PARAMS:
        model = recipe.model
        raise UserError(
            f"{path}: {count:,} parameters, more than 100T (1e14): 50x the largest "
            f"models trained; check model.width ({model.width}) and model.num_layers ({model.num_layers})"
        )
    traffic = recipe_traffic(recipe)
    if json_out:
        typer.echo(json.dumps({k: round(v, 3) for k, v in traffic.items()}))
        return
    table = [
        ["up (learner -> syncer)", f"{traffic['up_bytes_per_step']:,.1f}"],
        ["down (syncer -> learner)", f"{traffic['down_bytes_per_step']:,.1f}"],
        ["one fp32 gradient", f"{traffic['fp32_gradient_bytes']:,.0f}"],
    ]
    share, total = traffic["up_vs_fp32_gradient"], traffic["total_vs_dp_fp32"]
    note = "nothing is sent"
    if share:
        note = (
            f"up is 1/{1 / share:.0f} of an fp32 gradient per step; up + down is 1/{1 / total:.0f} of what "
            "data-parallel moves (an fp32 gradient up and the model down every step)"
        )
    print_table(
        f"{path}: algorithm {recipe.algorithm}, {traffic['params']:,} parameters",
        ["per learner step", "bytes"],
        table,
        note,
    )
