"""The one JSON form of kvstab's result records (``report.json``, every ``--json``).

A result record is a frozen dataclass that inherits :class:`JsonRecord`: its
JSON form is an object of its fields in declaration order, each converted by
:func:`to_json` (a record inside a record, a tuple as a list, a mapping's
values).  A field's ``metadata`` may say ``json=False`` (kept out of the JSON,
e.g. a typed verdict a record spells out itself) or ``json="optional"`` (left
out while it is ``None``, for a shape that has it only sometimes).  A record
whose JSON is not its fields one for one overrides :meth:`JsonRecord.to_json`,
so each record has exactly one JSON form, written where the record is.

JSON has no NaN or infinity (a parser that follows the standard refuses the
``NaN`` Python prints), so every JSON kvstab writes goes through
:func:`dumps`: a number that is not finite becomes ``null``, and the object
holding it gains an ``undefined`` object saying why, key by key.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["JsonRecord", "to_json", "record_json", "finite_json", "dumps", "UNDEFINED_KEY"]


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


#: the key an object gains when some of its values were not finite numbers: ``{key: why}``
UNDEFINED_KEY = "undefined"


def _why(x: float) -> str:
    if math.isnan(x):
        return "not a number (NaN): undefined for this run (nothing to divide by, or no sample)"
    return f"{'+' if x > 0 else '-'}infinite: unbounded for this run"


def finite_json(value: object) -> Any:
    """``value`` (plain JSON data, or records) with every non-finite float replaced by ``None``;
    a mapping holding one gains :data:`UNDEFINED_KEY` mapping the key to why (for a list, the
    positions too).  A non-finite float outside any mapping is just ``None``."""
    value = to_json(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [finite_json(v) for v in value]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    why: dict[str, str] = dict(value.get(UNDEFINED_KEY) or {}) if isinstance(value.get(UNDEFINED_KEY), Mapping) else {}
    for k, v in value.items():
        if k == UNDEFINED_KEY and isinstance(v, Mapping):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            why[str(k)] = _why(v)
        elif isinstance(v, list | tuple):
            bad = [i for i, x in enumerate(v) if isinstance(x, float) and not math.isfinite(x)]
            if bad:
                why[str(k)] = f"entries {bad} {_why(float(v[bad[0]]))}"
        out[k] = finite_json(v)
    if why:
        out[UNDEFINED_KEY] = why
    return out


def dumps(value: object, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite_json` ``(value)``, strict (no ``NaN``/``Infinity`` can get out)."""
    return json.dumps(finite_json(value), allow_nan=False, **kwargs)
