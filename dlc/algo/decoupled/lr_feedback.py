"""`syncer.lr_feedback=spread`: the learners' learning rate a tensor, raised by how far their deltas cancel.

A learner's AdamW step divides by the root of its own gradients' second moment. On a small batch
that moment is mostly the batch's noise, so a learner's step carries less of the true gradient
than data-parallel's step on the M learners' batches together, while the merge averages the
learners' noise away. How far the deltas cancel in their mean measures it: the mean of their norms
over the norm of their mean (`merge.spreads`) is 1 when they agree and approaches sqrt(M) when
they are mostly noise. RDA stretches the merged delta by as much, after the learners' steps; under
this feedback the syncer merges by the mean and the learners multiply that tensor's learning rate
by it, so that their own steps move about as far along the gradient as data-parallel's would. The
factor is the spread to `syncer.lr_feedback_power` (2.5): a delta sums H steps, whose signal adds up
while their noise partly cancels, so a delta's spread understates how noisy one step is. A round's
spread counts up to the bound of independent noise (`noise_bound`, sqrt(M)), so the factor stays
within M^(power/2): deltas spread further only where the learners undo one another, and a larger
step there would feed the swing.

The syncer keeps the factor of every piece of every fragment, smoothed over the fragment's rounds
(`SpreadBook`), in its checkpoints and journal, and sends a fragment's factors with each merged
value of it; a learner keeps the newest of every piece's and gives each tensor the mean of its
pieces', by size (`LeafFactors`). The thread that receives them puts them on the device; the step
loop only swaps them into the optimizer's state between two steps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlc.algo.merge import spreads
from dlc.core.fragment_ops import leaf_names
from dlc.core.fragments import FragmentPlan
from dlc.core.learner import Learner


def noise_bound(weights: np.ndarray) -> float:
    """The spread of deltas that are independent noise of one size, under these merge weights: sqrt(M)
    for M equal weights, the root of the weights' effective number in general. Deltas spread further
    only where they undo one another (a tensor the learners push back and forth), and a larger step
    there would feed the swing: a round's spread counts up to this bound."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    return float(w.sum() / np.sqrt(w @ w))  # sqrt of (sum w)^2 / sum w^2, whatever the weights' scale


class SpreadBook:
    """The syncer's side: each fragment's pieces' spreads, smoothed over rounds (1 when off, kept so
    that the syncer's checkpoints have one shape whatever the recipe)."""

    def __init__(self, plan: FragmentPlan, mode: str, decay: float, power: float) -> None:
        self.plan = plan
        self.on = mode != "none"
        self.decay = decay
        self.power = power
        self.values = [np.ones(len(plan.segments(p))) for p in range(plan.num_fragments)]

    def update(self, p: int, deltas: Sequence[np.ndarray], weights: np.ndarray, mean: np.ndarray | None = None) -> None:
        """Fold fragment p's round (its contributors' deltas and merge weights; their weighted mean, where
        merged already) into its factors."""
        if self.on:
            new = spreads(deltas, weights, self.plan.segments(p), mean)
            self.values[p] = self.decay * self.values[p] + (1.0 - self.decay) * np.minimum(new, noise_bound(weights))

    def factors(self, p: int) -> tuple[float, ...]:
        """What goes down with fragment p's value: one factor a piece (its smoothed spread to the power),
        () when off."""
        return tuple(float(v) ** self.power for v in self.values[p]) if self.on else ()

    def state(self, p: int) -> np.ndarray:
        return self.values[p].copy()

    def load(self, p: int, values: Sequence[float] | np.ndarray) -> None:
        """Fragment p's factors from a checkpoint or journal."""
        self.values[p] = np.asarray(values, dtype=np.float64).reshape(len(self.values[p]))


class LeafFactors:
    """The learner's side: the newest factors of every piece, and each tensor's, staged for the step
    loop by the thread that receives them (`to_device`: host factors to the optimizer's device
    array). With `on` False (no feedback) it takes none."""

    def __init__(
        self,
        plan: FragmentPlan,
        leaf_names: Sequence[str],
        to_device: Callable[[np.ndarray], Any] = np.asarray,
        on: bool = True,
    ) -> None:
        self.on = on
        self.names = list(leaf_names)
        self.to_device = to_device
        index = {name: i for i, name in enumerate(self.names)}
        spans = [plan.spans(p) for p in range(plan.num_fragments)]
        # Every piece of every fragment in one flat array: fragment p's are [starts[p], starts[p + 1]).
        self.starts = np.cumsum([0] + [len(fragment) for fragment in spans])
        self.leaf = np.array([index[s.name] for fragment in spans for s in fragment], dtype=np.int64)
        self.size = np.array([s.length for fragment in spans for s in fragment], dtype=np.float64)
        self.total = np.bincount(self.leaf, self.size, minlength=len(self.names))
        self.pieces = np.ones(len(self.leaf))
        self._lock = threading.Lock()
        self._staged: Any = None

    @classmethod
    def for_learner(cls, plan: FragmentPlan, learner: Learner, on: bool) -> LeafFactors:
        return cls(plan, leaf_names(learner.params), learner.leaf_scales_to_device, on)

    def offer(self, p: int, factors: Sequence[float]) -> None:
        """Fragment p's factors arrived with a merged value of it (any thread; () or off: ignored):
        every tensor's factor is worked out and staged for `take`."""
        if not self.on or not factors:
            return
        start, stop = self.starts[p], self.starts[p + 1]
        if len(factors) != stop - start:
            raise ValueError(f"{len(factors)} factors for fragment {p}'s {stop - start} pieces")
        with self._lock:
            self.pieces[start:stop] = factors
            self._staged = self.to_device(self.leaf_factors())

    def leaf_factors(self) -> np.ndarray:
        """Each tensor's factor, in leaf order: its pieces' mean by size (1 for a tensor in no fragment)."""
        weighted = np.bincount(self.leaf, self.size * self.pieces, minlength=len(self.names))
        return np.divide(weighted, self.total, out=np.ones(len(self.names)), where=self.total > 0)

    def take(self) -> Any:
        """The tensors' factors staged since the last call (as `to_device` made them), or None."""
        with self._lock:
            staged, self._staged = self._staged, None
        return staged
