"""The recipe's stop condition, and how far along it a run is."""

from __future__ import annotations

from dlc.config.schema import Recipe


class Budget:
    """The recipe's stop condition and how far along it the run is (0..1)."""

    def __init__(self, recipe: Recipe) -> None:
        self.max_steps = recipe.run.max_steps
        self.max_tokens = recipe.run.max_tokens
        self.max_wall_s = recipe.run.max_wall_s

    def progress(self, step: float, tokens: int, wall_s: float) -> float:
        limits = ((step, self.max_steps), (tokens, self.max_tokens), (wall_s, self.max_wall_s))
        return min(1.0, max(value / limit for value, limit in limits if limit))

    def driver_limit_reached(self, tokens: int, wall_s: float) -> bool:
        return bool((self.max_tokens and tokens >= self.max_tokens) or (self.max_wall_s and wall_s >= self.max_wall_s))

    def eta_s(self, step: float, tokens: int, wall_s: float, tokens_per_s: float, steps_per_s: float) -> float | None:
        etas = []
        if self.max_tokens and tokens_per_s > 0:
            etas.append((self.max_tokens - tokens) / tokens_per_s)
        if self.max_steps and steps_per_s > 0:
            etas.append((self.max_steps - step) / steps_per_s)
        if self.max_wall_s:
            etas.append(self.max_wall_s - wall_s)
        return max(0.0, min(etas)) if etas else None
