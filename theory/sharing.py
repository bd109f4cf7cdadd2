"""Stability with prefix caching: a shared prompt held once, its prefill skipped.

The paper's ``μ = M/(b̄·E[g])`` charges each request its whole lifetime area.
With automatic prefix caching (docs/MODEL.md, "The model with prefix caching")
a request whose prompt starts with ``P`` tokens another request already wrote
*hits* their full blocks:

* its hit is ``h = B·⌊min(P, s − 1)/B⌋`` tokens — only full blocks are
  shared, and a hit on the whole prompt recomputes its last token (vLLM caps
  the hit at ``s − 1``);
* its prefill starts at ``h``; while it runs it holds ``B⌈x/B⌉`` tokens for
  ``x`` computed, of which the ``h`` hit tokens are blocks held once for all
  sharers.  As ``B | h``, ``B⌈x/B⌉ − h = B⌈(x − h)/B⌉``, so the area it holds
  *net of the shared part* is exactly the no-sharing area of a request with
  prompt ``s − h``: ``g_h(s, o) = g(s − h, o)`` (:func:`net_area_expr`);
* the shared part's own area is ``H`` per slot, held once while some running
  request references it (``H = h`` for one shared prompt; the sum of the
  tenants' referenced prompts for several).

The memory balance of the paper (served area per slot ≤ ``M``) becomes
``λ·b̄·E[g_h] ≤ M − H``, so ``μ_share = (M − H)/(b̄·E[g_h])``, and the
stability constant ``δ`` becomes ``δ_share = S_h/(M − H)`` with
``S_h = ess sup B⌈(s + o − h)/B⌉`` (what one request needs past the shared part).

Premises, each named where it is used: (i) a referenced prompt stays cached (vLLM never evicts a
referenced block); (ii) under saturation the running set is never empty, so a shared part that
every request has is referenced every slot; (iii) for tenants, a prompt is referenced in a slot
when one of the ``N̄`` running requests belongs to its tenant, with independent tenant draws:
probability ``1 − (1 − π_t)^N̄`` (Little's law gives ``N̄``).  Under saturation free memory is
about zero, so an unreferenced prompt is evicted before it is asked for again: the same
probability is then the tenant's hit rate, also when the prompts together exceed ``M``
(docs/theory.md, "(b)").

The numeric twins (:mod:`kvstab.theory.sharing_area`, which needs numpy only) evaluate ``E[g_h]`` exactly with the same code as the
paper's ``E[g]`` (:func:`kvstab.theory.area.expected_g`), on the law of
``s − h``: no sampling.  The lifecycle matters by one step: under vLLM's
(``lifecycle="vllm"``) the first output token comes with the last prefill
chunk, so a request of ``o`` outputs has ``o − 1`` decode steps and its area
is ``g(s − h, o) − B⌈(s − h + o)/B⌉``.
"""

from __future__ import annotations

from functools import cache

import sympy as sp

from kvstab.theory.claims import Claim
from kvstab.theory.g import g_continuous_expr, g_exact_expr
from kvstab.theory.moments import eg_moments
from kvstab.theory.symbols import B, Eo, Es, Es2, Eso, M, bbar, j, k, lam, n, o, s, shat

__all__ = [
    "P_sym",
    "h",
    "H",
    "Egh",
    "Sh",
    "hit_expr",
    "net_area_expr",
    "net_area_continuous_expr",
    "saved_area_expr",
    "eg_net_moments",
    "mu_share_expr",
    "delta_share_expr",
    "guarantee_share_expr",
    "gain_expr",
    "drift_lower_share",
    "backward_area_expr",
    "referenced_expr",
    "ceilings_expr",
    "sharing_claims",
]

#: tokens of the shared prompt
P_sym = sp.Symbol("P", integer=True, positive=True)
#: a request's hit, in tokens (a multiple of B)
h = sp.Symbol("h", integer=True, nonnegative=True)
#: the shared part's tokens, held once
H = sp.Symbol("H", nonnegative=True)
#: E[g_h], the expected area net of the shared part
Egh = sp.Symbol("E_gh", positive=True)
#: ess sup of what one request needs past the shared part
Sh = sp.Symbol("S_h", positive=True)
#: own tokens of a request past its hit (s − h ≥ 1)
u = sp.Symbol("u", integer=True, positive=True)
#: tokens computed so far past the hit, and the hit in blocks
_x = sp.Symbol("x", integer=True, nonnegative=True)
_m = sp.Symbol("m", integer=True, nonnegative=True)
#: a tenant's popularity and the mean number of running requests
pi_t = sp.Symbol("pi_t", positive=True)
Nbar = sp.Symbol("Nbar", positive=True)


# --- symbolic -------------------------------------------------------------------------


def hit_expr() -> sp.Expr:
    """``h = B·⌊min(P, s − 1)/B⌋``: full blocks only, and a whole-prompt hit recomputes one token."""
    return B * sp.floor(sp.Min(P_sym, s - 1) / B)


@cache
def net_area_expr() -> sp.Expr:
    """``g_h(s, o) = g(s − h, o)``: the exact ``g`` with the prompt shortened by the hit
    (``n`` now stands for ``⌈(s − h)/ŝ⌉``, the chunks past the hit)."""
    return sp.expand(g_exact_expr().subs(s, s - h))


@cache
def net_area_continuous_expr() -> sp.Expr:
    """The paper's continuous ``g`` of ``(s − h, o)``."""
    return sp.expand(g_continuous_expr().subs(s, s - h))


@cache
def saved_area_expr() -> sp.Expr:
    """``g(s, o) − g(s − h, o)`` in the continuous form, factored: what one request no
    longer holds on its own (its hit's prefill skipped, its hit's tokens held once)."""
    return sp.factor(sp.expand(g_continuous_expr() - net_area_continuous_expr()))


@cache
def eg_net_moments() -> sp.Expr:
    """``E[g_h]`` (continuous form, one hit ``h`` for all requests) in the moments of ``s`` and ``o``:
    the paper's moment formula with ``E[s] → E[s] − h``, ``E[s²] → E[s²] − 2hE[s] + h²``,
    ``E[s·o] → E[s·o] − hE[o]``."""
    return sp.expand(eg_moments("continuous").subs({Es2: Es2 - 2 * h * Es + h**2, Eso: Eso - h * Eo, Es: Es - h}))


def mu_share_expr() -> sp.Expr:
    """``μ_share = (M − H)/(b̄·E[g_h])``."""
    return (M - H) / (bbar * Egh)


def delta_share_expr() -> sp.Expr:
    """``δ_share = S_h/(M − H)``: the paper's ``δ`` on the memory left beside the shared part."""
    return Sh / (M - H)


def guarantee_share_expr() -> sp.Expr:
    """``μ_share(1 − δ_share) = (M − H − S_h)/(b̄·E[g_h])``."""
    return sp.factor(sp.simplify(mu_share_expr() * (1 - delta_share_expr())))


def gain_expr() -> sp.Expr:
    """``μ_share/μ = (M − H)·E[g]/(M·E[g_h])`` with ``E[g]`` the paper's."""
    from kvstab.theory.symbols import Eg

    return sp.simplify(mu_share_expr() / (M / (bbar * Eg)))


def drift_lower_share() -> sp.Expr:
    """``λb̄E[g_h] − (M − H)``: a slot serves at most ``M − H`` of net area while the shared part is held."""
    return lam * bbar * Egh - (M - H)


@cache
def backward_area_expr() -> sp.Expr:
    """The least area a request of ``u`` own prompt tokens and ``o`` outputs can hold under
    *any* policy that computes at most ``ŝ`` tokens of it per slot: counted back from its
    last prefill slot it holds ``u, u − ŝ, …`` (``n = ⌈u/ŝ⌉`` slots), then ``u + j``:
    ``n·u − ŝ·n(n − 1)/2 + Σ_j (u + j)`` (a sum sympy closes)."""
    prefill = sp.summation(u - k * shat, (k, 0, n - 1))
    return sp.expand(prefill + sp.summation(u + j, (j, 1, o)))


#: the server's cap on running requests and its token budget per slot
Nmax = sp.Symbol("N_max", positive=True)
beta = sp.Symbol("beta", positive=True)
#: E[slots a request is alive] and E[tokens it computes] past its hit
Ealive = sp.Symbol("E_alive", positive=True)
Ework = sp.Symbol("E_work", positive=True)


def ceilings_expr() -> dict[str, sp.Expr]:
    """The three ceilings on completions per slot, each from a balance over a long window:
    memory ``(M − H)/E[g_h]``; the cap on running requests ``N_max/E[alive]`` (Little's law:
    ``N̄ = λb̄·E[alive] ≤ N_max``); the token budget ``β/E[work]`` (each request computes
    ``E[work] = E[s − h] + E[o]`` tokens, ``− 1`` under vLLM's lifecycle).  The saturated rate of a
    rule that keeps the binding resource full is their minimum."""
    return {"memory": (M - H) / Egh, "max_num_seqs": Nmax / Ealive, "token budget": beta / Ework}


def referenced_expr() -> sp.Expr:
    """``1 − (1 − π_t)^N̄``: the chance that one of ``N̄`` running requests, each of tenant ``t``
    with probability ``π_t``, references tenant ``t``'s prompt."""
    return 1 - (1 - pi_t) ** Nbar


def sharing_claims() -> list[Claim]:
    """The identities and inequalities the sharing results rest on, for sympy to check."""
    from kvstab.theory.symbols import Eg, r, t

    crit = sp.solve(sp.Eq(drift_lower_share(), 0), lam)
    return [
        Claim(
            "held past a block-aligned hit: B*ceil((Bm + x)/B) - Bm = B*ceil(x/B)",
            B * sp.ceiling((B * _m + _x) / B) - B * _m,
            B * sp.ceiling(_x / B),
            premise="h = B·m",
        ),
        Claim(
            "net area is the exact g of the prompt past the hit",
            net_area_expr().subs(s, u + h),
            g_exact_expr().subs(s, u),
            premise="u = s − h own tokens",
        ),
        Claim(
            "a hit saves area: g(s, o) − g(s − h, o) ≥ 0",
            saved_area_expr().subs(s, u + h),
            sp.Integer(0),
            ">=",
            premise="s = h + u, u ≥ 1",
        ),
        Claim(
            "E[g_h] in moments is E of the continuous g past the hit",
            eg_net_moments(),
            sp.expand(eg_moments("continuous").subs({Es2: Es2 - 2 * h * Es + h**2, Eso: Eso - h * Eo, Es: Es - h})),
        ),
        Claim("E[g_h] with no hit is the paper's E[g]", eg_net_moments().subs(h, 0), eg_moments("continuous")),
        Claim("the drift bound vanishes at μ_share", crit[0], mu_share_expr()),
        Claim("μ_share(1 − δ_share) = (M − H − S_h)/(b̄E[g_h])", guarantee_share_expr(), (M - H - Sh) / (bbar * Egh)),
        Claim("μ_share/μ = (M − H)E[g]/(M·E[g_h])", gain_expr(), (M - H) * Eg / (M * Egh)),
        Claim("μ_share with no sharing (H = 0, E[g_h] = E[g]) is the paper's μ",
              mu_share_expr().subs({H: 0, Egh: Eg}), M / (bbar * Eg)),
        Claim(
            "backward area ≤ g: the prefill counted from its last chunk holds no more than from its first",
            g_exact_expr().subs(s, (n - 1) * shat + r).subs(shat, r + t),
            backward_area_expr().subs(u, (n - 1) * shat + r).subs(shat, r + t),
            ">=",
            premise="u = (n − 1)ŝ + r, ŝ = r + t (1 ≤ r ≤ ŝ)",
        ),
        Claim("one tenant of all requests is always referenced", referenced_expr().subs(pi_t, 1), sp.Integer(1)),
    ]
