"""The evaluator actor: evaluates snapshots of the global model off the critical path."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from dlc.config.schema import Recipe
from dlc.engine.devices import evaluator_setup
from dlc.errors import UserError


class EvaluatorWorker:
    """Lives in the evaluator actor: evaluates global parameter snapshots off the critical path."""

    def __init__(self, recipe_json: dict[str, Any], held_out: Any) -> None:
        """`held_out`: the held-out bytes, or where the prepared dataset's held-out split is."""
        self.recipe = Recipe.model_validate(recipe_json)
        from dlc.core.backend import BackendError, start_backend
        from dlc.core.compile_cache import enable_run_cache

        self.backend_error: str | None = None
        self._released = False
        try:
            self.device = start_backend(
                evaluator_setup(self.recipe, {}).platform,
                "eval.num_gpus",
                self.recipe.learners.xla_threads(None),
                self.recipe.learners.keep_freed_memory,
            )
        except BackendError as exc:  # reported by device_info, in one line
            self.backend_error = f"the evaluator (eval.num_gpus={self.recipe.eval.num_gpus:g}): {exc}"
            return

        enable_run_cache(self.recipe.run)  # before JAX compiles anything in this process
        from dlc.core.abstract import abstract_params
        from dlc.core.evaluate import Evaluator
        from dlc.core.model import unflatten_params

        # The model's structure, traced on shapes: it evaluates the parameters it is sent, never its own.
        graphdef, self.like = abstract_params(self.recipe.model)
        self._unflatten = unflatten_params
        self.evaluator = Evaluator(self.recipe, graphdef, held_out)

    def device_info(self) -> dict[str, str]:
        """The device it evaluates on; raises the backend's error (a UserError) if JAX failed to start."""
        if self.backend_error:
            raise UserError(self.backend_error)
        return dict(self.device)

    def evaluate(self, flat: dict[str, np.ndarray]) -> tuple[float, float]:
        result = self.evaluator(self._unflatten(flat, self.like))
        if not self._released:
            from dlc.core.allocator import release_freed_memory

            self._released = release_freed_memory()  # what compiling the first evaluation left free
        return result


# Ray's stubs type `remote` with task options only: its actor options (max_concurrency) are missing.
EvaluatorActor = ray.remote(max_concurrency=1)(EvaluatorWorker)  # type: ignore[call-overload]
