"""``μ``, ``δ``, the two stability theorems and their drift argument, by sympy.

* ``μ = M / (b̄·E[g])``, ``δ = S / M`` with ``S = ess sup(s + o)``;
  the guaranteed rate ``μ(1 − δ) = (M − S)/(b̄·E[g])``.
* The reserve policy's limit ``M / (b̄·E[(s + o)(n(s) + o)])``.
* The Lyapunov function ``V`` = remaining memory area of all requests in the
  system.  :func:`lyapunov_cases` writes the per-slot identity
  ``V′ = V + Σ_arrivals g − used + wasted`` request by request, one case per
  event (a sum of per-request identities is the identity for any finite set
  of requests).  The arithmetic of each case is immediate; its content is the
  charging conventions it takes as premises, which are checked against the
  simulator (property 5 of the audit, ``tests/theory/test_theory_lyapunov_sim.py``)
  and for the z3 encoding by ``kvstab.proofs.lemmas``.
* Drift: ``E[ΔV] = λ·b̄·E[g] − E[used] + E[wasted]``.  A slot uses at most
  ``M`` (so ``E[ΔV] ≥ λb̄E[g] − M``: instability above ``μ``, for any policy).
  The upper bound needs a policy that, without preempting, never leaves the
  queue head waiting while its first chunk would fit in current memory
  (``current-fit`` admission without its preemptions): with a long queue it
  then uses more than ``M − S``, so ``E[ΔV] ≤ λb̄E[g] − M(1 − δ)``.  Policies
  that judge admission on *future* memory (``reserve``, ``lookahead``) do not
  satisfy that premise — their own margin ``Δ`` (``kvstab prove --margin``)
  can be far above ``S`` — and for policies that preempt, the wasted area
  enters the drift too.  Solving each bound for ``λ`` gives the critical rates.
"""

from __future__ import annotations

from functools import cache

import sympy as sp

from kvstab.theory.claims import Claim
from kvstab.theory.moments import eg_covariance, eg_moments
from kvstab.theory.symbols import Eg, Es2, M, S, bbar, cov, lam, shat

__all__ = [
    "mu_expr",
    "delta_expr",
    "guarantee_expr",
    "reserve_limit_expr",
    "lyapunov_cases",
    "drift_upper",
    "drift_lower",
    "critical_rates",
    "foster_lyapunov",
    "sensitivities",
    "stability_claims",
]

#: ``E[(s + o)(n(s) + o)]``: the area the reserve policy sets aside per request
E_reserve = sp.Symbol("E_R", positive=True)
#: per-request quantities of one slot: total area, area served before the slot,
#: memory charged in the slot
_g, _A, _m = sp.symbols("g A m", nonnegative=True)


def mu_expr() -> sp.Expr:
    """``μ = M/(b̄·E[g])`` requests per second."""
    return M / (bbar * Eg)


def delta_expr() -> sp.Expr:
    """``δ = S/M``, ``S = ess sup(s + o)``."""
    return S / M


def guarantee_expr() -> sp.Expr:
    """``μ(1 − δ)``, simplified: ``(M − S)/(b̄·E[g])``."""
    return sp.factor(sp.simplify(mu_expr() * (1 - delta_expr())))


def reserve_limit_expr() -> sp.Expr:
    """The reserve policy's limit ``M/(b̄·E[(s + o)(n(s) + o)])``: each request
    holds its peak ``s + o`` for all its ``n(s) + o`` slots."""
    return M / (bbar * E_reserve)


def lyapunov_cases() -> list[Claim]:
    """``ΔV`` of one request in one slot equals its share of
    ``Σ_arrivals g − used + wasted``, for each thing that can happen to it.

    Each case is bookkeeping under the conventions below (sympy checks the
    arithmetic; there is little of it): what carries weight is that the
    simulator and the z3 encoding follow the conventions, which property 5 of
    the audit and ``kvstab.proofs.lemmas`` check.

    Conventions (the simulator's): a request is charged ``m``, what it holds
    after the slot's work; a preempted request does no work and is charged
    nothing in the slot that preempts it, and the area ``A`` it had been
    served is *wasted* (it must be served again).
    """
    rem = _g - _A  # remaining area of an active request
    return [
        Claim("arrives: V rises by its g", _g - 0, _g),
        Claim("waits: V unchanged", _g - _g, sp.Integer(0)),
        Claim("admitted this slot: V falls by the memory m it is charged", (_g - _m) - _g, -_m),
        Claim("continues: V falls by m", (rem - _m) - rem, -_m),
        Claim(
            "finishes (its last m is all that was left, g − A = m): V falls by m",
            (0 - rem).subs(_g, _A + _m),
            -_m,
            premise="g − A = m",
        ),
        Claim("preempted: V rises by the wasted area A", _g - rem, _A),
    ]


def drift_upper() -> sp.Expr:
    """``λb̄E[g] − M(1 − δ)``: the drift bound with a long queue (work-conserving,
    no preemption)."""
    return lam * bbar * Eg - M * (1 - delta_expr())


def drift_lower() -> sp.Expr:
    """``λb̄E[g] − M``: no policy serves more than ``M`` area per slot."""
    return lam * bbar * Eg - M


def critical_rates() -> dict[str, sp.Expr]:
    """``λ`` where each drift bound vanishes: ``μ`` (instability above) and
    ``μ(1 − δ)`` (stability below), solved by sympy."""
    return dict(_critical_rates())


@cache
def _critical_rates() -> tuple[tuple[str, sp.Expr], ...]:
    (unstable,) = sp.solve(sp.Eq(drift_lower(), 0), lam)
    (stable,) = sp.solve(sp.Eq(drift_upper(), 0), lam)
    return (("instability", sp.simplify(unstable)), ("stability", sp.factor(sp.simplify(stable))))


def foster_lyapunov() -> dict[str, sp.Expr]:
    """The Foster–Lyapunov condition: outside a finite set (queue longer than a
    threshold) ``E[ΔV] ≤ −ε`` with ``ε = M(1 − δ) − λb̄E[g]``, and ``ε > 0``
    exactly when ``λ < μ(1 − δ)``."""
    eps = sp.expand(-drift_upper())
    region = sp.solve(eps > 0, lam)
    # sympy answers `lam < -(-M + S)/(...)`; restate the bound in factored form
    return {"epsilon": eps, "region": sp.Lt(lam, sp.factor(region.rhs))}


def sensitivities(convention: str = "continuous") -> dict[str, sp.Expr]:
    """``∂μ/∂M``, ``∂μ/∂ŝ``, ``∂μ/∂b̄``, ``∂μ/∂Cov(s, o)`` and the elasticities
    ``(x/μ)·∂μ/∂x``, from ``μ = M/(b̄·E[g])`` with ``E[g]`` in moments."""
    return dict(_sensitivities(convention))


@cache
def _sensitivities(convention: str) -> tuple[tuple[str, sp.Expr], ...]:
    eg = eg_covariance(convention)
    mu = M / (bbar * eg)
    out: dict[str, sp.Expr] = {}
    for name, var in (("M", M), ("shat", shat), ("bbar", bbar), ("cov", cov)):
        d = sp.diff(mu, var)
        out[f"d_mu_d_{name}"] = sp.simplify(d)
        if name != "cov":
            out[f"elasticity_{name}"] = sp.simplify(d * var / mu)
    return tuple(out.items())


def stability_claims() -> list[Claim]:
    """Claims about ``μ``, ``δ`` and the drift for sympy to check."""
    crit = critical_rates()
    sens = sensitivities("continuous")
    eg_c = eg_covariance("continuous")
    # the sign of ∂μ/∂ŝ: with E[s·o] > 0 in place of a signed covariance the
    # assumptions decide it (E[g] > 0 either way)
    d_shat = sp.diff(M / (bbar * eg_moments("continuous")), shat)
    return [
        *lyapunov_cases(),
        Claim("instability threshold is μ", crit["instability"], mu_expr()),
        Claim("stability threshold is μ(1 − δ)", crit["stability"], guarantee_expr()),
        Claim("μ(1 − δ) = (M − S)/(b̄E[g])", guarantee_expr(), (M - S) / (bbar * Eg)),
        Claim("Foster–Lyapunov: ε > 0 exactly when λ < μ(1 − δ)", foster_lyapunov()["region"].rhs, guarantee_expr()),
        Claim("elasticity of μ in M is 1", sens["elasticity_M"], sp.Integer(1)),
        Claim("elasticity of μ in b̄ is −1", sens["elasticity_bbar"], sp.Integer(-1)),
        Claim(
            "elasticity of μ in ŝ is E[s²]/(2ŝE[g]) > 0",
            sens["elasticity_shat"],
            Es2 / (2 * shat * eg_covariance("continuous")),
        ),
        Claim("μ rises with ŝ", d_shat, sp.Integer(0), ">"),
        Claim("μ falls with Cov(s, o): ∂μ/∂Cov = −μ/E[g]", sens["d_mu_d_cov"], -(M / (bbar * eg_c)) / eg_c),
    ]
