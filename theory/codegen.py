"""Generate :mod:`kvstab.theory._forms`: the numeric twins of the sympy forms.

The numeric code (:mod:`kvstab.theory.area`) must not drift from the
derivations, yet ``kvstab simulate`` and ``kvstab mu`` should not pay for
importing sympy (about a second) just to evaluate a polynomial.  So the
polynomials are *printed* by sympy's NumPy printer into a small generated
module, checked in; ``tests/theory/test_theory_codegen.py`` regenerates it in
memory and fails when the file is stale.  Regenerate with::

    python -m kvstab.theory.codegen
"""

from __future__ import annotations

import os
from collections.abc import Callable

import sympy as sp
from sympy.printing.numpy import NumPyPrinter

from kvstab.theory import g as G
from kvstab.theory import moments as Mo
from kvstab.theory.symbols import B, En, En2, Eo, Eo2, Es, Es2, Eso, L, n, o, q, s, shat

__all__ = ["FORMS", "generate", "TARGET"]

#: the generated module's path
TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_forms.py")

_MOMENTS = (Es, Es2, Eo, Eo2, Eso, En, En2, shat)

#: name -> (arguments, expression thunk, docstring)
FORMS: dict[str, tuple[tuple[sp.Symbol, ...], Callable[[], sp.Expr], str]] = {
    "g_exact": ((s, o, shat, n), G.g_exact_expr, "Exact g for any s, with n = ceil(s / shat)."),
    "g_continuous": ((s, o, shat), G.g_continuous_expr, "The paper's continuous g (exact when shat | s)."),
    "block_prefix": ((q, L, B), G.block_prefix, "F(N) = sum_{x=1}^{N} B*ceil(x/B) for N = q*B + L, 0 <= L < B."),
    "eg_exact": (_MOMENTS, lambda: Mo.eg_moments("exact"), "E[g] (exact form) from the moments."),
    "eg_continuous": (_MOMENTS, lambda: Mo.eg_moments("continuous"), "E[g] (continuous form) from the moments."),
}

_HEADER = '''"""Numeric forms printed by sympy from kvstab.theory's derivations. GENERATED: do not edit.

Regenerate with ``python -m kvstab.theory.codegen``; a test fails when this
file and the derivations disagree.
"""

from __future__ import annotations

from typing import Any

__all__ = {names!r}
'''


def generate() -> str:
    """The source text of :mod:`kvstab.theory._forms`."""
    printer = NumPyPrinter({"fully_qualified_modules": False})
    parts = [_HEADER.format(names=list(FORMS))]
    for name, (args, thunk, doc) in FORMS.items():
        params = ", ".join(f"{a.name}: Any" for a in args)
        parts.append(f'\n\ndef {name}({params}) -> Any:\n    """{doc}"""\n    return {printer.doprint(thunk())}\n')
    return "".join(parts)


def main() -> None:
    """Write :data:`TARGET`."""
    with open(TARGET, "w", encoding="utf-8") as fh:
        fh.write(generate())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
