"""Prefix caching below saturation: what the free queue keeps, as an LRU cache (Che's approximation).

Two families of :mod:`kvstab.theory.sharing` need the cache's *unreferenced* content, which only
matters below saturation (at saturation free memory is about zero and a block nobody references is
the first one handed out):

**(b) Tenants competing for a finite cache.**  vLLM's free queue (docs/MODEL.md, "The model with
prefix caching") is an LRU list by *release* time: a block whose last reference ends goes to the
tail, an allocation takes the head, a hit takes a block out.  So a block released at time ``τ`` is
still cached at ``τ + a`` when fewer than the queue's length of blocks were allocated since — about
when ``a < T``, Che's characteristic time.  Per slot, with ``Λ = λb̄`` arrivals:

* running requests hold ``ΛE[g_h]`` of net area and the referenced prompts ``Σ_t P̃_t r_t``
  (``P̃_t = B⌊P_t/B⌋``, ``r_t = 1 − (1 − π_t)^N̄``, ``N̄ = ΛE[alive]``), so the free queue holds
  ``C_free = M − ΛE[g_h] − Σ_t P̃_t r_t`` tokens;
* what it holds are the blocks released within the last ``T``: every finished request's own
  blocks, ``ΛE[own]`` per slot (never asked for again: their content is the request's own), and each
  tenant prompt that no running request references and whose last release is younger than ``T``.
  A tenant's references form an M/G/∞ busy–idle process whose idle periods are exponential
  (Poisson arrivals of rate ``Λπ_t``), so the age of an idle period is exponential too:
  ``P(unreferenced, released within T) = (1 − r_t)(1 − e^{−Λπ_tT})``.  Hence
  ``ΛE[own]·T + Σ_t P̃_t(1 − r_t)(1 − e^{−Λπ_tT}) = C_free`` (:func:`occupancy_tenants_expr`);
* tenant ``t``'s hit probability: referenced, or cached though unreferenced,
  ``q_t = 1 − (1 − r_t)e^{−Λπ_tT}`` (:func:`tenant_hit_expr`).

The left side rises strictly in ``T`` (``ΛE[own] > 0``) from 0 to ∞, so for ``C_free > 0`` the
root ``T`` is unique and bisection finds it; at saturation (``Λ = μ_share·b̄``, the existing fixed
point) ``C_free = 0``, so ``T = 0`` and ``q_t = r_t``: today's saturated numbers exactly.  Leaving
out the dead own blocks (counting only prompts in ``C_free``) overstates ``T`` many times over:
measured, it predicts a hit of 0.91 where the engine shows 0.66 (docs/theory.md, "(b)").

**(c) Multi-turn conversations.**  Turn ``k`` arrives a think time ``A ~ Exp(θ)`` (slots) after
turn ``k − 1``'s *arrival*.  Turn ``k − 1`` (prompt ``S``, its own hit ``h₀``, prefill ``c`` slots,
alive ``D`` slots, content written at its end ``L`` full-block tokens) is

* still running (``A < D``): turn ``k`` hits what it has written, ``x(a) = h₀ + (S − h₀)a/c`` in
  its prefill, ``S + (a − c)`` in its decode (block rounding taken as its mean, ``(B − 1)/2``);
* finished and still in the free queue (``D ≤ A < D + T``): it hits ``L``;
* evicted (``A ≥ D + T``): it misses.

``P(run) = 1 − e^{−D/θ}``, ``P(cached) = e^{−D/θ}(1 − e^{−T/θ})``, ``P(miss) = e^{−(D+T)/θ}``
(:func:`chat_probabilities_expr`) and the expected hit (:func:`chat_hit_expr`) are closed forms.
While both run the hit blocks are held once; afterwards turn ``k`` holds them alone, so its area is
``g(s − h, o) + h·D_k`` less the overlap ``x(A)(D − A)`` (:func:`chat_overlap_expr`).  At saturation
``T = 0`` and only the running case hits.  Premises and where they break: docs/theory.md, "(c)".
"""

from __future__ import annotations

from functools import cache

import sympy as sp

from kvstab.theory.claims import Claim
from kvstab.theory.sharing import Nbar, pi_t, referenced_expr
from kvstab.theory.symbols import M, bbar, lam

__all__ = [
    "T_C",
    "theta",
    "occupancy_tenants_expr",
    "free_tenants_expr",
    "tenant_hit_expr",
    "tenant_hit_poisson_expr",
    "chat_probabilities_expr",
    "chat_running_hit_expr",
    "chat_hit_expr",
    "chat_overlap_expr",
    "chat_release_occupancy_expr",
    "lru_claims",
]

#: Che's characteristic time (slots): a released block stays cached about this long
T_C = sp.Symbol("T_C", nonnegative=True)
#: tenant t's full-block prompt tokens, the referenced prompts' tokens, the free tokens
P_t = sp.Symbol("Ptilde_t", nonnegative=True)
R_ref = sp.Symbol("R_ref", nonnegative=True)
C_free = sp.Symbol("C_free", real=True)
#: E[own blocks' tokens a request releases], E[g_h], E[alive]
E_own = sp.Symbol("E_own", positive=True)
Egh = sp.Symbol("E_gh", positive=True)
Ealive = sp.Symbol("E_alive", positive=True)
#: the mean think time (slots), a think time, the previous turn's prompt, its hit, prefill and alive slots
theta = sp.Symbol("theta", positive=True)
A_ = sp.Symbol("a", nonnegative=True)
S_prev = sp.Symbol("S", positive=True)
h0 = sp.Symbol("h_0", nonnegative=True)
c_pre = sp.Symbol("c", positive=True)
D_prev = sp.Symbol("D", positive=True)
L_prev = sp.Symbol("L", nonnegative=True)
B_round = sp.Symbol("B", positive=True, integer=True)

_LAM = lam * bbar  # arrivals per slot


# --- (b) tenants --------------------------------------------------------------------------


def free_tenants_expr() -> sp.Expr:
    """``C_free = M − λb̄E[g_h] − R``: the tokens outside every running request's table
    (``R = Σ_t P̃_t r_t``, the referenced prompts)."""
    return M - _LAM * Egh - R_ref


def occupancy_tenants_expr() -> sp.Expr:
    """One tenant's term of what the free queue holds at characteristic time ``T``, plus the dead
    own blocks' ``λb̄E[own]T`` (the sum over tenants of the second term is the prompts' share)."""
    return _LAM * E_own * T_C + P_t * (1 - referenced_expr()) * (1 - sp.exp(-_LAM * pi_t * T_C))


def tenant_hit_expr() -> sp.Expr:
    """``q_t = 1 − (1 − π_t)^N̄·e^{−λb̄π_tT}``: referenced, or cached though unreferenced."""
    return 1 - (1 - referenced_expr()) * sp.exp(-_LAM * pi_t * T_C)


def tenant_hit_poisson_expr() -> sp.Expr:
    """``q_t`` with a Poisson number of the tenant's running requests (``(1 − π_t)^N̄ → e^{−π_tN̄}``):
    ``1 − e^{−λb̄π_t(E[alive] + T)}`` — cached iff one of its requests arrived within ``E[alive] + T``."""
    return 1 - sp.exp(-_LAM * pi_t * (Ealive + T_C))


# --- (c) conversations --------------------------------------------------------------------


def chat_probabilities_expr() -> dict[str, sp.Expr]:
    """``P(A < D)``, ``P(D ≤ A < D + T)``, ``P(A ≥ D + T)`` for ``A ~ Exp(θ)``."""
    return {
        "running": 1 - sp.exp(-D_prev / theta),
        "cached": sp.exp(-D_prev / theta) * (1 - sp.exp(-T_C / theta)),
        "miss": sp.exp(-(D_prev + T_C) / theta),
    }


def _density() -> sp.Expr:
    return sp.exp(-A_ / theta) / theta


@cache
def chat_running_hit_expr() -> sp.Expr:
    """``E[x(A); A < D]``: the tokens turn ``k − 1`` has written when turn ``k`` arrives while it runs
    (prefill ``h₀ → S`` over ``c`` slots, then one token a slot), less the mean block rounding."""
    pre = sp.integrate((h0 + (S_prev - h0) * A_ / c_pre) * _density(), (A_, 0, c_pre))
    dec = sp.integrate((S_prev + (A_ - c_pre)) * _density(), (A_, c_pre, D_prev))
    run = chat_probabilities_expr()["running"]
    return sp.simplify(pre + dec - (B_round - 1) / 2 * run)


def chat_hit_expr() -> sp.Expr:
    """``E[h]`` of turn ``k``: the running case, plus ``L`` when turn ``k − 1`` is cached after its end."""
    return chat_running_hit_expr() + L_prev * chat_probabilities_expr()["cached"]


@cache
def chat_overlap_expr() -> sp.Expr:
    """``E[x(A)(D − A); A < D]``: the hit area held once while both turns run (no rounding)."""
    pre = sp.integrate((h0 + (S_prev - h0) * A_ / c_pre) * (D_prev - A_) * _density(), (A_, 0, c_pre))
    dec = sp.integrate((S_prev + (A_ - c_pre)) * (D_prev - A_) * _density(), (A_, c_pre, D_prev))
    return sp.simplify(pre + dec)


def chat_release_occupancy_expr() -> sp.Expr:
    """Token-slots turn ``k − 1``'s released chain of ``L`` tokens spends in the free queue when a turn
    ``k`` follows: after a release at ``D < A`` the next arrival is ``Exp(θ)`` away (memoryless), so
    ``L·e^{−D/θ}·θ(1 − e^{−T/θ})``; when turn ``k`` came earlier it holds the shared part and the rest,
    duplicated by turn ``k``'s own prefill, stays ``T``."""
    run = chat_probabilities_expr()["running"]
    return L_prev * sp.exp(-D_prev / theta) * theta * (1 - sp.exp(-T_C / theta)) + (
        L_prev * run - chat_running_hit_expr()) * T_C


def lru_claims() -> list[Claim]:
    """What the sub-saturation results rest on, for sympy to check."""
    occ = occupancy_tenants_expr()
    q = tenant_hit_expr()
    # the limits need signs: the decode lasts d > 0 slots past the prefill, and T > 0
    d_, tau = sp.Symbol("d", positive=True), sp.Symbol("tau", positive=True)
    lim = {D_prev: c_pre + d_, T_C: tau}
    unref = {(1 - pi_t) ** Nbar: sp.Symbol("U", nonnegative=True)}
    pr = chat_probabilities_expr()
    return [
        Claim("at T = 0 (saturation: C_free = 0) the hit is the referenced probability",
              q.subs(T_C, 0), referenced_expr()),
        Claim("the free queue's occupancy rises in T (so T is unique)",
              sp.diff(occ, T_C).subs(unref), sp.Integer(0), ">",
              premise="U = (1 − π_t)^N̄ ≥ 0"),
        Claim("Poisson referencing: (1 − π_t)^N̄ → e^{−π_tN̄}, N̄ = λb̄E[alive]",
              tenant_hit_expr().subs((1 - pi_t) ** Nbar, sp.exp(-pi_t * _LAM * Ealive)),
              tenant_hit_poisson_expr()),
        Claim("running, cached and miss cover every think time", pr["running"] + pr["cached"] + pr["miss"],
              sp.Integer(1)),
        Claim("at T = 0 a finished turn is never hit", pr["cached"].subs(T_C, 0), sp.Integer(0)),
        Claim("a turn that arrives at once hits what its predecessor found cached",
              sp.limit(chat_hit_expr().subs(B_round, 1).subs(lim), theta, 0), h0, premise="B = 1, D > c"),
        Claim("with a think time much longer than T and D the next turn misses",
              sp.limit(chat_hit_expr().subs(lim), theta, sp.oo), sp.Integer(0), premise="D > c"),
        Claim("with θ → ∞ the two turns are never alive together: no overlap",
              sp.limit(chat_overlap_expr().subs(lim), theta, sp.oo), sp.Integer(0), premise="D > c"),
    ]
