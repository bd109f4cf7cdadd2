"""Numeric forms printed by sympy from kvstab.theory's derivations. GENERATED: do not edit.

Regenerate with ``python -m kvstab.theory.codegen``; a test fails when this
file and the derivations disagree.
"""

from __future__ import annotations

from typing import Any

__all__ = ["g_exact", "g_continuous", "block_prefix", "eg_exact", "eg_continuous"]


def g_exact(s: Any, o: Any, shat: Any, n: Any) -> Any:
    """Exact g for any s, with n = ceil(s / shat)."""
    return (1 / 2) * n**2 * shat - 1 / 2 * n * shat + (1 / 2) * o**2 + o * s + (1 / 2) * o + s


def g_continuous(s: Any, o: Any, shat: Any) -> Any:
    """The paper's continuous g (exact when shat | s)."""
    return (1 / 2) * o**2 + o * s + (1 / 2) * o + (1 / 2) * s**2 / shat + (1 / 2) * s


def block_prefix(q: Any, L: Any, B: Any) -> Any:
    """F(N) = sum_{x=1}^{N} B*ceil(x/B) for N = q*B + L, 0 <= L < B."""
    return (1 / 2) * B * (q + 1) * (B * q + 2 * L)


def eg_exact(E_s: Any, E_s2: Any, E_o: Any, E_o2: Any, E_so: Any, E_n: Any, E_n2: Any, shat: Any) -> Any:
    """E[g] (exact form) from the moments."""
    return -1 / 2 * E_n * shat + (1 / 2) * E_n2 * shat + (1 / 2) * E_o + (1 / 2) * E_o2 + E_s + E_so


def eg_continuous(E_s: Any, E_s2: Any, E_o: Any, E_o2: Any, E_so: Any, E_n: Any, E_n2: Any, shat: Any) -> Any:
    """E[g] (continuous form) from the moments."""
    return (1 / 2) * E_o + (1 / 2) * E_o2 + (1 / 2) * E_s + (1 / 2) * E_s2 / shat + E_so
