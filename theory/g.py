"""The lifetime memory area ``g(s, o)``: its defining sum and closed forms, by sympy.

``g(s, o) = Σ_{c=1}^{n} min(c·ŝ, s) + Σ_{j=1}^{o} (s + j)`` with ``n = ⌈s/ŝ⌉``
(MODEL.md, "Lifetime memory area").  Every closed form here is *computed* from
that sum by ``sympy.summation``; the only hand-written step is the way a sum is
split, and each split comes with the :class:`~kvstab.theory.claims.Claim` that
justifies it (e.g. ``min(c·ŝ, s) = c·ŝ`` for ``c < n``).

Three forms:

* **exact** (any ``s``): write ``s = (n − 1)·ŝ + r`` with ``1 ≤ r ≤ ŝ``; the
  first ``n − 1`` chunks hold ``c·ŝ``, the last holds ``s``;
* **continuous** (the paper's): the exact form with ``n = s/ŝ``, i.e. ``ŝ | s``;
* **block-granular** (vLLM): every holding is rounded up to blocks of ``B``.
"""

from __future__ import annotations

from functools import cache

import sympy as sp

from kvstab.theory.claims import Claim
from kvstab.theory.symbols import B, L, N, c, i, j, k, n, o, q, r, s, shat, t

__all__ = [
    "defining_sum",
    "decode_area",
    "prefill_area_exact",
    "g_exact_expr",
    "g_continuous_expr",
    "g_wait_expr",
    "continuous_gap",
    "continuous_gap_bound",
    "block_prefix",
    "block_waste_period",
    "block_tail_sums",
    "block_tail_bounds",
    "g_blocks_bounds",
    "g_claims",
]


@cache
def defining_sum() -> sp.Expr:
    """The defining sum of ``g``, unevaluated (for display and as the reference)."""
    return sp.Sum(sp.Min(c * shat, s), (c, 1, sp.ceiling(s / shat))) + sp.Sum(s + j, (j, 1, o))


@cache
def decode_area() -> sp.Expr:
    """``Σ_{j=1}^{o} (s + j)``, closed by sympy: ``s·o + o(o + 1)/2``."""
    return sp.expand(sp.summation(s + j, (j, 1, o)))


@cache
def _split_prefill() -> sp.Expr:
    # With s = (n-1)ŝ + r, chunks c = 1..n-1 hold c·ŝ (< s) and chunk n holds s;
    # the claims in g_claims() prove both halves of that split.
    return sp.summation(c * shat, (c, 1, n - 1)) + s


@cache
def prefill_area_exact() -> sp.Expr:
    """``Σ_{c=1}^{n} min(c·ŝ, s) = ŝ·n(n − 1)/2 + s`` for ``n = ⌈s/ŝ⌉`` (any ``s``)."""
    return sp.expand(_split_prefill())


@cache
def g_exact_expr() -> sp.Expr:
    """Exact ``g`` for any ``s``, in ``s``, ``o``, ``ŝ`` and ``n = ⌈s/ŝ⌉``."""
    return sp.expand(prefill_area_exact() + decode_area())


@cache
def g_continuous_expr() -> sp.Expr:
    """The paper's form, derived from the sum with ``ŝ | s`` (so ``n = s/ŝ``):
    ``((1 + s/ŝ)·s + 2·o·s + (1 + o)·o) / 2``."""
    # with s = n·ŝ every chunk, the last included, holds c·ŝ
    full = sp.summation(c * shat, (c, 1, n)) + decode_area()
    return sp.expand(full.subs(n, s / shat))


@cache
def g_wait_expr() -> sp.Expr:
    """``g`` without chunking (``ŝ ≥ s``, so ``n = 1``): WAIT's ``(o + 1)(s + o/2)``."""
    return sp.factor(g_exact_expr().subs(n, 1))


@cache
def continuous_gap() -> sp.Expr:
    """``g_exact − g_continuous`` with ``s = (n − 1)ŝ + r``, factored:
    ``(ŝ − r)(2s − r)/(2ŝ)`` — zero exactly when ``r = ŝ`` (``ŝ | s``)."""
    gap = (g_exact_expr() - g_continuous_expr()).subs(s, (n - 1) * shat + r)
    # express the result back in s (n eliminated): n - 1 = (s - r)/ŝ
    return sp.factor(sp.simplify(gap.subs(n, (s - r) / shat + 1)))


@cache
def continuous_gap_bound() -> sp.Expr:
    """The bound ``exact − continuous ≤ s·(ŝ − 1)/ŝ < s`` (the gap at ``r = 1``
    is ``(ŝ − 1)(2s − 1)/(2ŝ)``, below this; see :func:`g_claims`)."""
    return s * (shat - 1) / shat


@cache
def block_prefix() -> sp.Expr:
    """``F(N) = Σ_{x=1}^{N} B·⌈x/B⌉`` for ``N = q·B + L`` (``0 ≤ L < B``):
    ``q`` full blocks, block ``k`` holding ``k·B`` for each of its ``B`` tokens,
    then ``L`` tokens holding ``(q + 1)·B``."""
    return sp.factor(sp.summation(sp.summation(B * (k + 1), (i, 1, B)), (k, 0, q - 1)) + L * B * (q + 1))


@cache
def block_waste_period() -> sp.Expr:
    """Rounding waste ``B⌈x/B⌉ − x`` summed over one period of ``B`` consecutive ``x``:
    the wastes are ``0, 1, …, B − 1`` in some order, so ``B(B − 1)/2``."""
    return sp.factor(sp.summation(k, (k, 0, B - 1)))


@cache
def block_tail_sums() -> tuple[sp.Expr, sp.Expr]:
    """The least and greatest rounding waste over ``q·B + L`` consecutive token
    counts (``0 ≤ L < B``), as sums closed by sympy.

    Consecutive counts have wastes that fall by one modulo ``B``; ``q`` full
    periods waste :func:`block_waste_period` each, and the ``L`` left over waste
    at least ``0 + … + (L − 1)`` and at most ``(B − 1) + … + (B − L)``.  Both
    are attained, by the right residue of the first count.
    """
    lo = q * block_waste_period() + sp.summation(k, (k, 0, L - 1))
    hi = q * block_waste_period() + sp.summation(B - 1 - k, (k, 0, L - 1))
    return sp.expand(lo), sp.expand(hi)


def block_tail_bounds(count: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """:func:`block_tail_sums` in the form ``count·(B − 1)/2 ∓ L(B − L)/2`` with
    ``L = count mod B`` (the claims in :func:`g_claims` check the two agree)."""
    mid = count * (B - 1) / 2
    return mid - L * (B - L) / 2, mid + L * (B - L) / 2


@cache
def g_blocks_bounds() -> tuple[sp.Expr, sp.Expr]:
    """Closed-form bounds ``lo ≤ g_B(s, o) ≤ hi`` for blocks of ``B`` tokens when
    ``B | ŝ`` (vLLM: ŝ = 512, B = 16), in ``s``, ``o``, ``n``, ``ŝ``, ``B`` and
    ``L = (o + 1) mod B``.

    With ``B | ŝ`` the ``n − 1`` full chunks hold whole blocks, so only the last
    chunk (holding ``s``) and the ``o`` decode steps (holding ``s + 1 … s + o``)
    are rounded: ``o + 1`` consecutive counts, whose waste
    :func:`block_tail_bounds` bounds tightly.  (Without ``B | ŝ`` add at most
    ``(n − 1)(B − gcd(ŝ, B))`` to ``hi``.)
    """
    count = o + 1
    lo_w, hi_w = block_tail_bounds(count)
    g = g_exact_expr()
    return g + lo_w, g + hi_w


def g_claims() -> list[Claim]:
    """Every identity and inequality the closed forms rest on, for sympy to check."""
    s_split = (n - 1) * shat + r
    claims: list[Claim] = [
        # the split of the prefill sum: chunk c <= n-1 holds c·ŝ < s ...
        Claim(
            "a full chunk holds c·ŝ < s (c = n − 1 − k, s = (n − 1)ŝ + r)",
            s_split,
            (n - 1 - k) * shat,
            ">",
        ),
        # ... and the last chunk reaches s: n·ŝ >= s, written with ŝ = r + t
        Claim(
            "the last chunk covers the prompt: n·ŝ ≥ s (ŝ = r + t)",
            n * (r + t),
            (n - 1) * (r + t) + r,
            ">=",
        ),
        Claim(
            "exact form equals its defining sum",
            g_exact_expr(),
            sp.summation(c * shat, (c, 1, n - 1)) + s + sp.summation(s + j, (j, 1, o)),
            premise="s = (n − 1)ŝ + r, 1 ≤ r ≤ ŝ",
        ),
        Claim(
            "continuous form equals the defining sum when ŝ | s",
            g_continuous_expr().subs(s, n * shat),
            sp.summation(c * shat, (c, 1, n)) + sp.summation(n * shat + j, (j, 1, o)),
            premise="s = n·ŝ",
        ),
        Claim(
            "continuous and exact forms agree when ŝ | s",
            g_continuous_expr().subs(s, n * shat),
            g_exact_expr().subs(s, n * shat),
            premise="s = n·ŝ",
        ),
        Claim(
            "exact − continuous = (ŝ − r)(2s − r)/(2ŝ)",
            (g_exact_expr() - g_continuous_expr()).subs(s, s_split),
            continuous_gap().subs(s, s_split),
            premise="s = (n − 1)ŝ + r",
        ),
        # inequalities: substitute non-negative slacks (n = k + 1, ŝ = r + t,
        # r = k + 1) so that the sign follows from the symbols' assumptions
        Claim(
            "exact ≥ continuous",
            continuous_gap().subs(s, s_split).subs({shat: r + t, n: k + 1}),
            sp.Integer(0),
            ">=",
            premise="n = k + 1, ŝ = r + t",
        ),
        Claim(
            "exact − continuous ≤ s(ŝ − 1)/ŝ",
            continuous_gap_bound().subs(shat, r + t).subs(r, k + 1),
            continuous_gap().subs(shat, r + t).subs(r, k + 1),
            ">=",
            premise="r = k + 1, ŝ = r + t",
        ),
        Claim(
            "block lemma: ⌈((k − 1)B + i)/B⌉ = k needs (k − 1)B + i > (k − 1)B",
            (k - 1) * (i + t) + i,
            (k - 1) * (i + t),
            ">",
            premise="B = i + t",
        ),
        Claim(
            "block lemma: ... and (k − 1)B + i ≤ k·B",
            k * (i + t),
            (k - 1) * (i + t) + i,
            ">=",
            premise="B = i + t",
        ),
        Claim(
            "block prefix F(qB + L) = B²q(q + 1)/2 + L·B(q + 1)",
            block_prefix(),
            B**2 * q * (q + 1) / 2 + L * B * (q + 1),
        ),
        Claim(
            "with B | ŝ (ŝ = k·B) full chunks hold whole blocks: Σ B⌈cŝ/B⌉ = ŝ n(n − 1)/2",
            sp.summation(B * sp.ceiling(c * (k + 1) * B / B), (c, 1, n - 1)),
            ((k + 1) * B) * n * (n - 1) / 2,
            premise="ŝ = (k + 1)·B",
        ),
        Claim(
            "WAIT: without chunking g = (o + 1)(s + o/2)",
            g_wait_expr(),
            (o + 1) * (s + o / 2),
            premise="ŝ ≥ s (n = 1)",
        ),
    ]
    lo_sum, hi_sum = block_tail_sums()
    lo_form, hi_form = block_tail_bounds(N)
    claims += [
        Claim("least tail waste = N(B − 1)/2 − L(B − L)/2", lo_sum, lo_form.subs(N, q * B + L), premise="N = qB + L"),
        Claim(
            "greatest tail waste = N(B − 1)/2 + L(B − L)/2", hi_sum, hi_form.subs(N, q * B + L), premise="N = qB + L"
        ),
    ]
    lo, hi = g_blocks_bounds()
    claims.append(Claim("block bounds are ordered", hi.subs(B, L + t), lo.subs(B, L + t), ">=", premise="B = L + t"))
    return claims
