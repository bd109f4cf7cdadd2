"""Provisioning: replicas for a load, tensor-parallel groups, and mixtures of workloads.

* Replicas at target utilisation ``ρ``: ``N(λ, ρ) = ⌈λ/(ρ·μ)⌉``; the number
  that *guarantees* stability under the theorem: ``⌈λ/(μ(1 − δ))⌉`` (with
  round-robin or random routing each replica sees ``λ/N``).
* A tensor-parallel group of ``t`` GPUs is one worker with an effective
  capacity and batch time: each GPU keeps ``1/t`` of the weights ``W`` and of
  every token's KV (``κ`` bytes per token in all), so with ``H`` bytes per GPU
  for weights and KV, ``M_t = (t·H − W)/κ``; its ``b̄_t`` is measured.
* A piecewise-stationary mixture (phase ``k`` brings a fraction ``w_k`` of the
  requests, with its own law and ``E_k[g]``): at saturation every slot serves
  ``M`` of area, so the long-run balance ``λ·b̄·Σ_k w_k E_k[g] = M`` gives
  ``μ_mix = M / (b̄·Σ_k w_k E_k[g])``, i.e. ``1/μ_mix = Σ_k w_k/μ_k``.
  Assumptions: the same ``b̄`` in every phase, no area wasted at phase
  changes, and phases long enough for the balance to hold within each (or a
  queue that never empties across them).
"""

from __future__ import annotations

import math

import sympy as sp

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.theory.claims import Claim
from kvstab.theory.stability import mu_expr
from kvstab.theory.symbols import M, S, bbar, lam, rho
from kvstab.validation import MAX_COUNT

__all__ = [
    "replicas_expr",
    "guarantee_replicas_expr",
    "tp_capacity_expr",
    "mixture_mu_expr",
    "replicas",
    "guarantee_replicas",
    "tp_capacity",
    "mixture_mu",
    "provisioning_claims",
]

H, W, kappa = sp.symbols("H W kappa", positive=True)
tp = sp.Symbol("t_p", integer=True, positive=True)
_slack = sp.Symbol("u", positive=True)


def replicas_expr() -> sp.Expr:
    """``⌈λ/(ρ·μ)⌉`` with ``μ = M/(b̄E[g])``."""
    return sp.ceiling(lam / (rho * mu_expr()))


def guarantee_replicas_expr() -> sp.Expr:
    """``⌈λ/(μ(1 − δ))⌉``: replicas that meet the stability theorem's condition."""
    return sp.ceiling(sp.simplify(lam / (mu_expr() * (1 - S / M))))


def tp_capacity_expr() -> sp.Expr:
    """Effective ``M`` of a tensor-parallel group of ``t`` GPUs: ``(t·H − W)/κ``."""
    return (tp * H - W) / kappa


def mixture_mu_expr(phases: int = 2) -> tuple[sp.Expr, list[sp.Symbol], list[sp.Symbol]]:
    """``μ_mix`` solved by sympy from the area balance, with the phases' request
    fractions ``w_k`` and ``E_k[g]``."""
    w = list(sp.symbols(f"w_1:{phases + 1}", positive=True))
    e = list(sp.symbols(f"E_g1:{phases + 1}", positive=True))
    balance = sp.Eq(lam * bbar * sum((wk * ek for wk, ek in zip(w, e)), sp.Integer(0)), M)
    (sol,) = sp.solve(balance, lam)
    return sol, w, e


def provisioning_claims() -> list[Claim]:
    """Identities about provisioning for sympy to check."""
    mix, w, e = mixture_mu_expr(2)
    mus = [M / (bbar * ek) for ek in e]
    return [
        Claim(
            "mixture: 1/μ_mix = Σ w_k/μ_k (request-weighted harmonic mean)",
            1 / mix,
            sum((wk / mk for wk, mk in zip(w, mus)), sp.Integer(0)),
        ),
        Claim(
            "a TP group's capacity per GPU grows with t (d/dt of M_t/t = W/(κt²) > 0)",
            sp.diff(tp_capacity_expr() / tp, tp),
            sp.Integer(0),
            ">",
        ),
        Claim(
            "guarantee replicas ≥ replicas at ρ = 1 (argument of the ceiling)",
            (lam / (mu_expr() * (1 - S / M))).subs(M, S + _slack),
            (lam / mu_expr()).subs(M, S + _slack),
            ">=",
            premise="M = S + u, u > 0",
        ),
    ]


def _check_rate(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _count(ratio: float, what: str) -> int:
    """``⌈ratio⌉`` (at least 1) as a replica count, or one line when no fleet is that large."""
    if not math.isfinite(ratio) or ratio > MAX_COUNT:
        raise InvalidArgument(
            f"{what} = {ratio:g} replicas, more than {MAX_COUNT}: check λ (--lambda), ρ (--rho) and b̄ (--bbar)"
        )
    # 1e-12 absorbs the rounding of λ/(ρμ) when it is an integer in exact arithmetic
    return max(1, math.ceil(ratio - 1e-12))


def replicas(lam_: float, mu_: float, rho_: float = 1.0) -> int:
    """Replicas needed for load ``λ`` at utilisation ``ρ ∈ (0, 1]``: ``⌈λ/(ρμ)⌉``."""
    _check_rate("arrival rate λ", lam_)
    _check_rate("service rate μ", mu_)
    if not (isinstance(rho_, (int, float)) and 0 < rho_ <= 1):
        raise InvalidArgument(f"target utilisation ρ must be in (0, 1], got {rho_!r}")
    return _count(lam_ / (rho_ * mu_), "λ/(ρμ)")


def guarantee_replicas(lam_: float, mu_: float, delta: float) -> int | None:
    """Replicas that satisfy the stability theorem, ``⌈λ/(μ(1 − δ))⌉``; ``None``
    when ``δ ≥ 1`` (a request can fill the memory alone: no guarantee at any
    number of replicas)."""
    _check_rate("arrival rate λ", lam_)
    _check_rate("service rate μ", mu_)
    if delta >= 1:
        return None
    return _count(lam_ / (mu_ * (1 - delta)), "λ/(μ(1 − δ))")


def tp_capacity(hbm_bytes: float, weight_bytes: float, kv_bytes_per_token: float, t: int) -> int:
    """KV tokens of a tensor-parallel group of ``t`` GPUs, ``⌊(t·H − W)/κ⌋``."""
    if not isinstance(t, int) or t < 1:
        raise InvalidArgument(f"tensor-parallel degree t must be an integer >= 1, got {t!r}")
    cap = (t * hbm_bytes - weight_bytes) / kv_bytes_per_token
    if cap < 1:
        raise InvalidArgument(f"weights ({weight_bytes:g} B) fill the {t} GPU(s) of {hbm_bytes:g} B: no room for KV")
    return int(cap)


def mixture_mu(weights: list[float], expected_gs: list[float], params: ModelParams) -> float:
    """``μ_mix = M/(b̄·Σ w_k E_k[g])`` for request fractions ``w_k`` (summing to 1),
    on the server ``params`` (its ``M`` and ``b̄``)."""
    if len(weights) != len(expected_gs) or not weights:
        raise InvalidArgument("a mixture needs one E[g] per phase weight, and at least one phase")
    if any(w < 0 for w in weights) or abs(sum(weights) - 1) > 1e-9:
        raise InvalidArgument(f"mixture weights must be >= 0 and sum to 1, got {weights!r}")
    return params.M / (params.bbar * sum(w * e for w, e in zip(weights, expected_gs)))
