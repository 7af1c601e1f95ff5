"""What every event is: a typed record of one kind, written to events.jsonl as one JSON object a line.

A kind is a frozen dataclass deriving from `Event`, declared with `@declared(group, kind)` in this
package's modules: its class docstring says what it means and its fields what it carries. Writers
build the record (`RunDir.event(LearnerDied(learner=2, step=10, ...))`) and readers get records back
(`parse`, `parse_all`), so a field's name is spelled once and a type checker sees every use.

A record's line holds `t` (Unix seconds, stamped when written unless the record has one), `kind`
and every field, None where the writer did not know it. Reading is forgiving the way a log must
be: a line of an unknown kind (a newer dlc's) or that does not fit its kind (a damaged line, an
older dlc's that lacked a field without a default) reads as nothing; fields a kind does not declare
are ignored. The test suite sets DLC_CHECK_EVENTS so that each record written is also checked
against its field types, before it reaches the file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, dataclass_transform

import pydantic

CHECK_VARIABLE = "DLC_CHECK_EVENTS"

E = TypeVar("E", bound="Event")


@dataclass(frozen=True, kw_only=True)
class Event:
    """An event of the run; its subclasses are the kinds, each `declared` in one group of the catalog."""

    kind: ClassVar[str] = ""
    group: ClassVar[str] = ""
    catalog_fields: ClassVar[str] = ""  # the catalog's fields column, where the field names do not say it
    t: float | None = None  # Unix seconds: stamped by the run directory when written, unless given

    def fields(self) -> dict[str, Any]:
        """The record's own fields (without `t` and `kind`), None where the writer did not know one."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "t"}

    def record(self) -> dict[str, Any]:
        """The JSON object events.jsonl holds for it (`t` only once it has one)."""
        head = {} if self.t is None else {"t": self.t}
        return {**head, "kind": self.kind, **self.fields()}

    @classmethod
    def from_record(cls: type[E], record: dict[str, Any]) -> E:
        """The record of this kind a JSON object holds (raises pydantic.ValidationError when it does not fit)."""
        return _adapter(cls).validate_python(record)


# The catalog's sections, in its order; each kind is declared in one.
RUN, STARTING, FAULTS, CHAOS = "The run", "Learners starting and stopping", "Faults and recovery", "Chaos"
PROTOCOL, BLOCKING = "The protocol", "Blocking baselines (`algorithm=dp` and `diloco`)"
GROUPS: dict[str, list[type[Event]]] = {group: [] for group in (RUN, STARTING, FAULTS, CHAOS, PROTOCOL, BLOCKING)}
KINDS: dict[str, type[Event]] = {}  # kind -> its record


@dataclass_transform(kw_only_default=True, frozen_default=True)
def declared(group: str, kind: str) -> Callable[[type[E]], type[E]]:
    """Make `cls` the record of `kind`, listed under `group` in the catalog: a frozen, keyword-only dataclass."""

    def declare(cls: type[E]) -> type[E]:
        if kind in KINDS:
            raise ValueError(f"event kind {kind!r} is declared twice ({KINDS[kind].__name__}, {cls.__name__})")
        if not cls.__doc__:  # a class without one has None (a docstring is not inherited)
            raise ValueError(f"event kind {kind!r} ({cls.__name__}) says what it means in its docstring")
        cls.kind, cls.group = kind, group
        record = dataclass(frozen=True, kw_only=True)(cls)
        KINDS[kind] = record
        GROUPS[group].append(record)
        return record

    return declare


_ADAPTERS: dict[type[Event], pydantic.TypeAdapter[Any]] = {}


def _adapter(cls: type[Event]) -> pydantic.TypeAdapter[Any]:
    """The validator of a kind's records, built the first time a record of it is read (a few ms each).

    Keys the kind does not declare (`kind`, a field a newer dlc added) are ignored; numbers and
    strings are checked as JSON gives them (an int where a float is declared is a float)."""
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[cls]


def parse(record: dict[str, Any]) -> Event | None:
    """The typed record of one events.jsonl line, or None for a kind this dlc does not know or a line
    that does not fit its kind."""
    kind = record.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    try:
        return cls.from_record(record)
    except pydantic.ValidationError:
        return None


def parse_all(records: Iterable[dict[str, Any]]) -> list[Event]:
    """Every line that reads as a record, in order; the rest left out (see `parse`)."""
    return [event for record in records if (event := parse(record)) is not None]


def checking() -> bool:
    """Whether each record written is checked against its field types (DLC_CHECK_EVENTS set, as in the tests)."""
    return bool(os.environ.get(CHECK_VARIABLE))


def wrong(event: Event) -> str | None:
    """What in a record does not fit its declared field types, or None."""
    if type(event) is not KINDS.get(event.kind):
        return f"{type(event).__name__} is not a declared event kind"
    try:
        type(event).from_record(event.record())
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return f"event {event.kind}: {problems}"
    return None


# How the catalog names each field type, as JSON has it (a field that may be unknown adds "or null").
_JSON_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "list[int]": "integers",
    "list[float]": "numbers",
    "list[tuple[int, int]]": "[integer, integer] pairs",
    "list[dict[str, Any]]": "objects",
    "dict[str, int]": "object of integers",
    "dict[str, Any]": "object",
}


def _field_text(field: dataclasses.Field[Any]) -> str:
    annotation = str(field.type)
    core = annotation.removesuffix(" | None")
    if core not in _JSON_TYPES:
        raise ValueError(f"the catalog has no name for the field type {core!r}: add one to _JSON_TYPES")
    return f"`{field.name}` {_JSON_TYPES[core]}" + (" or null" if core != annotation else "")


def catalog_markdown() -> str:
    """The events catalog of the manual: a table per group, from the declarations."""
    lines: list[str] = []
    for title, kinds in GROUPS.items():
        lines += [f"## {title}", "", "| kind | fields | what it means |", "|---|---|---|"]
        for cls in kinds:
            fields = cls.catalog_fields or ", ".join(_field_text(f) for f in dataclasses.fields(cls) if f.name != "t")
            lines.append(f"| `{cls.kind}` | {fields or '-'} | {' '.join((cls.__doc__ or '').split())} |")
        lines.append("")
    return "\n".join(lines)
