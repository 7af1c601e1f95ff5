"""The packages in their import order, each with its concern: the rule tests/test_layers.py enforces.

A package imports only packages before it in LAYERS; the layout page's package table and its
import-rule sentence are generated from this list (`python -m dlc.cli.reference`), so the order the
test enforces and the order the manual states are one list. Listed at the top of the command layer,
the one package allowed to import every other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Package:
    """A package of the repository: its import name, its path as the manual shows it, and its one concern."""

    name: str
    path: str
    concern: str


LAYERS: tuple[Package, ...] = (
    Package(
        "dlc.errors", "dlc/errors.py", "`UserError`, the one exception a command turns into one line and exit code 2"
    ),
    Package("dlc.units", "dlc/units.py", "byte units, and the one formatter of byte sizes every message and view uses"),
    Package(
        "dlc.config",
        "dlc/config",
        (
            "the recipe: its typed schema, a module per section (every field documented), loading YAML with "
            "dotted overrides, the stop condition, and the reference tables generated from it"
        ),
    ),
    Package(
        "dlc.data",
        "dlc/data",
        (
            "what a run reads, NumPy only: the byte corpus read into memory, `dlc prepare`'s sources, "
            "tokenizers and shard writer, the prepared dataset's manifest and its memory-mapped learner "
            "streams and eval windows, and the plan that hands each learner its share"
        ),
    ),
    Package(
        "dlc.core",
        "dlc/core",
        (
            "pure JAX and NumPy, no Ray and no run directory: the model and its block families (`arch/`, one "
            "module each), the jitted steps, a learner's host loop, fragments and their device functions, "
            "codecs, evaluation, the model's shapes; a process's XLA threads, allocator, backend and "
            "compilation cache"
        ),
    ),
    Package(
        "dlc.net",
        "dlc/net",
        (
            "the seam every learner-syncer message crosses: the transport, the direct channel (its framing, "
            "the syncer's ports), the wire format, emulated links"
        ),
    ),
    Package(
        "dlc.run",
        "dlc/run",
        (
            "the run-directory contract that `dlc status`, `dlc report` and chaos read: file names, the "
            "driver's writer, storage and checkpoints"
        ),
    ),
    Package(
        "dlc.algo",
        "dlc/algo",
        (
            "the algorithms, chosen once from a registry: `decoupled/` (Decoupled DiLoCo: the learner's side, "
            "the syncer's clock, rounds, guards, the syncer), `blocking/` (`dp` and `diloco`), `none`; merge "
            "weights, RDA and the outer step they share; `local.py`, the in-process twin that runs them "
            "without Ray, for tests and tuning"
        ),
    ),
    Package(
        "dlc.observe",
        "dlc/observe",
        (
            "what the user sees: status and summary snapshots, the goodput ledger, the live console, the "
            "experiment trackers (TensorBoard, W&B, MLflow), the `dlc status` view, `dlc report`"
        ),
    ),
    Package(
        "dlc.plan",
        "dlc/plan",
        (
            "answers without training: `dlc simulate`, `dlc bandwidth`, and what a recipe needs before "
            "anything is allocated"
        ),
    ),
    Package(
        "dlc.use",
        "dlc/use",
        (
            "what is done with a trained model afterwards: read back from a run's checkpoints (the global "
            "model from the syncer's fragments, or a learner's), for `dlc sample` and `dlc eval`"
        ),
    ),
    Package(
        "chaos",
        "chaos/",
        (
            "fault kinds, plans (`chaos/plans/*.yaml`), schedules, guardrails, the controller, and the "
            "run-directory target it acts through"
        ),
    ),
    Package(
        "dlc.engine",
        "dlc/engine",
        (
            "Ray, and the only package that imports it, by role: `learner/` (the actor and its loop, "
            "start-up, pace, checkpoints, uplink, state copies), `syncer/` (the actor, its journal, its "
            "reports to the driver, the evaluator and evaluations), `supervision/` (the supervisor, "
            "recoveries, hot spares, chaos's requests and the node agents that carry them out); at the top "
            "the driver's loop, the cluster, placement, devices, the processes it starts, Ray metrics and "
            "Ctrl-C"
        ),
    ),
    Package(
        "dlc.train",
        "dlc/train.py",
        "the library's entry point: `run(recipe)` trains it, and `dlc train` calls only this",
    ),
    Package(
        "dlc.cli",
        "dlc/cli",
        "thin Typer commands that parse, load and call one function; the writer of the manual's generated "
        "pages, and this order of the packages",
    ),
)

# The rest of the repository, after the packages in the layout page's table; they follow no layer.
OTHERS: tuple[Package, ...] = (
    Package("bench/", "bench/", "benchmarks run by hand ([benchmarks](../benchmarks/index.md))"),
    Package(
        "tests/unit/",
        "tests/unit/",
        (
            "unit tests, a folder per package: `tests/unit/<package>/test_<module>.py` "
            "(`tests/unit/test_units.py` for `dlc/units.py`)"
        ),
    ),
    Package("tests/e2e/", "tests/e2e/", "end-to-end runs of the real CLI on Ray, all marked `slow`"),
    Package(
        "tests/",
        "tests/",
        (
            "at the top: `test_layers.py` (the import rule), `test_docs.py` (the manual), `test_bad_input.py` "
            "(an adversarial sweep of bad input), `test_extending.py` (the worked examples of [Extending "
            "dlc](extending.md), applied to a copy of the repository); shared by the others: `helpers.py`, "
            "`fakes.py` (a clock that moves when told, a Ray call made in-process, a run for chaos to act "
            "on), `fixtures_runs.py` (run directories written by hand), `conftest.py`"
        ),
    ),
)


def layout_markdown() -> str:
    """The layout page's package table and its import-rule sentence, in LAYERS' order."""
    lines = ["| package | concern |", "|---|---|"]
    lines += [f"| `{package.path}` | {package.concern} |" for package in (*LAYERS, *OTHERS)]
    order = ", ".join(f"`{package.name.removeprefix('dlc.')}`" for package in LAYERS)
    lines += ["", "## The import rule", "", f"A package imports only packages before it in this order: {order}."]
    return "\n".join(lines) + "\n"
