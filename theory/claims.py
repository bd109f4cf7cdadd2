"""A claim checked by sympy: ``lhs`` relates to ``rhs`` under the symbols' assumptions.

Derivations return :class:`Claim` values rather than asserting on the spot, so
that tests check them, the derivation document prints them, and a claim that
sympy cannot decide reads as *not proved* — never as proved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import sympy as sp

__all__ = ["Claim", "is_closed"]

Relation = Literal["==", ">=", ">"]


@dataclass(frozen=True)
class Claim:
    """``lhs <relation> rhs`` for every value of the free symbols allowed by their
    assumptions (and the substitutions in ``premise``, which are part of it)."""

    name: str = field(metadata={"help": "short label, e.g. 'exact form equals its sum'"})
    lhs: sp.Expr = field(metadata={"help": "left-hand side"})
    rhs: sp.Expr = field(metadata={"help": "right-hand side"})
    relation: Relation = field(default="==", metadata={"help": "'==', '>=' or '>'"})
    premise: str = field(default="", metadata={"help": "the hypothesis, in words (e.g. 'ŝ | s')"})

    def difference(self) -> sp.Expr:
        """``lhs − rhs``, simplified."""
        return _difference(self.lhs, self.rhs)

    def holds(self) -> bool:
        """Whether sympy proves the claim.  ``False`` means *not proved*: either
        false, or beyond sympy's assumption system."""
        d = self.difference()
        if self.relation == "==":
            return bool(d == 0)
        if self.relation == ">=":
            return d.is_nonnegative is True
        return d.is_positive is True


@lru_cache(maxsize=1024)
def _difference(lhs: sp.Expr, rhs: sp.Expr) -> sp.Expr:
    # sympy expressions are immutable and hashable: the document, the CLI and
    # the tests ask about the same claims, and simplify is the expensive part
    return sp.factor(sp.simplify(sp.expand(lhs - rhs)))


def is_closed(expr: sp.Basic) -> bool:
    """Whether ``expr`` holds no unevaluated ``Sum``, ``Product``, ``Integral`` or ``Limit``."""
    return not expr.has(sp.Sum, sp.Product, sp.Integral, sp.Limit)
