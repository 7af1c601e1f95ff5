"""Where each process runs: the syncer on the driver's node, learners spread or packed, per-learner demands.

- The syncer (CPU) and the evaluator run on the driver's node: the syncer's journal is a local file
  of the run directory there, and a restarted syncer finds it.
- Learners: `learners.placement: spread` (default) asks Ray to put them on as many nodes as it can
  (its SPREAD strategy); `pack` reserves the learners' slots as one placement group with Ray's PACK
  strategy (as few nodes as possible), learner i and its restarts in bundle i. Joiners and hot
  spares are not in the group: Ray places them where there is room.
- A learner's `resources` (custom Ray resources, e.g. {node_b: 1} for a node started with
  `--resources='{"node_b": 4}'`) and `label_selector` (node labels, `ray start --labels`) pin it.

`check` refuses, before anything runs, a demand no node of the cluster can meet (which would
otherwise wait forever for resources that never come).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from dlc.config.schema import Recipe
from dlc.errors import UserError

PACK_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Demand:
    """What one process asks of the node it runs on."""

    who: str  # "learner 2", "the syncer"
    resources: dict[str, float]  # CPU, GPU and custom resources, zero amounts left out
    labels: dict[str, str]  # a Ray label selector
    field: str  # the recipe field that sets it, for the fix


def learner_demands(recipe: Recipe) -> list[Demand]:
    out = []
    for i in range(recipe.learners.count):
        s = recipe.learners.resolved(i)
        wants = {"CPU": s.num_cpus, "GPU": s.num_gpus, **s.resources}
        out.append(
            Demand(f"learner {i}", {k: v for k, v in wants.items() if v}, s.label_selector, "learners.overrides")
        )
    return out


def check(recipe: Recipe, nodes: list[dict[str, Any]], driver_node: str) -> None:
    """UserError for a learner no node can hold, or a syncer the driver's node cannot hold."""
    described = "; ".join(_describe(n) for n in nodes)
    for demand in learner_demands(recipe):
        if not any(_fits(demand, n) for n in nodes):
            raise UserError(
                f"{demand.who} asks for {_wants(demand)}, which no node of the cluster has ({described}): fix "
                f"{demand.field} (resources, label_selector, num_cpus, num_gpus), or start a node that has them "
                "(ray start --resources=... --labels=...)"
            )
    here = next((n for n in nodes if n["node_id"] == driver_node), None)
    syncer = Demand("the syncer", {"CPU": recipe.syncer.num_cpus} if recipe.syncer.num_cpus else {}, {}, "")
    if here is not None and not _fits(syncer, here):
        raise UserError(
            f"the syncer runs on the driver's node ({_describe(here)}), which has fewer than the "
            f"syncer.num_cpus={recipe.syncer.num_cpus:g} CPUs it reserves: run dlc train on a node with CPUs "
            "(the head: ray start --head --num-cpus=N), or set syncer.num_cpus=0"
        )


def _fits(demand: Demand, node: dict[str, Any]) -> bool:
    have = node.get("resources", {})
    enough = all(have.get(name, 0.0) >= amount for name, amount in demand.resources.items())
    return enough and all(_label_matches(node.get("labels", {}).get(k), v) for k, v in demand.labels.items())


def _label_matches(value: str | None, wanted: str) -> bool:
    """Ray's label selector values: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""
    negate = wanted.startswith("!")
    wanted = wanted.removeprefix("!")
    if wanted.startswith("in(") and wanted.endswith(")"):
        hit = value in {x.strip() for x in wanted[3:-1].split(",")}
    else:
        hit = value == wanted
    return hit != negate


def _wants(demand: Demand) -> str:
    parts = [f"{k} {v:g}" for k, v in demand.resources.items()]
    parts += [f"label {k}={v}" for k, v in demand.labels.items()]
    return ", ".join(parts) or "nothing"


def _describe(node: dict[str, Any]) -> str:
    have = {k: v for k, v in node.get("resources", {}).items() if k in ("CPU", "GPU") or not _builtin(k)}
    resources = ", ".join(f"{k} {v:g}" for k, v in sorted(have.items()))
    labels = {k: v for k, v in node.get("labels", {}).items() if not k.startswith("ray.io/")}
    label_text = "".join(f", label {k}={v}" for k, v in sorted(labels.items()))
    return f"{node['ip']} [{resources}{label_text}]"


def _builtin(resource: str) -> bool:
    return resource in ("memory", "object_store_memory") or resource.startswith("node:")


class Placement:
    """Ray options for each process of a run; `close` releases the placement group of `pack`."""

    def __init__(self, recipe: Recipe, driver_node: str) -> None:
        self.recipe = recipe
        self.driver_node = driver_node
        self.group: Any = None
        if recipe.learners.placement == "pack":
            bundles, selectors = [], []
            for i in range(recipe.learners.count):
                s = recipe.learners.resolved(i)
                wants = {"CPU": s.num_cpus, "GPU": s.num_gpus, **s.resources}
                bundles.append({k: v for k, v in wants.items() if v} or {"CPU": 0.001})
                selectors.append(dict(s.label_selector))
            args: dict[str, Any] = {"bundle_label_selector": selectors} if any(selectors) else {}
            self.group = placement_group(bundles, strategy="PACK", **args)
            ready, _ = ray.wait([self.group.ready()], timeout=PACK_READY_TIMEOUT_S)
            if not ready:
                self.close()
                raise UserError(
                    f"learners.placement=pack: the cluster could not reserve the learners' {len(bundles)} slots "
                    f"within {PACK_READY_TIMEOUT_S:g} s (busy with other jobs?): use learners.placement=spread, or "
                    "free resources"
                )

    def syncer(self) -> dict[str, Any]:
        strategy = NodeAffinitySchedulingStrategy(node_id=self.driver_node, soft=False)
        return {"num_cpus": self.recipe.syncer.num_cpus, "scheduling_strategy": strategy}

    def evaluator(self) -> dict[str, Any]:
        return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(self.driver_node, soft=False)}

    def learner(self, index: int | None) -> dict[str, Any]:
        """Options besides num_cpus and num_gpus for learner `index` (None: a hot spare)."""
        s = self.recipe.learners.resolved(-1 if index is None else index)
        if self.group is not None and index is not None and 0 <= index < self.recipe.learners.count:  # in the group
            return {"scheduling_strategy": PlacementGroupSchedulingStrategy(self.group, index)}
        out: dict[str, Any] = {"scheduling_strategy": "SPREAD" if self.group is None else "DEFAULT"}
        if s.resources:
            out["resources"] = dict(s.resources)
        if s.label_selector:
            out["label_selector"] = dict(s.label_selector)
        return out

    def feasible(self, index: int) -> str | None:
        """None if some live node could hold learner `index` now; else why not (its node is gone, or
        draining: Ray places nothing new on a node it is taking away)."""
        from dlc.engine.cluster import draining_nodes, nodes

        demand = next((d for d in learner_demands(self.recipe) if d.who == f"learner {index}"), None)
        # Against each node's total: a node that could hold it once others finish is good enough (Ray
        # places it when resources free up); one that never could is not.
        draining = draining_nodes()
        staying = [n for n in nodes() if n["node_id"] not in draining]
        if demand is None or any(_fits(demand, n) for n in staying):
            return None
        return (
            f"no live node that is not draining has what learner {index} asks for ({_wants(demand)}); "
            "it is not restarted"
        )

    def close(self) -> None:
        if self.group is not None:
            remove_placement_group(self.group)
            self.group = None
