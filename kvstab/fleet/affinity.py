"""The condition affinity routing adds to a fleet's stability, in sympy.

A size-blind router that can move any request anywhere (JSQ) keeps a fleet of
replicas with rates ``μ_i`` stable up to ``Σ μ_i`` (``kvstab.theory.fleet``).  An
affinity router does not: it sends every request of a **class** — the requests
whose prompts start with one prefix, e.g. one tenant's system prompt — to the
replica that holds that prefix.  With class ``c`` taking a share ``q_c`` of the
arrivals and sent to replica ``r(c)``, replica ``i`` sees a Poisson stream of rate
``λ·L_i``, ``L_i = Σ_{c: r(c)=i} q_c`` (a static split by content), and the
fleet is stable only if every replica keeps up with its own classes::

    λ·L_i < μ_i  for every i,    i.e.   λ < λ*_aff = min_i μ_i / L_i  ≤  Σ μ_i,

with equality only when the loads are proportional to the rates (``L ∝ μ``).
A hot class alone on replica ``h`` caps the fleet at ``μ_h/q_hot`` whatever the
others could take: ``N`` equal replicas with a hot share ``q ≥ 1/N`` lose
``1 − 1/(N·q)`` of ``Σ μ``.

``μ_i`` is the replica's rate for the requests it receives; with prefix caching
the shared prefix makes it larger than the no-sharing formula, and it is then
the measured rate of the replica alone that belongs here.  A router with a load
cap (``prefix-affinity``'s ``cap``, the SGLang router's balance threshold)
breaks the fixed map ``r`` when a replica's queue runs long, and so escapes the
condition; pure affinity (``prefix-affinity:queue=0,kv=0,cap=inf``) and
``consistent-hash`` do not.  ``tests/fleet/test_fleet_affinity.py`` checks the
condition against simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import numpy.typing as npt
import sympy as sp

from kvstab.errors import InvalidArgument

__all__ = [
    "affinity_symbols",
    "affinity_condition",
    "affinity_critical",
    "hot_class_loss",
    "class_loads",
    "affinity_critical_rate",
]


@cache
def _symbols(n: int) -> tuple[sp.Symbol, tuple[sp.Symbol, ...], tuple[sp.Symbol, ...]]:
    lam = sp.Symbol("lambda", positive=True)
    mus = sp.symbols(f"mu_0:{n}", positive=True)
    loads = sp.symbols(f"L_0:{n}", nonnegative=True)
    return lam, tuple(mus), tuple(loads)


def affinity_symbols(n: int) -> tuple[sp.Symbol, tuple[sp.Symbol, ...], tuple[sp.Symbol, ...]]:
    """``(λ, (μ_0 … μ_{n−1}), (L_0 … L_{n−1}))``, the symbols of :func:`affinity_condition`
    and :func:`affinity_critical` (rates positive, loads non-negative)."""
    return _symbols(_replicas(n))


def affinity_condition(n: int) -> sp.Basic:
    """``⋀_i λ·L_i < μ_i``: stability of ``n`` replicas under a fixed class→replica map
    (symbols ``lambda``, ``mu_i``, ``L_i``)."""
    lam, mus, loads = _symbols(_replicas(n))
    return sp.And(*[lam * L < mu for mu, L in zip(mus, loads)])


def affinity_critical(n: int) -> sp.Expr:
    """``λ*_aff = min_i μ_i/L_i`` (symbols as :func:`affinity_condition`; a replica with
    ``L_i = 0`` sets no limit, so substitute only the loaded ones or drop them)."""
    _, mus, loads = _symbols(_replicas(n))
    return sp.Min(*[mu / L for mu, L in zip(mus, loads)])


def hot_class_loss(n: int) -> sp.Expr:
    """The share of ``Σμ`` lost by ``n`` replicas of rate ``μ`` when a class of share ``q``
    (``1/n ≤ q ≤ 1``) sits alone on one of them and the rest spread evenly over the others:
    ``1 − 1/(n·q)`` (symbol ``q``).  The hot replica binds: ``μ/q ≤ μ(n − 1)/(1 − q)`` iff
    ``q ≥ 1/n``."""
    n = _replicas(n)
    q = sp.Symbol("q", positive=True)
    mu = sp.Symbol("mu", positive=True)
    return sp.simplify(1 - (mu / q) / (n * mu))


def _replicas(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"the number of replicas must be a positive integer, got {n!r}")
    return n


def class_loads(shares: npt.ArrayLike, placement: Sequence[int], replicas: int) -> npt.NDArray[np.float64]:
    """``L_i = Σ_{c: r(c)=i} q_c``: each replica's share of the arrivals when class ``c``
    (share ``shares[c]``) goes to replica ``placement[c]``."""
    q = np.asarray(shares, dtype=np.float64)
    r = np.asarray(placement, dtype=np.int64)
    if q.shape != r.shape or q.ndim != 1 or np.any(q < 0) or not np.isclose(q.sum(), 1.0):
        raise InvalidArgument("class shares must be one non-negative share per class, summing to 1")
    if r.size and (r.min() < 0 or r.max() >= replicas):
        raise InvalidArgument(f"a class is placed outside the {replicas} replicas")
    return np.bincount(r, weights=q, minlength=replicas).astype(np.float64)


def affinity_critical_rate(mus: npt.ArrayLike, loads: npt.ArrayLike) -> float:
    """:func:`affinity_critical` at the rates ``mus`` and loads ``loads`` (replicas with no load dropped)."""
    m = np.asarray(mus, dtype=np.float64)
    L = np.asarray(loads, dtype=np.float64)
    if m.shape != L.shape or m.ndim != 1 or np.any(m <= 0) or np.any(L < 0) or not np.any(L > 0):
        raise InvalidArgument("affinity_critical_rate needs one positive μ_i and one load L_i ≥ 0 per replica")
    used = np.flatnonzero(L > 0)
    _, mu_s, L_s = _symbols(int(used.size))
    expr = affinity_critical(int(used.size))
    value = expr.subs({**dict(zip(mu_s, m[used].tolist())), **dict(zip(L_s, L[used].tolist()))})
    return float(value)
