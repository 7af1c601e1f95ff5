"""The outer step's settings: one section per kind, chosen by `syncer.outer.kind`.

Each kind of outer step (`dlc.algo.outer`) declares its settings here, beside the others; the
recipe picks one by name (`syncer.outer: {kind: nesterov, lr: 0.7, momentum: 0.9}`) and its fields
stand beside the kind. Adding a kind is a section here and a class with its registration there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from dlc.config.section import Section

OUTER_KINDS: tuple[str, ...] = ("nesterov", "delayed_nesterov")


class NesterovOuter(Section):
    """Nesterov SGD on the global fragment, the merged outer gradient as its gradient (DiLoCo's step)."""

    kind: Literal["nesterov"] = Field("nesterov", description="Outer step: nesterov.")
    lr: float = Field(1.0, gt=0, description="Outer learning rate (1.0 with momentum 0: the merged average).")
    momentum: float = Field(
        0.0, ge=0, lt=1, description="Nesterov momentum, one buffer per fragment (DiLoCo: 0.9 with lr 0.7 at H=500)."
    )


class DelayedNesterovOuter(Section):
    """Delayed Nesterov (Asynchronous Local-SGD, arXiv 2401.09135, Algorithm 3): plain outer SGD every
    round, the momentum updated only every `delay_rounds` rounds with the mean of the gradients since."""

    kind: Literal["delayed_nesterov"] = Field("delayed_nesterov", description="Outer step: delayed_nesterov.")
    lr: float = Field(1.0, gt=0, description="Outer learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum, updated every delay_rounds rounds.")
    delay_rounds: int = Field(
        4, ge=1, description="N: rounds of a fragment between two momentum updates (1: plain Nesterov)."
    )


def _kind_of(value: Any) -> str | None:
    """The kind a `syncer.outer` value asks for: a section without one is a Nesterov step
    (`syncer.outer.lr=0.5` on its own)."""
    return value.get("kind", "nesterov") if isinstance(value, dict) else getattr(value, "kind", None)


OuterConfig = Annotated[
    Annotated[NesterovOuter, Tag("nesterov")] | Annotated[DelayedNesterovOuter, Tag("delayed_nesterov")],
    Discriminator(
        _kind_of,
        custom_error_type="outer_kind",
        custom_error_message=f"unknown outer step: choose kind from {', '.join(OUTER_KINDS)}",
    ),
]


def legacy_outer(syncer: Any) -> Any:
    """Read a recipe written before `syncer.outer` (`outer_lr`, `outer_momentum`) as a Nesterov step."""
    if not isinstance(syncer, dict) or not {"outer_lr", "outer_momentum"} & set(syncer):
        return syncer
    syncer = dict(syncer)
    legacy = {"lr": syncer.pop("outer_lr", None), "momentum": syncer.pop("outer_momentum", None)}
    legacy = {key: value for key, value in legacy.items() if value is not None}
    outer = syncer.get("outer")
    if outer is not None:
        given = sorted(key for key in legacy if isinstance(outer, dict) and key in outer)
        if given or not isinstance(outer, dict):
            raise ValueError(
                f"syncer.outer_{given[0] if given else 'lr'} and syncer.outer both set the outer step: write only "
                f"syncer.outer (e.g. syncer.outer.{given[0] if given else 'lr'}=...)"
            )
        if outer.get("kind", "nesterov") != "nesterov" and outer.get("kind") in OUTER_KINDS:
            raise ValueError(
                f"syncer.outer_lr / syncer.outer_momentum are Nesterov's; syncer.outer.kind={outer['kind']}: "
                "write them as syncer.outer.lr and syncer.outer.momentum"
            )
    syncer["outer"] = {"kind": "nesterov", **legacy, **(outer or {})}
    return syncer
