"""The LaTeX printer against exact expected strings, and the text escaper."""

from __future__ import annotations

import pytest
import sympy as sp

from kvstab.theory import g as G
from kvstab.theory import moments as Mo
from kvstab.theory import provisioning as P
from kvstab.theory import stability as St
from kvstab.theory.latex import KvstabLatexPrinter, latex, tex_text
from kvstab.theory.symbols import bbar, lam, rho, shat


@pytest.mark.parametrize(
    "expr,expected",
    [
        (G.g_continuous_expr, r"\frac{o^{2}}{2} + o s + \frac{o}{2} + \frac{s^{2}}{2 \hat{s}} + \frac{s}{2}"),
        (G.g_exact_expr, r"\frac{n^{2} \hat{s}}{2} - \frac{n \hat{s}}{2} + \frac{o^{2}}{2} + o s + \frac{o}{2} + s"),
        (G.continuous_gap, r"\frac{\left(r - 2 s\right) \left(r - \hat{s}\right)}{2 \hat{s}}"),
        (G.g_wait_expr, r"\frac{\left(o + 1\right) \left(o + 2 s\right)}{2}"),
        (G.block_prefix, r"\frac{B \left(q + 1\right) \left(B q + 2 L\right)}{2}"),
        (
            lambda: Mo.eg_moments("continuous"),
            r"\frac{\mathbb{E}[o]}{2} + \frac{\mathbb{E}[o^{2}]}{2} + \frac{\mathbb{E}[s]}{2}"
            r" + \frac{\mathbb{E}[s^{2}]}{2 \hat{s}} + \mathbb{E}[s o]",
        ),
        (St.mu_expr, r"\frac{M}{\mathbb{E}[g] \bar{b}}"),
        (St.guarantee_expr, r"\frac{M - S}{\mathbb{E}[g] \bar{b}}"),
        (St.reserve_limit_expr, r"\frac{M}{\mathbb{E}[(s + o)(n + o)] \bar{b}}"),
        (P.replicas_expr, r"\left\lceil{\frac{\mathbb{E}[g] \bar{b} \lambda}{M \rho}}\right\rceil"),
        (
            lambda: P.mixture_mu_expr(2)[0],
            r"\frac{M}{\bar{b} \left(\mathbb{E}_{1}[g] w_{1} + \mathbb{E}_{2}[g] w_{2}\right)}",
        ),
        (
            G.defining_sum,
            r"\sum_{j=1}^{o} \left(j + s\right) + \sum_{c=1}^{\left\lceil{\frac{s}{\hat{s}}}\right\rceil} \min\left(s, c \hat{s}\right)",
        ),
    ],
)
def test_golden(expr, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert latex(expr()) == expected


def test_symbol_mapping() -> None:
    assert latex(shat) == r"\hat{s}"
    assert latex(bbar * lam / rho) == r"\frac{\bar{b} \lambda}{\rho}"
    assert latex(sp.Symbol("lp_3")) == "{l'_{3}}"
    assert latex(sp.Symbol("lp_3") ** 2) == "{l'_{3}}^{2}"  # a bare l'_{3}^{2} is a double superscript in TeX
    assert latex(sp.Symbol("zeta")) == r"\zeta"  # unmapped names fall back to sympy
    assert isinstance(KvstabLatexPrinter().doprint(shat), str)


def test_tex_text() -> None:
    assert tex_text("exact ≥ continuous when ŝ | s") == r"exact $\geq$ continuous when $\hat{s}$ $|$ s"
    assert tex_text("b̄ = d₀ + d₁M, 50% & _x") == r"$\bar{b}$ = d$_0$ + d$_1$M, 50\% \& \_x"
    with pytest.raises(ValueError, match="U\\+263A"):
        tex_text("smile ☺")
