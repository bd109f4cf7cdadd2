"""What an engine checks of a scheduler and of each decision it returns."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstab.contract.state import bad_value, state_vars_of
from kvstab.contract.traits import traits_of
from kvstab.contract.view import Decision, HiddenOutput, View
from kvstab.errors import InvalidScheduler

__all__ = ["check_decision_shape", "check_decision_values", "check_scheduler_shape"]


def check_decision_shape(decision: object, view: View, who: str) -> Decision:
    """Raise :class:`InvalidScheduler` unless ``decision`` has the contract's shape."""
    if not isinstance(decision, Decision):
        raise InvalidScheduler(f"scheduler {who!r} returned {type(decision).__name__}, expected kvstab.Decision")
    _one_flag_each(who, "admit", decision.admit, view.waiting, "waiting")
    _one_flag_each(who, "preempt", decision.preempt, view.active, "active")
    if decision.state is not None and (not isinstance(decision.state, tuple) or len(decision.state) != len(view.state)):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.state must be None or a tuple of {len(view.state)} values "
            f"(one per declared state variable), got {decision.state!r}"
        )
    if decision.grants is not None and len(decision.grants) != len(view.active) + len(view.waiting):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.grants has {len(decision.grants)} entries, expected "
            f"{len(view.active) + len(view.waiting)} (active, then waiting)"
        )
    return decision


def _one_flag_each(who: str, name: str, flags: Sequence[object], entries: Sequence[object], kind: str) -> None:
    """Raise :class:`InvalidScheduler` unless ``decision.<name>`` holds one flag per ``kind`` entry of the view."""
    if len(flags) != len(entries):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.{name} has {len(flags)} entries, the view has "
            f"{len(entries)} {kind} requests"
        )


def _bad_grant(g: object) -> str | None:
    """What is wrong with ``g`` as a concrete grant (an integer ``≥ 0``), or ``None``."""
    if isinstance(g, float) and math.isnan(g):
        return "NaN"
    bad = bad_value(g, real=False)
    if bad is None and isinstance(g, numbers.Integral) and g < 0:  # (bad_value passes integers only)
        return f"{int(g)}, negative"
    return bad


def check_decision_values(decision: Decision, who: str) -> Decision:
    """Raise :class:`InvalidScheduler` unless a *concrete* decision holds
    booleans in ``admit``/``preempt`` and integers ``≥ 0`` in ``grants``
    (an engine calls it after :func:`check_decision_shape`; symbolic
    decisions hold z3 terms and are not checked here)."""
    for name, vals in (("admit", decision.admit), ("preempt", decision.preempt)):
        for v in vals:
            if type(v) is bool:  # the common case, first: this runs every slot
                continue
            if isinstance(v, HiddenOutput):
                v._read()
            if not isinstance(v, (bool, np.bool_)):
                raise InvalidScheduler(f"scheduler {who!r}: decision.{name} must hold booleans, got {v!r}")
    if decision.grants is not None:
        for i, g in enumerate(decision.grants):
            if type(g) is int and g >= 0:
                continue
            bad = _bad_grant(g)
            if bad is not None:
                raise InvalidScheduler(
                    f"scheduler {who!r}: decision.grants[{i}] is {bad}; a grant is an integer >= 0 tokens"
                )
    return decision


def check_scheduler_shape(obj: Any) -> str | None:
    """What is wrong with ``obj`` as a scheduler, or ``None`` if it fits the contract."""
    for attr in ("name", "description"):
        val = getattr(obj, attr, None)
        if not isinstance(val, str) or not val.strip():
            return f"it needs a non-empty string attribute {attr!r}"
    try:
        traits_of(obj)
        state_vars_of(obj)
    except InvalidScheduler as exc:
        return str(exc).split(": ", 1)[-1]
    decide = getattr(obj, "decide", None)
    if not callable(decide):
        return "it needs a method decide(view, ops) -> Decision"
    try:
        sig = inspect.signature(decide)
    except (TypeError, ValueError):
        return None
    params = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    has_var = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(params) != 2 and not has_var:
        names = ", ".join(p.name for p in params) or "nothing"
        return f"decide must take exactly (view, ops), it takes ({names})"
    return None
