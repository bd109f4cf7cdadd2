"""Cross-check with the fluid model of Ao, Luo, Simchi-Levi & Wang (arXiv 2504.11320, "WAIT").

WAIT has no chunked prefill (a prompt of ``l`` tokens is prefilled in one
iteration, ``n = 1``), so a request of type ``(l, l′)`` occupies
``g(l, l′) = (l′ + 1)(l + l′/2)`` token-iterations of memory
(:func:`kvstab.theory.g.g_wait_expr`).  An iteration with ``C`` tokens in
memory takes ``d₀ + d₁·C`` seconds.  Their fluid stability region, with the
memory-area arrival rate ``Λ = Σ_types λ_t·g(l_t, l′_t)``, is
``Λ ≤ C/(d₀ + d₁·C)``.  At saturation the memory is full, so the batch time is
``b̄ = d₀ + d₁·M`` with ``C = M``; :func:`wait_claims` proves the region is then
exactly ``λ ≤ μ`` with ``E[g]`` the rate-weighted mean of the types' ``g``.
"""

from __future__ import annotations

import sympy as sp

from kvstab.theory.claims import Claim
from kvstab.theory.g import g_exact_expr, g_wait_expr
from kvstab.theory.stability import mu_expr
from kvstab.theory.symbols import Eg, M, bbar, d0, d1, n, o, s, shat

__all__ = ["wait_region", "wait_claims"]


def wait_region(types: int = 3) -> tuple[sp.Expr, sp.Expr, list[sp.Symbol], list[tuple[sp.Symbol, sp.Symbol]]]:
    """``(Λ, C/(d₀ + d₁C))`` with ``C = M`` for ``types`` request types, and the
    types' rate and length symbols."""
    rates = list(sp.symbols(f"lambda_1:{types + 1}", positive=True))
    lengths = [sp.symbols(f"l_{t} lp_{t}", integer=True, positive=True) for t in range(1, types + 1)]
    g = g_wait_expr()
    inflow = sum((r * g.subs({s: ln, o: lp}) for r, (ln, lp) in zip(rates, lengths)), sp.Integer(0))
    return inflow, M / (d0 + d1 * M), rates, lengths


def wait_claims(types: int = 3) -> list[Claim]:
    """The WAIT identities, for sympy to check."""
    inflow, cap, rates, lengths = wait_region(types)
    total = sum(rates, sp.Integer(0))
    # E[g] of the mixture of types, weighted by arrival rate
    eg_mix = inflow / total
    mu_wait = mu_expr().subs({Eg: eg_mix, bbar: d0 + d1 * M})
    # the boundary of the fluid region, solved for a common scale of the rates
    z = sp.Symbol("z", positive=True)
    (z_star,) = sp.solve(sp.Eq(inflow.subs({r: z * r for r in rates}), cap), z)
    return [
        Claim("WAIT's g is the exact g with n = 1", g_exact_expr().subs(n, 1), g_wait_expr(), premise="ŝ ≥ s"),
        Claim(
            "WAIT's g is the exact g when the chunk covers the prompt",
            g_exact_expr().subs({n: 1, shat: s + sp.Symbol("t_0", nonnegative=True)}),
            g_wait_expr(),
        ),
        Claim("Λ ≤ C/(d₀ + d₁C) ⟺ λ ≤ μ with b̄ = d₀ + d₁M: the region's edge is λ = μ", z_star * total, mu_wait),
        Claim("Λ − C/(d₀ + d₁C) = b̄·E[g]·(λ − μ)/b̄ with b̄ = d₀ + d₁M", inflow - cap, eg_mix * (total - mu_wait)),
    ]
