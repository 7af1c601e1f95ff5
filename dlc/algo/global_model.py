"""The global model a syncer holds: one float32 vector per fragment of its plan."""

from __future__ import annotations

import numpy as np

from dlc.core.fragments import FragmentPlan


class GlobalFragments:
    """What every syncer answers about its global model; subclasses set `plan` and `theta`."""

    plan: FragmentPlan
    theta: list[np.ndarray]  # fragment p's global values, in the plan's order

    def global_fragments(self) -> list[np.ndarray]:
        return [t.copy() for t in self.theta]

    def fingerprint(self) -> str:
        return self.plan.fingerprint()

    def global_params(self, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The global model as a flat dict (shapes from `like`)."""
        return self.plan.assemble(self.theta, like)
