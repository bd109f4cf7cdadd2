"""kvstab.jsonform: a result record's one JSON form (fields in order, nested records, tuples as lists,
fields kept out or left out while None, and a record's own override)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstab.jsonform import JsonRecord, record_json, to_json


@dataclass(frozen=True, slots=True)
class _Inner(JsonRecord):
    a: int
    b: tuple[int, ...] = (1, 2)


@dataclass(frozen=True, slots=True)
class _Outer(JsonRecord):
    name: str
    inner: _Inner
    by_name: dict[str, _Inner] = field(default_factory=dict)
    hidden: object = field(default=None, metadata={"json": False})
    maybe: int | None = field(default=None, metadata={"json": "optional"})
    always: int | None = None


@dataclass(frozen=True, slots=True)
class _Own(JsonRecord):
    x: int

    def to_json(self) -> dict[str, Any]:
        return {"first": True, **record_json(self)}


def test_a_record_is_its_fields_in_order_with_records_tuples_and_mappings_converted() -> None:
    rec = _Outer("n", _Inner(3), {"k": _Inner(4, ())}, hidden=object())
    out = rec.to_json()
    assert list(out) == ["name", "inner", "by_name", "always"]  # hidden kept out, maybe left out while None
    assert out == {"name": "n", "inner": {"a": 3, "b": [1, 2]}, "by_name": {"k": {"a": 4, "b": []}}, "always": None}
    assert _Outer("n", _Inner(3), maybe=0).to_json()["maybe"] == 0  # optional: only None is left out


def test_a_record_that_overrides_its_form_is_converted_by_it_everywhere() -> None:
    assert to_json([_Own(1), (_Own(2),)]) == [{"first": True, "x": 1}, [{"first": True, "x": 2}]]
    assert to_json({"a": None, "b": 1.5}) == {"a": None, "b": 1.5}
