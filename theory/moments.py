"""``E[g]`` in moments and in closed form for the workloads the paper and the
traces use, derived by sympy from :mod:`kvstab.theory.g`.

``g`` is a polynomial in ``s``, ``o`` and ``n = ⌈s/ŝ⌉`` whose only cross term
is ``s·o``; so ``E[g]`` is linear in the moments ``E[s], E[s²], E[o], E[o²],
E[s·o]`` (continuous form) plus ``E[n], E[n²]`` (exact form).  The covariance
enters only through ``E[s·o] = E[s]E[o] + Cov(s, o)``: ``∂E[g]/∂Cov = 1``.
"""

from __future__ import annotations

from functools import cache

import sympy as sp

from kvstab.theory.claims import Claim
from kvstab.theory.g import g_continuous_expr, g_exact_expr
from kvstab.theory.symbols import (
    En,
    En2,
    Eo,
    Eo2,
    Es,
    Es2,
    Eso,
    K,
    L,
    a,
    a_o,
    b,
    b_o,
    corr,
    cov,
    k,
    n,
    o,
    p,
    q,
    s,
    shat,
    sigma_o,
    sigma_s,
    x,
)

__all__ = [
    "expectation_of",
    "eg_moments",
    "eg_covariance",
    "uniform_moments",
    "geometric_moments",
    "chunk_count_sums",
    "eg_uniform",
    "eg_fixed",
    "eg_geometric_output",
    "eg_correlated_uniform",
    "moment_claims",
]

_MOMENTS = {s * o: Eso, s**2: Es2, o**2: Eo2, n**2: En2, s: Es, o: Eo, n: En}


def expectation_of(poly: sp.Expr) -> sp.Expr:
    """``E[poly]`` by linearity, for a polynomial in ``s``, ``o``, ``n`` of
    degree ≤ 2 whose monomials are those of ``g`` (each has its moment symbol).

    Raises ``ValueError`` on a monomial with no moment symbol (e.g. ``s·n``),
    so that a new form cannot silently lose a term.
    """
    expanded = sp.Poly(sp.expand(poly), s, o, n)
    total = sp.Integer(0)
    for monom, coeff in expanded.terms():
        term = s ** monom[0] * o ** monom[1] * n ** monom[2]
        if term == 1:
            total += coeff
        elif term in _MOMENTS:
            total += coeff * _MOMENTS[term]
        else:
            raise ValueError(f"no moment symbol for the monomial {term}")
    return sp.expand(total)


@cache
def eg_moments(convention: str = "exact") -> sp.Expr:
    """``E[g]`` in the moments: exact form (needs ``E[n]``, ``E[n²]``) or the
    paper's continuous form."""
    if convention == "exact":
        return expectation_of(g_exact_expr())
    if convention == "continuous":
        return expectation_of(g_continuous_expr())
    raise ValueError(f"convention must be 'exact' or 'continuous', got {convention!r}")


@cache
def eg_covariance(convention: str = "exact") -> sp.Expr:
    """``E[g]`` with the covariance explicit: ``E[s·o] = E[s]E[o] + C_so``."""
    return sp.expand(eg_moments(convention).subs(Eso, Es * Eo + cov))


@cache
def uniform_moments(lo: sp.Expr, hi: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """``(E[X], E[X²])`` of the discrete uniform on ``{lo, …, hi}``, by summation."""
    size = hi - lo + 1
    m1 = sp.factor(sp.summation(x, (x, lo, hi)) / size)
    m2 = sp.factor(sp.summation(x**2, (x, lo, hi)) / size)
    return m1, m2


@cache
def geometric_moments(prob: sp.Expr = p, cap: sp.Expr = K) -> tuple[sp.Expr, sp.Expr]:
    """``(E[X], E[X²])`` of a geometric law on ``{1, 2, …}`` with success
    probability ``p``, conditioned on ``X ≤ K`` (kvstab's ``geom(p, K)``)."""
    w = prob * (1 - prob) ** (x - 1)
    z = sp.summation(w, (x, 1, cap))
    m1 = sp.simplify(sp.summation(x * w, (x, 1, cap)) / z)
    m2 = sp.simplify(sp.summation(x**2 * w, (x, 1, cap)) / z)
    return m1, m2


@cache
def chunk_count_sums() -> tuple[sp.Expr, sp.Expr]:
    """``(Σ_{x=1}^{N} n(x), Σ_{x=1}^{N} n(x)²)`` with ``n(x) = ⌈x/ŝ⌉`` and
    ``N = q·ŝ + L`` (``0 ≤ L < ŝ``): ``q`` full runs of ``ŝ`` prompts with
    ``k + 1`` chunks each, then ``L`` prompts with ``q + 1`` chunks."""
    s1 = sp.summation(shat * (k + 1), (k, 0, q - 1)) + L * (q + 1)
    s2 = sp.summation(shat * (k + 1) ** 2, (k, 0, q - 1)) + L * (q + 1) ** 2
    return sp.factor(s1), sp.factor(s2)


@cache
def _uniform_chunk_moments(lo: sp.Expr, hi: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    # E[n], E[n²] for s ~ U(lo, hi): difference of prefix sums at hi and lo - 1,
    # each in its own quotient and remainder by ŝ (floor and Mod stay symbolic)
    s1, s2 = chunk_count_sums()

    def at(v: sp.Expr, e: sp.Expr) -> sp.Expr:
        return e.subs({q: sp.floor(v / shat), L: sp.Mod(v, shat)})

    size = hi - lo + 1
    return (at(hi, s1) - at(lo - 1, s1)) / size, (at(hi, s2) - at(lo - 1, s2)) / size


def _eg_uniform_prompt(mo1: sp.Expr, mo2: sp.Expr, convention: str, cross: sp.Expr = sp.S.Zero) -> sp.Expr:
    """``E[g]`` for ``s ~ U(a, b)`` and an output with moments ``E[o] = mo1``, ``E[o²] = mo2``;
    ``E[s·o] = E[s]E[o] + cross`` (0: independent)."""
    ms1, ms2 = uniform_moments(a, b)
    sub = {Es: ms1, Es2: ms2, Eo: mo1, Eo2: mo2, Eso: ms1 * mo1 + cross}
    if convention == "exact":
        en, en2 = _uniform_chunk_moments(a, b)
        sub |= {En: en, En2: en2}
    return eg_moments(convention).subs(sub)


@cache
def eg_uniform(convention: str = "exact") -> sp.Expr:
    """``E[g]`` for independent ``s ~ U(a, b)``, ``o ~ U(a_o, b_o)`` (the paper's workloads)."""
    return _eg_uniform_prompt(*uniform_moments(a_o, b_o), convention)


@cache
def eg_fixed(convention: str = "exact") -> sp.Expr:
    """``E[g]`` for fixed lengths ``s``, ``o``: ``g`` itself, with ``n = ⌈s/ŝ⌉``."""
    sub = {Es: s, Es2: s**2, Eo: o, Eo2: o**2, Eso: s * o}
    if convention == "exact":
        sub |= {En: sp.ceiling(s / shat), En2: sp.ceiling(s / shat) ** 2}
    return sp.expand(eg_moments(convention).subs(sub))


@cache
def eg_geometric_output(convention: str = "continuous") -> sp.Expr:
    """``E[g]`` for ``s ~ U(a, b)`` and, independent of it, a geometric output
    ``o ~ geom(p, K)`` (truncated at ``K``)."""
    return _eg_uniform_prompt(*geometric_moments(), convention)


@cache
def eg_correlated_uniform(convention: str = "continuous") -> sp.Expr:
    """``E[g]`` for uniform marginals ``U(a, b)`` and ``U(a_o, b_o)`` with
    correlation coefficient ``ϱ``: the independent value plus ``ϱ·σ_s·σ_o``."""
    ms1, ms2 = uniform_moments(a, b)
    mo1, mo2 = uniform_moments(a_o, b_o)
    var_s = sp.factor(ms2 - ms1**2)
    var_o = sp.factor(mo2 - mo1**2)
    eg = _eg_uniform_prompt(mo1, mo2, convention, cross=corr * sigma_s * sigma_o)
    return eg.subs({sigma_s: sp.sqrt(var_s), sigma_o: sp.sqrt(var_o)})


def moment_claims() -> list[Claim]:
    """Identities about ``E[g]`` for sympy to check."""
    return [
        Claim("∂E[g]/∂Cov(s, o) = 1", sp.diff(eg_covariance("exact"), cov), sp.Integer(1)),
        Claim(
            "the exact and continuous E[g] agree when ŝ | s (n = s/ŝ, so E[n²] = E[s²]/ŝ²)",
            eg_moments("exact").subs({En: Es / shat, En2: Es2 / shat**2}),
            eg_moments("continuous"),
            premise="ŝ | s almost surely",
        ),
        Claim(
            "Var U(a, b) = ((b − a + 1)² − 1)/12",
            sp.factor(uniform_moments(a, b)[1] - uniform_moments(a, b)[0] ** 2),
            ((b - a + 1) ** 2 - 1) / 12,
        ),
    ]
