"""The outer step: what the syncer does with a merged outer gradient, one optimizer per fragment.

An outer gradient points from the learners' parameters back to the global ones, so a positive
learning rate moves the global fragment toward the learners. Every kind keeps its own state per
fragment and hands it out as `state()` (a dict of arrays) and takes it back with `load()`: the
syncers, their journals and their checkpoints store it without knowing its keys. The recipe picks
a kind by name (`syncer.outer.kind`, settings in `dlc.config.outer`); `make_outer` builds it.

Adding a kind: a settings section in `dlc.config.outer`, a class here with `step`, `state` and
`load`, and its line in `OUTER_STEPS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from dlc.config.outer import DelayedNesterovOuter, NesterovOuter


class OuterStep(Protocol):
    """The outer optimizer of one fragment."""

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """The fragment's next global value; neither input is modified."""
        ...

    def state(self) -> dict[str, np.ndarray]: ...

    def load(self, state: dict[str, np.ndarray]) -> None: ...


def _checked(theta: np.ndarray, grad: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    theta = np.asarray(theta, dtype=np.float32)
    grad = np.asarray(grad, dtype=np.float32)
    if grad.shape != theta.shape:
        raise ValueError(f"gradient shape {grad.shape} != theta shape {theta.shape}")
    if theta.size != size:
        raise ValueError(f"this outer step holds {size} values; theta has {theta.size}")
    return theta, grad


def _loaded(state: dict[str, Any], key: str, size: int) -> np.ndarray:
    value = np.asarray(state[key], dtype=np.float32).reshape(-1)
    if value.size != size:
        raise ValueError(f"outer state {key!r} holds {value.size} values; the fragment has {size}")
    return value


class Nesterov:
    """Nesterov SGD: ``buf = mu * buf + g; theta = theta - lr * (g + mu * buf)``, the update of
    ``torch.optim.SGD(nesterov=True)`` without dampening or weight decay (DiLoCo's outer step).
    With momentum 0 and lr 1 the new value is the merged learners' (theta - g)."""

    def __init__(self, cfg: NesterovOuter, size: int) -> None:
        self.lr = np.float32(cfg.lr)
        self.mu = np.float32(cfg.momentum)
        self.size = size
        self.buf = np.zeros(size, dtype=np.float32)

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        theta, grad = _checked(theta, grad, self.size)
        self.buf = self.mu * self.buf + grad
        return (theta - self.lr * (grad + self.mu * self.buf)).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {"momentum": self.buf}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.buf = _loaded(state, "momentum", self.size)


class DelayedNesterov:
    """Delayed Nesterov (arXiv 2401.09135, Algorithm 3; the update between momentum rounds is our
    reading): every round a plain SGD step on the fresh gradient, ``theta -= lr * g``; every
    `delay_rounds`-th round the momentum takes the mean of the gradients since its last update,
    ``buf = mu * buf + mean(g)``, and the step is Nesterov's, ``theta -= lr * (g + mu * buf)``.
    With delay_rounds=1 it is `Nesterov`. Momentum built from stale and fresh pushes alike moves
    N times more slowly, which is what keeps asynchronous merges from overshooting."""

    def __init__(self, cfg: DelayedNesterovOuter, size: int) -> None:
        self.lr = np.float32(cfg.lr)
        self.mu = np.float32(cfg.momentum)
        self.every = cfg.delay_rounds
        self.size = size
        self.buf = np.zeros(size, dtype=np.float32)
        self.pending = np.zeros(size, dtype=np.float32)  # the sum of the gradients since the last update
        self.rounds = 0  # since the last momentum update

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        theta, grad = _checked(theta, grad, self.size)
        self.pending = self.pending + grad
        self.rounds += 1
        if self.rounds < self.every:
            return (theta - self.lr * grad).astype(np.float32)
        self.buf = self.mu * self.buf + self.pending / np.float32(self.rounds)
        self.pending = np.zeros_like(self.pending)
        self.rounds = 0
        return (theta - self.lr * (grad + self.mu * self.buf)).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {"momentum": self.buf, "pending": self.pending, "rounds": np.array([self.rounds], dtype=np.int64)}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.buf = _loaded(state, "momentum", self.size)
        self.pending = _loaded(state, "pending", self.size)
        self.rounds = int(np.asarray(state["rounds"]).reshape(-1)[0])


# Each kind of `syncer.outer.kind`: (its settings section, a fragment's size) -> its outer step.
OUTER_STEPS: dict[str, Callable[[Any, int], OuterStep]] = {
    "nesterov": Nesterov,
    "delayed_nesterov": DelayedNesterov,
}


class _Kind(Protocol):
    """A settings section of `dlc.config.outer`: its kind names its step."""

    @property
    def kind(self) -> str: ...


def make_outer(cfg: _Kind, size: int) -> OuterStep:
    """The outer step the recipe names, for a fragment of `size` values, with fresh state."""
    return OUTER_STEPS[cfg.kind](cfg, size)
