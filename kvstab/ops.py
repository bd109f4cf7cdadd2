"""The operations interface a scheduler rule is written against.

A decision rule never uses Python control flow on the values it reads from a
view.  It calls these operations instead, so that the *same* rule runs on
Python integers in the simulator (:data:`CONCRETE`) and on z3 terms in
``kvstab.proofs`` (:class:`kvstab.symbolic.Z3Ops`).  Plain arithmetic
(``+``, ``-``, ``*``) and comparisons (``<``, ``<=``, ``==`` …) work directly on
both kinds of value; everything that would need a Python ``bool`` goes through
an operation here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Ops", "ConcreteOps", "CONCRETE", "IntLike", "BoolLike"]

#: An integer value as a rule sees it: a Python ``int`` or a symbolic term.
IntLike = Any
#: A truth value as a rule sees it: a Python ``bool`` or a symbolic term.
BoolLike = Any


@runtime_checkable
class Ops(Protocol):
    """What a rule may call.  ``symbolic`` tells the two implementations apart
    for code that must *build* a view (engines), never for rules."""

    symbolic: bool

    def const(self, value: int) -> IntLike:
        """``value`` as a term of this interface."""

    def ite(self, cond: BoolLike, then: Any, other: Any) -> Any:
        """``then`` if ``cond`` else ``other``; both branches are evaluated."""

    def min(self, *xs: IntLike) -> IntLike:
        """The least of one or more values."""

    def max(self, *xs: IntLike) -> IntLike:
        """The greatest of one or more values."""

    def and_(self, *xs: BoolLike) -> BoolLike:
        """Conjunction (``True`` for no arguments)."""

    def or_(self, *xs: BoolLike) -> BoolLike:
        """Disjunction (``False`` for no arguments)."""

    def not_(self, x: BoolLike) -> BoolLike:
        """Negation."""

    def sum(self, xs: Iterable[IntLike]) -> IntLike:
        """Sum of a finite iterable (``0`` when empty)."""

    def lt(self, a: IntLike, b: IntLike) -> BoolLike:
        """``a < b``."""

    def le(self, a: IntLike, b: IntLike) -> BoolLike:
        """``a <= b``."""

    def eq(self, a: IntLike, b: IntLike) -> BoolLike:
        """``a == b``."""

    def div(self, a: IntLike, b: IntLike) -> IntLike:
        """Floor division of a non-negative ``a`` by a positive ``b``."""

    def ceil_div(self, a: IntLike, b: IntLike) -> IntLike:
        """``⌈a / b⌉`` for non-negative ``a`` and positive ``b``."""

    def floor(self, x: Any) -> IntLike:
        """``⌊x⌋`` as an integer, of an integer or a finite real (a rule that keeps a
        real-valued state turns a real token count back into tokens with it)."""

    def count(self, xs: Iterable[BoolLike]) -> IntLike:
        """How many of ``xs`` are true."""


class ConcreteOps:
    """The interface on Python ints and bools: what the simulator runs."""

    symbolic = False

    def const(self, value: int) -> int:
        return int(value)

    def ite(self, cond: bool, then: Any, other: Any) -> Any:
        return then if cond else other

    def min(self, *xs: int) -> int:
        return min(xs)

    def max(self, *xs: int) -> int:
        return max(xs)

    def and_(self, *xs: bool) -> bool:
        return all(xs)

    def or_(self, *xs: bool) -> bool:
        return any(xs)

    def not_(self, x: bool) -> bool:
        return not x

    def sum(self, xs: Iterable[int]) -> int:
        return sum(xs)

    def lt(self, a: int, b: int) -> bool:
        return a < b

    def le(self, a: int, b: int) -> bool:
        return a <= b

    def eq(self, a: int, b: int) -> bool:
        return a == b

    def div(self, a: int, b: int) -> int:
        return a // b

    def ceil_div(self, a: int, b: int) -> int:
        return -(-a // b)

    def floor(self, x: Any) -> int:
        return math.floor(x)

    def count(self, xs: Iterable[bool]) -> int:
        return sum(1 for x in xs if x)


#: The shared concrete instance (the interface is stateless).
CONCRETE = ConcreteOps()
