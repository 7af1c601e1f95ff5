"""What every section of the recipe shares: strict keys, finite numbers, no true/false for a number."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    # No inf or nan anywhere: every number here is a size, a rate or a time that must be finite.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 in an int or float field; in a recipe it is always a slip.
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            if bool not in (annotation, *getattr(annotation, "__args__", ())):
                raise PydanticCustomError("bool_for_number", "true/false is not a number: write a number here")
        return value


def tagged_members(annotation: Any) -> dict[str, type[BaseModel]]:
    """The members of a union chosen by kind (`Annotated[Model, Tag(kind)] | ...`, as `syncer.outer`),
    by kind; empty for any other annotation."""
    members = {}
    for candidate in getattr(annotation, "__args__", ()):
        tags = [m.tag for m in getattr(candidate, "__metadata__", ()) if hasattr(m, "tag")]
        if tags:
            members[tags[0]] = candidate.__origin__
    return members
