"""Stand-ins for the engine's Ray plumbing in tests that run its workers in one process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Direct:
    """A fake Ray actor method: `.remote(x)` calls the function now and returns its result (no ref)."""

    fn: Callable[..., Any]

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)
