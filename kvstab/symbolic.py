"""The operations interface on z3 terms, and the guard against Python control flow.

:class:`Z3Ops` runs a scheduler rule symbolically.  Values it hands to a rule
are :class:`Sym` wrappers around z3 expressions: arithmetic and comparisons
build terms, and any attempt to turn one into a Python ``bool`` (``if``,
``while``, ``and``/``or``/``not``, the builtins ``min``/``max``/``any``/``all``,
``bool()``) raises :class:`InvalidScheduler` naming the rule's file and line.
z3 itself would sometimes *answer* such a question (``bool(x == y)`` compares
terms structurally), silently giving a wrong proof; the wrapper closes that hole.
"""

from __future__ import annotations

import linecache
import math
import os
import sys
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import z3

from kvstab.errors import InvalidScheduler

__all__ = ["Sym", "Z3Ops", "unwrap", "wrap"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# frames in these files are plumbing, not the rule that branched
_PLUMBING = {
    os.path.join(_HERE, "symbolic.py"),
    os.path.join(_HERE, "ops.py"),
}


def _caller() -> str:
    """``file:line: source`` of the innermost frame outside the plumbing."""
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename) in _PLUMBING:
        f = f.f_back  # type: ignore[assignment]
    if f is None:
        return "<unknown>"
    src = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f"{f.f_code.co_filename}:{f.f_lineno} ({src})" if src else f"{f.f_code.co_filename}:{f.f_lineno}"


def unwrap(x: Any) -> Any:
    """The z3 expression behind ``x`` (ints, bools and finite floats become z3 values)."""
    if isinstance(x, Sym):
        return x.z
    if isinstance(x, bool):
        return z3.BoolVal(x)
    if isinstance(x, int):
        return z3.IntVal(x)
    if isinstance(x, float) and math.isfinite(x):
        # the float's exact binary value (z3 would read its decimal rendering)
        return z3.RealVal(Fraction(x))
    return x


def wrap(x: Any) -> Any:
    """``x`` as a :class:`Sym` if it is a z3 expression; Python values pass through."""
    if isinstance(x, z3.ExprRef):
        return Sym(x)
    return x


def _floordiv(a: Any, b: Any) -> z3.ArithRef:
    """``a // b`` as Python computes it.  z3's ``/`` is Euclidean division on
    integers (floor for the positive divisors rules use) but *real* division
    on reals, so a real operand (a ``real=True`` state variable) floors
    explicitly, as ``float // int`` does."""
    za, zb = unwrap(a), unwrap(b)
    if za.is_real() or zb.is_real():
        return z3.ToInt(za / zb)
    return za / zb


def _mod(a: Any, b: Any) -> z3.ArithRef:
    """``a % b`` as Python computes it (``a - b·⌊a/b⌋`` for a real operand)."""
    za, zb = unwrap(a), unwrap(b)
    if za.is_real() or zb.is_real():
        return za - zb * z3.ToReal(z3.ToInt(za / zb))
    return za % zb


def _is_bool(x: Any) -> bool:
    return (
        isinstance(x, bool) or (isinstance(x, Sym) and z3.is_bool(x.z)) or (isinstance(x, z3.ExprRef) and z3.is_bool(x))
    )


class Sym:
    """A symbolic integer or truth value handed to a rule by :class:`Z3Ops`."""

    __slots__ = ("z",)

    def __init__(self, z: z3.ExprRef) -> None:
        self.z = z

    # --- arithmetic
    def __add__(self, other: Any) -> Sym:
        return Sym(self.z + unwrap(other))

    def __radd__(self, other: Any) -> Sym:
        return Sym(unwrap(other) + self.z)

    def __sub__(self, other: Any) -> Sym:
        return Sym(self.z - unwrap(other))

    def __rsub__(self, other: Any) -> Sym:
        return Sym(unwrap(other) - self.z)

    def __mul__(self, other: Any) -> Sym:
        return Sym(self.z * unwrap(other))

    def __rmul__(self, other: Any) -> Sym:
        return Sym(unwrap(other) * self.z)

    def __floordiv__(self, other: Any) -> Sym:
        return Sym(_floordiv(self.z, other))  # z3 Int division: floor for positive divisors

    def __rfloordiv__(self, other: Any) -> Sym:
        return Sym(_floordiv(other, self.z))

    def __truediv__(self, other: Any) -> Sym:
        # true division is real-valued, as in Python (an Int operand is promoted)
        return Sym(z3.ToReal(self.z) / unwrap(other) if self.z.is_int() else self.z / unwrap(other))

    def __rtruediv__(self, other: Any) -> Sym:
        zo = unwrap(other)
        return Sym(z3.ToReal(zo) / self.z if zo.is_int() else zo / self.z)

    def __mod__(self, other: Any) -> Sym:
        return Sym(_mod(self.z, other))

    def __neg__(self) -> Sym:
        return Sym(-self.z)

    # --- comparisons build terms
    def __lt__(self, other: Any) -> Sym:
        return Sym(self.z < unwrap(other))

    def __le__(self, other: Any) -> Sym:
        return Sym(self.z <= unwrap(other))

    def __gt__(self, other: Any) -> Sym:
        return Sym(self.z > unwrap(other))

    def __ge__(self, other: Any) -> Sym:
        return Sym(self.z >= unwrap(other))

    def __eq__(self, other: Any) -> Sym:  # type: ignore[override]
        return Sym(self.z == unwrap(other))

    def __ne__(self, other: Any) -> Sym:  # type: ignore[override]
        return Sym(self.z != unwrap(other))

    __hash__ = None  # type: ignore[assignment]

    # --- logic with & | ~ on truth values
    def __and__(self, other: Any) -> Sym:
        return Sym(z3.And(self.z, unwrap(other)))

    __rand__ = __and__

    def __or__(self, other: Any) -> Sym:
        return Sym(z3.Or(self.z, unwrap(other)))

    __ror__ = __or__

    def __invert__(self) -> Sym:
        return Sym(z3.Not(self.z))

    # --- everything that would need a concrete value is a rule error
    def __bool__(self) -> bool:
        raise InvalidScheduler(
            f"the rule uses Python control flow on a symbolic value at {_caller()}: "
            "`if`, `and`, `or`, `not`, min(), max(), any() and all() need a concrete value; "
            "use ops.ite(cond, a, b), ops.and_, ops.or_, ops.not_, ops.min, ops.max instead"
        )

    def __index__(self) -> int:
        raise InvalidScheduler(
            f"the rule uses a symbolic value as a Python integer (index, range, len) at {_caller()}; "
            "loops may range only over the view's entries, and values must go through ops"
        )

    __int__ = __index__

    def __float__(self) -> float:
        raise InvalidScheduler(f"the rule converts a symbolic value to float at {_caller()}; stay in integers")

    def __repr__(self) -> str:
        return f"Sym({self.z})"


class Z3Ops:
    """The operations interface on z3 terms (see :class:`kvstab.ops.Ops`)."""

    symbolic = True

    def const(self, value: int) -> Sym:
        return Sym(z3.IntVal(int(value)))

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(cond, bool):
            # a condition known in Python needs no term (e.g. a masked constant)
            return then if cond else other
        c = unwrap(cond)
        a, b = unwrap(then), unwrap(other)
        if _is_bool(then) or _is_bool(other):
            a = a if not isinstance(a, bool) else z3.BoolVal(a)
            b = b if not isinstance(b, bool) else z3.BoolVal(b)
        return Sym(z3.If(c, a, b))

    def min(self, *xs: Any) -> Any:
        if not xs:
            raise InvalidScheduler("ops.min needs at least one value")
        acc = xs[0]
        for x in xs[1:]:
            acc = self.ite(self.le(acc, x), acc, x)
        return acc

    def max(self, *xs: Any) -> Any:
        if not xs:
            raise InvalidScheduler("ops.max needs at least one value")
        acc = xs[0]
        for x in xs[1:]:
            acc = self.ite(self.le(x, acc), acc, x)
        return acc

    def and_(self, *xs: Any) -> Any:
        terms = []
        for x in xs:
            if isinstance(x, bool):
                if not x:
                    return False
                continue
            terms.append(unwrap(x))
        if not terms:
            return True
        return Sym(terms[0]) if len(terms) == 1 else Sym(z3.And(*terms))

    def or_(self, *xs: Any) -> Any:
        terms = []
        for x in xs:
            if isinstance(x, bool):
                if x:
                    return True
                continue
            terms.append(unwrap(x))
        if not terms:
            return False
        return Sym(terms[0]) if len(terms) == 1 else Sym(z3.Or(*terms))

    def not_(self, x: Any) -> Any:
        if isinstance(x, bool):
            return not x
        return Sym(z3.Not(unwrap(x)))

    def sum(self, xs: Iterable[Any]) -> Any:
        items = list(xs)
        if not items:
            return 0
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return sum(items)
        if len(items) == 1:
            # z3 would build a one-argument `+`, which SMT-LIB (and cvc5) reject
            return items[0] if isinstance(items[0], Sym) else Sym(unwrap(items[0]))
        return Sym(z3.Sum(*[unwrap(x) for x in items]))

    def _cmp(self, a: Any, b: Any, op: str) -> Any:
        if not isinstance(a, Sym) and not isinstance(b, Sym):
            return {"lt": a < b, "le": a <= b, "eq": a == b}[op]
        za, zb = unwrap(a), unwrap(b)
        return Sym({"lt": za < zb, "le": za <= zb, "eq": za == zb}[op])

    def lt(self, a: Any, b: Any) -> Any:
        return self._cmp(a, b, "lt")

    def le(self, a: Any, b: Any) -> Any:
        return self._cmp(a, b, "le")

    def eq(self, a: Any, b: Any) -> Any:
        return self._cmp(a, b, "eq")

    def div(self, a: Any, b: Any) -> Any:
        if not isinstance(a, Sym) and not isinstance(b, Sym):
            return a // b
        return Sym(_floordiv(a, b))

    def ceil_div(self, a: Any, b: Any) -> Any:
        if not isinstance(a, Sym) and not isinstance(b, Sym):
            return -(-a // b)
        za, zb = unwrap(a), unwrap(b)
        if za.is_real() or zb.is_real():
            return Sym(-_floordiv(-za, zb))  # as -(-a // b) does on a float
        return Sym((za + zb - 1) / zb)

    def floor(self, x: Any) -> Any:
        if not isinstance(x, Sym):
            return math.floor(x)
        z = unwrap(x)
        return Sym(z3.ToInt(z)) if z.is_real() else x  # z3's ToInt is ⌊·⌋

    def count(self, xs: Iterable[Any]) -> Any:
        return self.sum(self.ite(x, 1, 0) for x in xs)
