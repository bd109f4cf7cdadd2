"""A scheduler's own state: declared as :class:`StateVar` s, carried and checked by the engine."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvstab.contract.view import Decision, HiddenOutput
from kvstab.errors import InvalidScheduler

__all__ = ["StateVar", "bad_value", "state_vars_of", "initial_state", "check_next_state"]


@dataclass(frozen=True, slots=True)
class StateVar:
    """One variable of a scheduler's own state, carried by the engine from slot to slot.

    Many real schedulers keep state across steps (SGLang's ``new_token_ratio``,
    a token bucket, an adaptive watermark).  A rule stays pure: it declares its
    state as ``state_vars = (StateVar(...), ...)``, reads the current values in
    ``view.state`` (declaration order) and returns the next values in
    ``Decision.state``.  The engine starts every run at ``initial`` and checks,
    every slot, that each next value is a finite number within ``[lo, hi]`` (an
    integer unless ``real``) — the bounds are the state invariant the proofs
    assume of the pre-state and must re-establish in the post-state, so a
    concrete run checks the same declaration z3 relies on.
    """

    name: str = field(metadata={"help": "the variable's name (unique within the scheduler)"})
    initial: int | float = field(metadata={"help": "its value in the empty system, at the start of every run"})
    lo: int | float = field(metadata={"help": "least value the rule may ever give it"})
    hi: int | float = field(metadata={"help": "greatest value the rule may ever give it"})
    real: bool = field(default=False, metadata={"help": "a real number (float; z3 Real) rather than an integer"})
    help: str = field(default="", metadata={"help": "one line saying what it is"})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InvalidScheduler(f"a state variable's name must be an identifier, got {self.name!r}")
        for attr in ("initial", "lo", "hi"):
            bad = bad_value(getattr(self, attr), self.real)
            if bad is not None:
                raise InvalidScheduler(f"state variable {self.name!r}: {attr} is {bad}")
        if not (self.lo <= self.initial <= self.hi):
            raise InvalidScheduler(
                f"state variable {self.name!r}: initial value {self.initial!r} is outside its bounds "
                f"[{self.lo!r}, {self.hi!r}]"
            )


def bad_value(v: object, real: bool) -> str | None:
    """What is wrong with ``v`` as a concrete number a rule gives back, or ``None``:
    an integer, or with ``real`` a finite number (a state variable's value; a
    grant, :func:`kvstab.contract.checks.check_decision_values`, is an integer).
    A :class:`HiddenOutput` raises: the rule read a hidden ``o``."""
    if isinstance(v, HiddenOutput):
        v._read()
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, float) if real else numbers.Integral):
        kind = "a finite number" if real else "an integer"
        return f"{v!r} ({type(v).__name__}), not {kind}"
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v!r}, not finite"
    return None


def state_vars_of(scheduler: object) -> tuple[StateVar, ...]:
    """The :class:`StateVar` s a scheduler declares (``()`` for a stateless rule).

    Raises :class:`InvalidScheduler` unless ``state_vars`` is a tuple of
    ``StateVar`` with distinct names.
    """
    who = getattr(scheduler, "name", type(scheduler).__name__)
    declared = getattr(scheduler, "state_vars", ())
    if not isinstance(declared, tuple) or not all(isinstance(v, StateVar) for v in declared):
        raise InvalidScheduler(
            f"scheduler {who!r}: state_vars must be a tuple of kvstab.StateVar(...), got {declared!r}"
        )
    names = [v.name for v in declared]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidScheduler(f"scheduler {who!r}: state variable names must be distinct, repeated: {dup}")
    return declared


def initial_state(state_vars: Sequence[StateVar]) -> tuple[int | float, ...]:
    """The state every run starts from: each variable's ``initial``."""
    return tuple(v.initial for v in state_vars)


def check_next_state(
    decision: Decision, current: tuple[Any, ...], state_vars: Sequence[StateVar], who: str
) -> tuple[Any, ...]:
    """The state after a *concrete* decision: ``current`` if ``decision.state``
    is ``None``, else its values once checked against ``state_vars`` (one per
    variable, finite, an integer unless ``real``, within ``[lo, hi]``);
    :class:`InvalidScheduler` names the variable otherwise."""
    nxt = decision.state
    if nxt is None:
        return current
    if not isinstance(nxt, tuple) or len(nxt) != len(state_vars):
        names = ", ".join(v.name for v in state_vars) or "none"
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.state must be a tuple of {len(state_vars)} values "
            f"(declared state variables: {names}), got {nxt!r}"
        )
    out: list[Any] = []
    for var, value in zip(state_vars, nxt):
        if isinstance(value, np.generic):
            value = value.item()
        bad = bad_value(value, var.real)
        if bad is None and not (var.lo <= value <= var.hi):
            bad = f"{value!r}, outside its declared bounds [{var.lo!r}, {var.hi!r}]"
        if bad is not None:
            raise InvalidScheduler(f"scheduler {who!r}: next value of state variable {var.name!r} is {bad}")
        out.append(value)
    return tuple(out)
