"""The one JSON form of kvstab's result records (``report.json``, every ``--json``).

A result record is a frozen dataclass that inherits :class:`JsonRecord`: its
JSON form is an object of its fields in declaration order, each converted by
:func:`to_json` (a record inside a record, a tuple as a list, a mapping's
values).  A field's ``metadata`` may say ``json=False`` (kept out of the JSON,
e.g. a typed verdict a record spells out itself) or ``json="optional"`` (left
out while it is ``None``, for a shape that has it only sometimes).  A record
whose JSON is not its fields one for one overrides :meth:`JsonRecord.to_json`,
so each record has exactly one JSON form, written where the record is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["JsonRecord", "to_json", "record_json"]


def to_json(value: object) -> Any:
    """``value`` as plain JSON data: a record (anything with ``to_json``) by its own
    form, a tuple or list as a list, a mapping with its values converted, and any
    other value (numbers, strings, ``None``) as it is."""
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    return value


def record_json(record: object) -> dict[str, Any]:
    """The fields of dataclass ``record`` as a JSON object, in declaration order
    (``json=False`` fields left out, ``json="optional"`` ones while ``None``)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        how = f.metadata.get("json", True)
        value = getattr(record, f.name)
        if how is False or (how == "optional" and value is None):
            continue
        out[f.name] = to_json(value)
    return out


class JsonRecord:
    """Base of a result record (a frozen dataclass): :meth:`to_json` is its one JSON form."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON data (its fields in order; see the module docstring)."""
        return record_json(self)
