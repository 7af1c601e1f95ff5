"""How the planning commands read their options: counts as people write them, and settings models.

A settings model (`dlc.plan.inputs`) owns each setting's name, type, default and description.
`takes_settings` gives a command one option per field, so the command restates none of them, and
spells the fields a `SettingError` names as those options: `horizon_days` reaches the user as
`--horizon-days`.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable, Collection, Mapping
from enum import Enum
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from dlc.errors import UserError
from dlc.plan.inputs import SettingError

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_COUNT = re.compile(r"^\s*([-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:e[-+]?\d+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)

Command = Callable[..., None]


def parse_count(text: str, option: str) -> float:
    """Parse '150k', '1.2M', '5B', '2_400_000' or '1e6'; UserError naming ``option`` otherwise."""
    match = _COUNT.match(text)
    if match is None:
        raise UserError(f"{option}={text!r} is not a count: write e.g. 150k, 1.2M, 5B or 2400000")
    value = float(match.group(1).replace("_", "")) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value):
        raise UserError(f"{option}={text!r} is too large to be a count: write e.g. 150k, 1.2M or 5B")
    if not value > 0:
        raise UserError(f"{option}={text!r} must be positive: write e.g. 150k or 1.2M")
    return value


def format_count(value: float) -> str:
    """1_200_000 -> '1.2M', 150_000 -> '150k'."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:g}"


def with_options(
    command: Command, after: str, generated: list[inspect.Parameter], call: Callable[[dict[str, Any]], None]
) -> Command:
    """`command` as Typer reads it: its own parameters but its `**keywords`, with `generated` listed after its
    parameter `after`; `call` is given every value by parameter name, and runs the command."""
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    at = [p.name for p in own].index(after) + 1

    @functools.wraps(command)
    def run(**kwargs: Any) -> None:
        call(kwargs)

    # Typer reads the options from the signature: the command's own, with the generated ones spliced in.
    # (typeshed declares no __signature__ on functions, which inspect.signature reads.)
    run.__signature__ = inspect.Signature([*own[:at], *generated, *own[at:]])  # type: ignore[attr-defined]
    return run


def takes_settings(
    model: type[BaseModel],
    *,
    after: str,
    skip: Collection[str] = (),
    renamed: Mapping[str, str] | None = None,
    short: Mapping[str, str] | None = None,
    shown_defaults: Mapping[str, str] | None = None,
) -> Callable[[Command], Command]:
    """Give a command one option per field of `model` but `skip`, listed after its parameter `after`.

    The command receives them as keyword arguments named by field (declare `**settings`). A field
    may be `renamed` (its option is then --NEW-NAME), have a `short` flag, or show a default of its
    own in the help. Every setting a SettingError names is spelled as an option (--snake-case, or
    the renamed option), the command's own options included.
    """
    renamed, short, shown_defaults = renamed or {}, short or {}, shown_defaults or {}
    params = {field: renamed.get(field, field) for field in model.model_fields if field not in skip}

    def spell(name: str) -> str:
        return "--" + renamed.get(name, name).replace("_", "-")

    def decorate(command: Command) -> Command:
        generated = [
            _option(model, field, name, short.get(field), shown_defaults.get(field)) for field, name in params.items()
        ]

        def call(kwargs: dict[str, Any]) -> None:
            settings = {field: kwargs.pop(name) for field, name in params.items()}
            try:
                command(**kwargs, **settings)
            except SettingError as exc:
                raise UserError(exc.spelled(spell)) from None

        return with_options(command, after, generated, call)

    return decorate


def _option(model: type[BaseModel], field: str, name: str, short: str | None, shown: str | None) -> inspect.Parameter:
    info = model.model_fields[field]
    if info.is_required():  # an option needs a default to show and to fall back on
        raise TypeError(f"{model.__name__}.{field} has no default: a setting given as an option needs one")
    annotation, default = info.annotation, info.default
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        # A plain string on the command line: the model refuses an unknown one with its own message.
        annotation, default = str, default.value
    decls = ("--" + name.replace("_", "-"), short) if short else ()
    extra: dict[str, Any] = {} if shown is None else {"show_default": shown}
    option = typer.Option(*decls, help=info.description, **extra)
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, option]
    )
