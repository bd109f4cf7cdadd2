"""Numeric twins of :mod:`kvstab.theory.sharing_lru` (numpy only): the hit below saturation.

:func:`tenant_hits` solves Che's characteristic time ``T`` for a workload whose prompts share
segments (``shared``, ``tenants``, ``fewshot``) at an arrival rate per slot: the free queue's
occupancy ``ΛE[own]·T + Σ P̃_t(1 − r_t)(1 − e^{−Λπ_tT})`` rises strictly in ``T`` from 0 to ∞
(the dead own blocks alone make it unbounded), so ``occupancy(T) = C_free`` has exactly one root
when ``C_free > 0``, found by bisection; ``T = 0`` when ``C_free ≤ 0``.  At and above the memory's
saturated rate (``μ_share·b̄`` of :func:`kvstab.theory.sharing_area.sharing_report`) it returns that
report's fixed point, so the two agree there exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.theory import sharing_area as SA
from kvstab.theory.area import peak_tokens
from kvstab.workload import Workload

__all__ = ["TenantHits", "tenant_hits", "solve_increasing"]


def solve_increasing(f: Callable[[float], float], target: float, iters: int = 200) -> float:
    """The ``x ≥ 0`` with ``f(x) = target`` for ``f`` increasing from ``f(0) ≤ target`` to above it
    (0 when ``f(0) ≥ target``): bracket by doubling, then bisect."""
    if f(0.0) >= target:
        return 0.0
    hi = 1.0
    while f(hi) < target:
        hi *= 2.0
        if hi > 1e15:
            raise InvalidArgument(f"no characteristic time below 1e15 slots reaches {target:g} tokens")
    lo = 0.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True, slots=True)
class TenantHits:
    """The shared segments' hit at one arrival rate, below saturation (Che's approximation)."""

    rate_per_slot: float = field(metadata={"help": "Λ = λb̄, arrivals per slot"})
    saturated_per_slot: float = field(metadata={"help": "μ_share·b̄, the memory's saturated rate"})
    mean_running: float = field(metadata={"help": "N̄ = ΛE[alive] (the saturated N̄ at and above μ_share·b̄)"})
    referenced: float = field(metadata={"help": "Σ P̃_t r_t: tokens of prompts a running request references"})
    free: float = field(metadata={"help": "C_free = M − ΛE[g_h] − Σ P̃_t r_t, tokens (0 at saturation)"})
    own_release: float = field(metadata={"help": "E[own]: tokens of its own blocks a finished request releases"})
    T: float = field(metadata={"help": "Che's characteristic time, slots (0 at saturation)"})
    hit: float = field(metadata={"help": "E[hit tokens]/E[shared tokens]: the expected share of the shared part found"})
    hit_tokens: float = field(metadata={"help": "E[hit tokens] per request, Σ π_t q_t P̃_t"})
    hit_saturated: float = field(metadata={"help": "the same share with T = 0 (only referenced prompts hit)"})
    per_segment: tuple[float, ...] = field(metadata={"help": "q_t of each shared segment (tenant), in law order"})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _own_release(workload: Workload, params: ModelParams, classes: list[tuple[float, int]]) -> float:
    """``E[B⌈(s − h + o)/B⌉]``: the own blocks a request holds at its end (kvstab's lifecycle; vLLM's
    holds one token less, which moves the block count in one case of ``B``)."""
    Bk = params.block
    if workload.s is not None and workload.o is not None:
        total = 0.0
        for p, P in classes:
            for w, piece in SA._past_hit(workload.s, P, Bk):
                total += p * w * SA._expected_last_hold(piece, workload.o, Bk)
        return total
    assert workload.joint_s is not None and workload.joint_o is not None
    js, jo = workload.joint_s, workload.joint_o
    return float(sum(p * peak_tokens(js - SA._hit(js, P, Bk) + jo, Bk).mean() for p, P in classes))


def tenant_hits(workload: Workload, params: ModelParams, rate_per_slot: float, lifecycle: str = "kvstab",
                *, dead_blocks: bool = True) -> TenantHits:
    """The hit of the shared segments at ``rate_per_slot`` arrivals per slot.  ``dead_blocks=False``
    leaves the finished requests' own blocks out of the free queue (the prompts alone fill
    ``C_free``): a variant kept to show how much it overstates ``T``."""
    SA._check(workload, params, lifecycle)
    if not (math.isfinite(rate_per_slot) and rate_per_slot > 0):
        raise InvalidArgument(f"arrival rate per slot must be a finite number > 0, got {rate_per_slot!r}")
    rep = SA.sharing_report(workload, params, lifecycle)
    found = SA._classes(workload, params.block) if workload.prefix is not None else None
    if rep is None or found is None:
        law = "none" if workload.prefix is None else workload.prefix.describe()
        raise InvalidArgument(f"the hit below saturation needs a shared, tenants or fewshot prefix law, got {law}")
    classes, segments = found
    eg, alive, _, _, _ = SA._net_expectation(workload, params, classes, lifecycle)
    pi = np.asarray([p for p, _ in segments], dtype=np.float64)
    tok = np.asarray([t for _, t in segments], dtype=np.float64)
    sat = rep.mu_share_per_slot
    lam = min(rate_per_slot, sat)
    # at and above saturation: the saturated fixed point itself (same N̄, so the same numbers)
    nbar = rep.mean_running if rate_per_slot >= sat else lam * alive
    ref = np.where(pi < 1, 1.0 - (1.0 - pi) ** nbar, 1.0)
    held = float(tok @ ref)
    free = max(params.M - lam * eg - held, 0.0) if rate_per_slot < sat else 0.0
    own = _own_release(workload, params, classes)
    flow = lam * own if dead_blocks else 0.0

    def occupancy(T: float) -> float:
        return flow * T + float(tok @ ((1.0 - ref) * -np.expm1(-lam * pi * T)))

    if free > 0 and not dead_blocks and occupancy(1e15) < free:
        T = math.inf  # the prompts all fit in the free memory: nothing is ever evicted
    else:
        T = solve_increasing(occupancy, free) if free > 0 else 0.0
    q = 1.0 - (1.0 - ref) * (np.exp(-lam * pi * T) if math.isfinite(T) else 0.0)
    base = float(pi @ tok)
    return TenantHits(
        rate_per_slot=rate_per_slot,
        saturated_per_slot=sat,
        mean_running=nbar,
        referenced=held,
        free=free,
        own_release=own,
        T=T,
        hit=float(pi @ (q * tok)) / base if base > 0 else 0.0,
        hit_tokens=float(pi @ (q * tok)),
        hit_saturated=float(pi @ (ref * tok)) / base if base > 0 else 0.0,
        per_segment=tuple(float(x) for x in q),
    )
