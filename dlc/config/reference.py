"""The recipe reference tables of the manual (docs/reference/recipe.md), generated from the declared fields.

`python -m dlc.cli.reference` writes them into the page; tests/test_docs.py fails when the page drifts.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from dlc.config.schema import Recipe
from dlc.config.section import tagged_members


def reference_markdown() -> str:
    """Every recipe field with its default and meaning: a table for the top level, then one per section."""
    from pydantic_core import PydanticUndefined

    lines: list[str] = ["**top level**", "", "| key | default | meaning |", "|---|---|---|"]
    for name, field in Recipe.model_fields.items():
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            lines.append(f"| `{name}` | `{json.dumps(field.default)}` | {field.description} |")
    lines.append("")
    for section, field in Recipe.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        lines += [f"**`{section}`**: {field.description}", "", "| key | default | meaning |", "|---|---|---|"]
        for name, sub in model.model_fields.items():
            if sub.default_factory is not None:
                default: Any = sub.default_factory()  # type: ignore[call-arg]
            else:
                default = "required" if sub.default is PydanticUndefined else sub.default
            if isinstance(default, BaseModel):  # a nested section: its defaults
                default = default.model_dump(mode="json")
            shown = default if default == "required" else json.dumps(default)
            lines.append(f"| `{section}.{name}` | `{shown}` | {sub.description} |")
            # A union chosen by kind: each kind's own fields.
            for kind, member in tagged_members(sub.annotation).items():
                for key, leaf in member.model_fields.items():
                    if key != "kind":
                        lines.append(
                            f"| `{section}.{name}.{key}` (kind `{kind}`) | `{json.dumps(leaf.default)}` | "
                            f"{leaf.description} |"
                        )
            item = next(iter(getattr(sub.annotation, "__args__", ())), None)
            if isinstance(item, type) and issubclass(item, BaseModel):  # a list of per-item settings
                for key, leaf in item.model_fields.items():
                    leaf_default = "required" if leaf.default is PydanticUndefined else json.dumps(leaf.default)
                    lines.append(f"| `{section}.{name}[].{key}` | `{leaf_default}` | {leaf.description} |")
        lines.append("")
    return "\n".join(lines)
