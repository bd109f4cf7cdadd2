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
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix_laws import Conversation
from kvstab.theory import sharing_area as SA
from kvstab.theory.area import lifetime_area, peak_tokens
from kvstab.workload import Workload

__all__ = ["TenantHits", "tenant_hits", "solve_increasing", "ChatHits", "chat_at", "chat_hits", "running_hit", "overlap"]


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


# --- (c) multi-turn conversations --------------------------------------------------------------


def _moments_to(c: npt.NDArray[np.float64], th: float) -> tuple[npt.NDArray[np.float64], ...]:
    """``∫_0^c a^k e^{−a/θ}/θ da`` for ``k = 0, 1, 2``."""
    e = np.exp(-c / th)
    return 1.0 - e, th - (c + th) * e, 2 * th**2 - (c**2 + 2 * c * th + 2 * th**2) * e


def running_hit(S: npt.NDArray[np.float64], h0: npt.NDArray[np.float64], c: npt.NDArray[np.float64],
                D: npt.NDArray[np.float64], th: float, block: int) -> npt.NDArray[np.float64]:
    """Numeric twin of :func:`kvstab.theory.sharing_lru.chat_running_hit_expr`: ``E[x(A); A < D]``."""
    c0, c1, _ = _moments_to(c, th)
    d0, d1, _ = _moments_to(D, th)
    k = (S - h0) / c
    pre = h0 * c0 + k * c1
    dec = (S - c) * (d0 - c0) + (d1 - c1)
    return pre + dec - (block - 1) / 2 * d0


def overlap(S: npt.NDArray[np.float64], h0: npt.NDArray[np.float64], c: npt.NDArray[np.float64],
            D: npt.NDArray[np.float64], th: float) -> npt.NDArray[np.float64]:
    """Numeric twin of :func:`kvstab.theory.sharing_lru.chat_overlap_expr`: ``E[x(A)(D − A); A < D]``."""
    c0, c1, c2 = _moments_to(c, th)
    d0, d1, d2 = _moments_to(D, th)
    k = (S - h0) / c
    pre = h0 * D * c0 + (k * D - h0) * c1 - k * c2
    u = S - c
    dec = u * D * (d0 - c0) + (D - u) * (d1 - c1) - (d2 - c2)
    return pre + dec


@dataclass(frozen=True, slots=True)
class _Turns:
    """Every request of conversations drawn with seed 0 (as the workload's request law is)."""

    s: npt.NDArray[np.int64]
    o: npt.NDArray[np.int64]
    turn: npt.NDArray[np.int64]
    last: npt.NDArray[np.bool_]


def _turns(law: Conversation, requests: int = 20_000) -> _Turns:
    rng = np.random.default_rng(0)
    d = law.draw(rng, max(1, math.ceil(requests / max(law.mean_turns, 1.0))))
    last = np.ones(d.turn.size, dtype=bool)
    last[:-1] = d.turn[1:] == 0
    return _Turns(d.s, d.o, d.turn, last)


@dataclass(frozen=True, slots=True)
class ChatHits:
    """A conversation law's hits, area and occupancy at one characteristic time ``T``."""

    T: float = field(metadata={"help": "Che's characteristic time, slots (0 at saturation)"})
    hit_tokens: float = field(metadata={"help": "E[h]: prompt tokens found cached per request"})
    prompt_tokens: float = field(metadata={"help": "E[s]: prompt tokens per request"})
    p_running: float = field(metadata={"help": "share of requests whose predecessor still runs at arrival"})
    p_cached: float = field(metadata={"help": "share whose finished predecessor is still cached"})
    E_g_net: float = field(metadata={"help": "E[g(s − h, o)], the area net of the hit"})
    held: float = field(metadata={"help": "E[h·alive − overlap]: the hit's area the request holds itself"})
    alive: float = field(metadata={"help": "E[slots alive]"})
    work: float = field(metadata={"help": "E[tokens computed]"})
    occupancy: float = field(metadata={"help": "E[token-slots its released chain spends in the free queue]"})
    upper_area: float = field(metadata={"help": "E[g⁻(s − ĥ, o)], ĥ the predecessor's written full blocks"})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def chat_at(law: Conversation, params: ModelParams, T: float, lifecycle: str = "kvstab",
            turns: _Turns | None = None) -> ChatHits:
    """Hits, area and free-queue occupancy of the conversation law at characteristic time ``T``
    (mean field: each turn's prefill and alive time from its predecessor's *expected* hit)."""
    d = turns if turns is not None else _turns(law)
    Bk, ch = params.block, params.chunk
    vllm = lifecycle == "vllm"
    th = max(law.think / params.bbar, 1e-9)  # think time in slots (0: the next turn comes at once)
    s = d.s.astype(np.float64)
    oe = (d.o - 1 if vllm else d.o).astype(np.float64)  # decode steps
    L = (Bk * ((d.s + d.o - (1 if vllm else 0)) // Bk)).astype(np.float64)  # full blocks written at the end
    n = s.size
    h = np.zeros(n)
    pr = np.zeros(n)
    pc = np.zeros(n)
    xr = np.zeros(n)  # E[x(A); A < D] of the request's own arrival
    ov = np.zeros(n)
    c = np.ceil(s / ch)
    for k in range(1, int(d.turn.max(initial=0)) + 1):
        i = np.flatnonzero(d.turn == k)
        p = i - 1  # its predecessor: draws are in conversation, then turn, order
        D = c[p] + oe[p]
        run = running_hit(s[p], h[p], c[p], D, th, Bk)
        e_D = np.exp(-D / th)
        pr[i] = 1.0 - e_D
        pc[i] = e_D * -np.expm1(-T / th)
        xr[i] = run
        h[i] = np.minimum(run + L[p] * pc[i], Bk * ((s[i] - 1) // Bk))
        ov[i] = overlap(s[p], h[p], c[p], D, th)
        c[i] = np.maximum(np.ceil((s[i] - h[i]) / ch), 1.0)
    alive = c + oe
    g_of = _chat_area(d, params, vllm)
    # the area net of the hit, mixed over miss, cached (h = L of the predecessor) and running (its mean)
    prev_L = np.concatenate(([0.0], L[:-1])) * (d.turn > 0)
    x_mean = np.divide(xr, pr, out=np.zeros(n), where=pr > 0)
    pm = 1.0 - pr - pc
    eg = pm * g_of(np.zeros(n)) + pc * g_of(prev_L) + pr * g_of(x_mean)
    held = pc * prev_L * _alive(s, prev_L, ch, oe) + pr * x_mean * _alive(s, x_mean, ch, oe) - ov
    # the released chain in the free queue: until the next turn takes it (memoryless), else T
    nxt_pr = np.concatenate((pr[1:], [0.0]))
    nxt_run = np.concatenate((xr[1:], [0.0]))
    D_all = alive
    after = L * np.exp(-D_all / th) * th * -np.expm1(-T / th) + (L * nxt_pr - nxt_run) * T
    occ = np.where(d.last, Bk * np.ceil((s + oe) / Bk) * T, after)
    u = np.maximum(s - Bk * (np.minimum(prev_L, s - 1) // Bk), 1).astype(np.int64)
    upper = SA._backward(u, oe.astype(np.int64), ch)
    return ChatHits(T=T, hit_tokens=float(h.mean()), prompt_tokens=float(s.mean()), p_running=float(pr.mean()),
                    p_cached=float(pc.mean()), E_g_net=float(eg.mean()), held=float(held.mean()),
                    alive=float(alive.mean()), work=float((s - h + oe).mean()), occupancy=float(occ.mean()),
                    upper_area=float(upper.mean()))


def _alive(s: npt.NDArray[np.float64], h: npt.NDArray[np.float64], chunk: int,
           oe: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.maximum(np.ceil((s - h) / chunk), 1.0) + oe


def _chat_area(d: _Turns, params: ModelParams, vllm: bool) -> Callable[[npt.NDArray[np.float64]],
                                                                        npt.NDArray[np.float64]]:
    """``h ↦ g(s − h, o)`` per request (block-rounded ``h``; vLLM's lifecycle drops the last hold)."""

    def g_of(hit: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        hb = params.block * (np.minimum(hit, d.s - 1) // params.block)
        u = (d.s - hb).astype(np.int64)
        g = lifetime_area(u, d.o, params).astype(np.float64)
        return g - peak_tokens(u + d.o, params.block) if vllm else g

    return g_of


def chat_hits(workload: Workload, params: ModelParams, rate_per_slot: float | None,
              lifecycle: str = "kvstab") -> ChatHits:
    """The conversation law's hits at ``rate_per_slot`` arrivals per slot (``None``: saturation, ``T = 0``).
    ``T`` solves ``Λ·occupancy(T) = M − Λ·E[area held](T)`` by bisection; the left side rises from 0
    without bound and the area falls only by the prefill a cached hit saves, less than the
    occupancy gains while ``θ`` exceeds half a history's prefill slots (the root is then unique)."""
    SA._check(workload, params, lifecycle)
    law = workload.prefix
    if not isinstance(law, Conversation):
        raise InvalidArgument("chat_hits needs a prefix=chat(K,T) workload")
    d = _turns(law)
    sat = chat_at(law, params, 0.0, lifecycle, d)
    sat_rate = params.M / (sat.E_g_net + sat.held)
    if rate_per_slot is None or rate_per_slot >= sat_rate:
        return sat
    if not (math.isfinite(rate_per_slot) and rate_per_slot > 0):
        raise InvalidArgument(f"arrival rate per slot must be a finite number > 0, got {rate_per_slot!r}")

    def used(T: float) -> float:
        r = chat_at(law, params, T, lifecycle, d)
        return rate_per_slot * (r.occupancy + r.E_g_net + r.held)

    T = solve_increasing(used, float(params.M), iters=40)
    return chat_at(law, params, T, lifecycle, d)


def chat_report(workload: Workload, params: ModelParams, lifecycle: str = "kvstab") -> SA.SharingReport:
    """:class:`~kvstab.theory.sharing_area.SharingReport` of a conversation law at saturation
    (``T = 0``: only a still-running predecessor is hit).  ``E_g_net = E[g(s − h, o)]``; the hit's
    area a turn holds itself, ``E[h·alive − overlap]`` per request, is ``H`` per slot at the
    saturated rate, so ``(M − H)/E[g_h]`` is ``M/(E[g_h] + E[h·alive − overlap])``."""
    law = workload.prefix
    assert isinstance(law, Conversation)
    sat = chat_hits(workload, params, None, lifecycle)
    mu_slot = params.M / (sat.E_g_net + sat.held)
    held = mu_slot * sat.held
    eg_paper = SA._net_expectation(workload, params, [(1.0, 0)], lifecycle)[0]
    assert workload.joint_s is not None and workload.joint_o is not None
    top = int(peak_tokens(workload.joint_s + workload.joint_o, params.block).max())  # a turn may miss: all of it
    seq_cap = params.max_num_seqs / sat.alive if params.max_num_seqs is not None else None
    token_cap = params.token_budget / sat.work if params.token_budget is not None else None
    limits = {"memory": mu_slot, "max_num_seqs": seq_cap, "token budget": token_cap}
    binding = min((k_ for k_, v_ in limits.items() if v_ is not None), key=lambda k_: limits[k_] or 0.0)
    delta = top / (params.M - held) if params.M > held else None
    guarantee = (params.M - held - top) / (params.bbar * sat.E_g_net) if delta is not None and delta < 1 else None
    return SA.SharingReport(
        law=law.describe(), lifecycle=lifecycle, E_g=eg_paper, E_g_net=sat.E_g_net, held_once=held,
        held_once_all=0, mean_running=mu_slot * sat.alive, mu_per_slot=params.M / eg_paper,
        mu_share_per_slot=mu_slot, mu_share_per_s=mu_slot / params.bbar, gain=mu_slot * eg_paper / params.M,
        ess_sup_net=top, delta_share=delta, guarantee_share_per_s=guarantee,
        upper_per_slot=params.M / sat.upper_area, seq_limit_per_slot=seq_cap, token_limit_per_slot=token_cap,
        binding=binding, predicted_per_slot=float(limits[binding] or 0.0),
    )
