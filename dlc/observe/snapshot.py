"""What status.json and summary.json say: built from what the driver knows of a run at one moment.

The driver polls the learners and the syncer; this module only shapes what it learned into the
two documents every reader (`dlc status`, `dlc report`, chaos, a person with `jq`) relies on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dlc.config.budget import Budget
from dlc.config.schema import Recipe
from dlc.observe.mfu import flops_per_token, mfu, peak_flops
from dlc.run.files import HEALTHY_STATES

RATE_WINDOW_S = 10.0  # steps/s for the ETA are measured over this much recent time

LEARNER_SUMMARY_KEYS = (
    "id",
    "state",
    "restarts",
    "goodput",
    "step",
    "tokens",
    "data_position",
    "pushes",
    "adopted",
    "adopt_lag_steps",
    "bytes_sent",
    "steady_tokens_per_s",
    "device",
)


@dataclass
class RunView:
    """What the driver knows of the run at one moment."""

    wall_s: float  # including the time of the runs this one resumed
    step: float  # mean step of the learners that have not left
    tokens: int  # trained in this run, all learners together
    learners: list[dict[str, Any]]  # one row per learner slot, as the supervisor sees it
    goodput: dict[str, Any]  # goodput, badput (and per learner, restarts, once learners exist)
    syncer: dict[str, Any]  # the syncer's last status
    rejected: dict[int, int]  # pushes the syncer rejected, per learner
    eval_initial: float | None = None
    eval_loss: float | None = None
    eval_bpb: float | None = None
    spares: list[dict[str, Any]] = field(default_factory=list)  # hot spares, as the supervisor sees them


class Snapshots:
    """Builds status.json snapshots and the final summary.json of one run."""

    def __init__(self, recipe: Recipe, run_dir: str, budget: Budget, started: float) -> None:
        self.recipe = recipe
        self.run_dir = run_dir
        self.budget = budget
        self.started = started  # time.time() when this driver started
        # Recorded in status.json and summary.json: readers (`dlc status`, `dlc report`) build no model.
        from dlc.core.abstract import param_count  # JAX: the driver's, not a reader's

        self.params = param_count(recipe.model)
        self.flops_per_token = flops_per_token(recipe.model, recipe.learners.seq_len)
        self._rates: list[tuple[float, int, float]] = []
        self._phases: dict[Any, tuple[tuple[Any, Any], float]] = {}  # row id -> (state, phase), since when

    def status(self, run_state: str, view: RunView) -> dict[str, Any]:
        step, tokens, wall = view.step, view.tokens, view.wall_s
        tokens_per_s = sum(v.get("tokens_per_s", 0.0) for v in view.learners if v["state"] in HEALTHY_STATES)
        now = time.monotonic()
        self._rates = [r for r in self._rates if now - r[0] < RATE_WINDOW_S] + [(now, tokens, step)]
        t0, _, s0 = self._rates[0]
        steps_per_s = (step - s0) / (now - t0) if now > t0 else 0.0
        ages = view.syncer.get("last_push_age_s", {})
        learners = [
            {
                **v,
                "last_push_age_s": ages.get(str(v["id"])),
                "rejected": view.rejected.get(v["id"], 0),
                "mfu": self._mfu(v, v.get("tokens_per_s") or 0.0),
            }
            for v in view.learners
        ]
        losses = [v["loss"] for v in learners if v.get("loss") is not None]
        return {
            "run": self.recipe.run.name,
            "run_dir": self.run_dir,
            "algorithm": self.recipe.algorithm,
            "params": self.params,
            "state": run_state,
            "updated_at": round(time.time(), 3),
            "elapsed_s": round(wall, 3),
            "progress": round(self.budget.progress(step, tokens, wall), 4),
            "eta_s": _round(self.budget.eta_s(step, tokens, wall, tokens_per_s, steps_per_s)),
            "step": round(step, 1),
            "tokens": tokens,
            "tokens_per_s": round(tokens_per_s, 1),
            "mfu": self._run_mfu([v for v in learners if v["state"] in HEALTHY_STATES], "tokens_per_s"),
            "train_loss": sum(losses) / len(losses) if losses else None,
            "eval_loss": view.eval_loss,
            "eval_bpb": view.eval_bpb,
            "eval_loss_initial": view.eval_initial,
            "learners": self._timed(learners),
            "spares": self._timed(view.spares),
            "syncer": view.syncer,
            "goodput": view.goodput["goodput"],
            "badput": view.goodput["badput"],
        }

    def _peak(self, row: dict[str, Any]) -> float | None:
        """The peak FLOP/s of a learner's devices, or None (a CPU, a device the table lacks)."""
        peak = peak_flops(row.get("device"), self.recipe.model.compute_dtype)
        return None if peak is None else peak * self.recipe.learners.resolved(row["id"]).devices

    def _mfu(self, row: dict[str, Any], tokens_per_s: float) -> float | None:
        value = mfu(tokens_per_s, self.flops_per_token, self._peak(row))
        return None if value is None else round(value, 4)

    def _run_mfu(self, rows: list[dict[str, Any]], rate: str) -> float | None:
        """The model FLOPs of `rows`' learners over their devices' peak, counting those on a device of
        known peak; None if none is."""
        known = [(row.get(rate) or 0.0, peak) for row in rows if (peak := self._peak(row)) is not None]
        if not known:
            return None
        return round(sum(tps for tps, _ in known) * self.flops_per_token / sum(peak for _, peak in known), 4)

    def _timed(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows in a start-up phase, with `phase_s`: how long they have been in it so far (the live
        view shows it beside the phase: what a starting learner is doing, and for how long)."""
        now, out = time.time(), []
        for row in rows:
            key = (row.get("state"), row.get("phase"))
            was = self._phases.get(row["id"])
            since = was[1] if was is not None and was[0] == key else now
            self._phases[row["id"]] = (key, since)
            out.append({**row, "phase_s": round(now - since, 1)} if row.get("phase") else row)
        return out

    def summary(self, status: str, view: RunView, error: str | None) -> dict[str, Any]:
        sync = view.syncer
        return {
            "status": status,
            "run": self.recipe.run.name,
            "run_dir": self.run_dir,
            "algorithm": self.recipe.algorithm,
            "params": self.params,
            "wall_s": round(view.wall_s, 3),
            "steps": round(view.step, 1),
            "tokens_total": view.tokens,
            "tokens_per_s": round(view.tokens / (time.time() - self.started), 1),
            "eval_loss_initial": view.eval_initial,
            "eval_loss_final": view.eval_loss,
            "eval_bpb_final": view.eval_bpb,
            "learners": [
                {k: v.get(k) for k in LEARNER_SUMMARY_KEYS}
                | {
                    "contributed": sync.get("contributed", {}).get(str(v["id"]), 0),
                    "mfu": self._mfu(v, v.get("steady_tokens_per_s") or 0.0),
                }
                for v in view.learners
            ],
            "mfu": self._run_mfu(view.learners, "steady_tokens_per_s"),
            **view.goodput,
            "rounds": sync.get("rounds_closed", 0),
            "versions": sync.get("versions", []),
            "mean_contributors": sync.get("mean_contributors", 0.0),
            "bytes_up": sync.get("bytes_up", 0),
            "bytes_down": sync.get("bytes_down", 0),
            "pushes_accepted": sync.get("pushes_accepted", 0),
            "pushes_rejected": sync.get("rejections", {}),
            "error": error,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
