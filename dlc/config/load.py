"""Loading a recipe: YAML, dotted key=value overrides, and validation errors a user can act on."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from dlc.config.schema import Recipe
from dlc.config.section import tagged_members
from dlc.errors import UserError


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`["a.b=1", "c=x"]` -> nested dict, values parsed as YAML scalars (`1` -> int, `[1,2]` -> list)."""
    tree: dict[str, Any] = {}
    given: dict[str, str] = {}  # key -> the override that set it
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise UserError(f"override {item!r} is not key=value: write it as e.g. learners.count=2")
        if not _is_utf8(item):
            raw_bytes = item.encode("utf-8", "surrogateescape")
            raise UserError(
                f"override {raw_bytes!r} is not valid UTF-8: recipes, paths and names are read as UTF-8; "
                "rename the file (or point at it with a glob such as data.paths=[data/*.txt])"
            )
        _refuse_a_second_setting(key, item, given)
        value = _parse_scalar(raw)
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def replaced_overrides(base: list[str], *extra: str) -> list[str]:
    """`base` less the overrides `extra` sets again (the same key, or a part or a whole of it), then
    `extra`: how a program that layers settings says the later ones win, where a user's command line
    giving one key twice is refused."""
    keys = [item.partition("=")[0] for item in extra]
    return [item for item in base if not any(_overlap(item.partition("=")[0], k) for k in keys)] + list(extra)


def _overlap(a: str, b: str) -> bool:
    """Whether dotted keys `a` and `b` set the same setting: the same key, or one a part of the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _refuse_a_second_setting(key: str, item: str, given: dict[str, str]) -> None:
    """The same key twice (or a key and a part of it) would let the last one win without a word."""
    for earlier_key, earlier in given.items():
        if _overlap(earlier_key, key):
            what = "twice" if earlier_key == key else "both whole and in part"
            raise UserError(f"{key} is set {what} on the command line ({earlier!r}, then {item!r}): keep one of them")
    given[key] = item


def _is_utf8(text: str) -> bool:
    """Command-line bytes that are not UTF-8 reach Python as lone surrogates (PEP 383)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_scalar(raw: str) -> Any:
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw  # blank is blank, not YAML's null
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        try:  # YAML 1.1 reads 1e-3 as a string; a user means the number
            return float(value)
        except ValueError:
            pass
    return value


def merge_tree(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_tree(out[key], value)
        else:
            out[key] = value
    return out


def recipe_from_dict(data: dict[str, Any], origin: str = "recipe") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise UserError(describe_validation_error(exc, origin)) from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a YAML recipe, apply dotted key=value overrides, validate the whole tree once."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"recipe {str(path)!r} is a directory: give a recipe file inside it, e.g. recipes/tiny.yaml")
    if not path.is_file():
        hint = ", ".join(sorted(p.name for p in Path("recipes").glob("*.yaml"))) if Path("recipes").is_dir() else ""
        raise UserError(f"recipe file {str(path)!r} not found" + (f": recipes here are {hint}" if hint else ""))
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"recipe {str(path)!r} is not valid YAML: {exc}") from None
    except OSError as exc:
        raise UserError(f"recipe {str(path)!r} cannot be read ({exc.strerror}): check its permissions") from None
    if data is None:  # empty, or only comments: a slip (a wrong file, an unsaved editor), never "all defaults"
        raise UserError(
            f"recipe {str(path)!r} is empty (or holds only comments): write its sections (run:, model:, ...), "
            "e.g. copy recipes/tiny.yaml"
        )
    if not isinstance(data, dict):
        raise UserError(
            f"recipe {str(path)!r} holds a bare {type(data).__name__} ({str(data)[:40]!r}), not a mapping of "
            "sections (run:, model:, ...): e.g. copy recipes/tiny.yaml"
        )
    data = merge_tree(data, parse_overrides(overrides or []))
    return recipe_from_dict(data, origin=str(path))


def _locate(loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[str]]:
    """An error's location as a user writes the key, without the kind pydantic puts after a union
    chosen by kind (syncer.outer.nesterov.lr -> syncer.outer.lr), and the declared field names at
    the place it points to (for did-you-mean; none where the schema does not say)."""
    model: Any = Recipe
    shown: list[Any] = []
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        shown.append(part)
        if not parts or model is None or isinstance(part, int):  # the key itself, or a list's index
            continue
        field = model.model_fields.get(part)
        if field is None:
            model = None
            continue
        members = tagged_members(field.annotation)
        if members:
            model = members.get(parts[0]) if parts else None
            if model is not None:
                parts.pop(0)  # the union's kind in the location, not a key
            continue
        candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return tuple(shown), list(model.model_fields) if model is not None else []


def describe_validation_error(exc: ValidationError, origin: str) -> str:
    lines = []
    for err in exc.errors():
        loc, names = _locate(tuple(err["loc"]))
        where = ".".join(str(p) for p in loc) or "recipe"
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]), names, n=1)
            hint = (
                f"did you mean {'.'.join(str(p) for p in loc[:-1] + (close[0],))}?"
                if close
                else (f"valid keys here: {', '.join(names)}" if names else "remove it")
            )
            lines.append(f"unknown key {where}: {hint}")
        elif err["type"] == "value_error":
            lines.append(str(err["msg"]).removeprefix("Value error, "))
        else:
            value = err.get("input")
            shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as YAML writes it
            lines.append(f"{where}={shown}: {err['msg']}")
    return f"invalid recipe {origin}:\n  " + "\n  ".join(lines)


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
