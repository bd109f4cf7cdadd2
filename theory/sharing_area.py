"""Numeric twins of :mod:`kvstab.theory.sharing`: ``E[g_h]``, ``μ_share``, ``δ_share``, the ceilings
and the any-policy bound for a workload with a prefix law, exactly (no sampling) and without sympy.

``E[g_h] = E[g(s − h, o)]`` is the paper's ``E[g]`` (:func:`kvstab.theory.area.expected_g`) on the
law of ``s − h`` (a uniform ``s`` shifts to a uniform; the point ``s = P``, whose whole-prompt hit
recomputes a block, is split off).  Call :func:`sharing_report` for everything, :func:`mu_share`
for the rate alone (what a fleet planner needs).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix_laws import Conversation, FewShot, Shared, Tenants, zipf_weights
from kvstab.theory.area import expected_g, lifetime_area, peak_tokens, workload_moments
from kvstab.theory.laws import circular_convolve, law_of, residues, rounding
from kvstab.workload import Fixed, LengthDist, Uniform, Workload

__all__ = ["SharingReport", "sharing_report", "mu_share", "upper_bound_per_slot"]


@dataclass(frozen=True, slots=True)
class _Weighted:
    """A length law given by its support points and weights (the law of ``s − h``)."""

    values: tuple[int, ...]
    weights: tuple[float, ...]

    def sample(self, rng: np.random.Generator, n_: int) -> npt.NDArray[np.int64]:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n_, p=np.asarray(self.weights))

    def support(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        return np.asarray(self.values, dtype=np.int64), np.asarray(self.weights, dtype=np.float64)

    @property
    def max(self) -> int:
        return max(self.values)

    @property
    def min(self) -> int:
        return min(self.values)

    def describe(self) -> str:
        return "points"


def _hit(s_: npt.NDArray[np.int64], P: int, block: int) -> npt.NDArray[np.int64]:
    """``B·⌊min(P, s − 1)/B⌋`` (numpy twin of :func:`kvstab.theory.sharing.hit_expr`)."""
    return block * (np.minimum(P, s_ - 1) // block)


def _past_hit(dist: LengthDist, P: int, block: int) -> list[tuple[float, LengthDist]]:
    """The law of ``s − h(s)`` as weighted pieces, each a law ``expected_g`` sums in closed form."""
    hb = block * (P // block)
    if isinstance(dist, Fixed):
        return [(1.0, Fixed(int(dist.value - _hit(np.array([dist.value]), P, block)[0])))]
    if isinstance(dist, Uniform) and dist.a > P:
        return [(1.0, Uniform(dist.a - hb, dist.b - hb))]
    if isinstance(dist, Uniform) and dist.a == P:
        span = dist.b - dist.a + 1
        point = Fixed(int(P - _hit(np.array([P]), P, block)[0]))
        rest: list[tuple[float, LengthDist]] = [((span - 1) / span, Uniform(P + 1 - hb, dist.b - hb))] if span > 1 else []
        return [(1.0 / span, point), *rest]
    v, w = dist.support()
    shifted = v - _hit(v, P, block)
    vals, inv = np.unique(shifted, return_inverse=True)
    wts = np.bincount(inv, weights=w)
    return [(1.0, _Weighted(tuple(int(x) for x in vals), tuple(float(x) for x in wts)))]


def _expected_last_hold(s_law: LengthDist, o_law: LengthDist, block: int) -> float:
    """``E[B⌈(s + o)/B⌉]`` for independent ``s`` and ``o``: the step vLLM's lifecycle saves."""
    ls, lo = law_of(s_law), law_of(o_law)
    ps, m1s = residues(ls, block)
    po, m1o = residues(lo, block)
    mean = float(m1s.sum() + m1o.sum())
    if block == 1:
        return mean
    return mean + float(rounding(block, block) @ circular_convolve(ps, po))


def _net_area(s_law: LengthDist, o_law: LengthDist, params: ModelParams,
              lifecycle: str) -> tuple[float, float, float]:
    """``(E[g_h], E[slots alive], E[tokens computed])`` of requests whose prompt past the hit has law ``s_law``."""
    w = Workload(s=s_law, o=o_law, name="past the hit")
    eg = expected_g(w, params)
    m = workload_moments(w, params.chunk)
    alive = m.En + m.Eo
    work = m.Es + m.Eo
    if lifecycle == "vllm":
        eg -= _expected_last_hold(s_law, o_law, params.block)
        alive -= 1.0
        work -= 1.0
    return eg, alive, work


def _classes(workload: Workload, block: int) -> tuple[list[tuple[float, int]], list[tuple[float, int]]] | None:
    """The hit classes ``(probability, prompt tokens P)`` of the law, and the shared segments
    ``(probability a request references it, tokens held once)``; ``None`` for laws with no closed form here."""
    law = workload.prefix
    if isinstance(law, Shared):
        return [(1.0, law.P)], [(1.0, block * (law.P // block))]
    if isinstance(law, Tenants):
        pi = zipf_weights(law.n, law.a)
        cls = [(float(p), int(sz)) for p, sz in zip(pi, law.sizes, strict=True)]
        return cls, [(float(p), block * (int(sz) // block)) for p, sz in zip(pi, law.sizes, strict=True)]
    if isinstance(law, FewShot):
        pi = zipf_weights(law.n, law.a)
        total = law.H + law.E
        header = block * (law.H // block)
        # a template's chain holds the header's full blocks (shared by all templates) and its own past them
        own = block * (total // block) - header
        return [(float(p), total) for p in pi], [(1.0, header)] + [(float(p), own) for p in pi]
    return None


@dataclass(frozen=True, slots=True)
class SharingReport:
    """``μ`` with a shared prompt held once, beside the paper's, for one workload and server."""

    law: str = field(metadata={"help": "the prefix law (shared(P), tenants(…), fewshot(…))"})
    lifecycle: str = field(metadata={"help": "'kvstab' or 'vllm' (vLLM's: o − 1 decode steps)"})
    E_g: float = field(metadata={"help": "the paper's E[g] (each request charged its whole prompt)"})
    E_g_net: float = field(metadata={"help": "E[g_h]: the area net of the shared part, token-slots"})
    held_once: float = field(metadata={"help": "H: tokens of the shared part held once (expected, referenced)"})
    held_once_all: int = field(metadata={"help": "every shared segment's full blocks, in tokens (all referenced)"})
    mean_running: float = field(metadata={"help": "N̄ = μ_share·E[slots alive] (Little's law), requests"})
    mu_per_slot: float = field(metadata={"help": "the paper's μ·b̄ = M/E[g]"})
    mu_share_per_slot: float = field(metadata={"help": "μ_share·b̄ = (M − H)/E[g_h], requests per slot"})
    mu_share_per_s: float = field(metadata={"help": "μ_share = (M − H)/(b̄·E[g_h]), requests per second"})
    gain: float = field(metadata={"help": "μ_share/μ"})
    ess_sup_net: int = field(metadata={"help": "S_h = ess sup B⌈(s + o − h)/B⌉"})
    delta_share: float | None = field(metadata={"help": "δ_share = S_h/(M − H); None when H ≥ M"})
    guarantee_share_per_s: float | None = field(metadata={"help": "μ_share(1 − δ_share); None when δ_share ≥ 1"})
    upper_per_slot: float | None = field(
        metadata={"help": "any policy: M/E[g⁻(s − h, o)] (backward area, B = 1); None if its support is too large to list"}
    )

    seq_limit_per_slot: float | None = field(
        default=None, metadata={"help": "max_num_seqs/E[slots alive] (Little's law); None without a cap"})
    token_limit_per_slot: float | None = field(
        default=None, metadata={"help": "token_budget/E[tokens computed past the hit]; None without a budget"})
    binding: str = field(default="memory", metadata={"help": "the least ceiling: memory, max_num_seqs or token budget"})
    predicted_per_slot: float = field(default=0.0, metadata={"help": "the saturated rate predicted: the least ceiling"})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (no NaN: every field is finite or ``None``)."""
        return asdict(self)


def _check(workload: Workload, params: ModelParams, lifecycle: str) -> None:
    if lifecycle not in ("kvstab", "vllm"):
        raise InvalidArgument(f"lifecycle must be 'kvstab' or 'vllm', got {lifecycle!r}")
    if params.g == "continuous" and params.block != 1:
        raise InvalidArgument("the continuous g convention has no block-granular form; use g='exact' with B > 1")


def _net_expectation(workload: Workload, params: ModelParams, classes: list[tuple[float, int]],
                     lifecycle: str) -> tuple[float, float, float, int, float]:
    """``(E[g_h], E[slots alive], E[tokens computed], S_h, E[backward area])`` over the hit classes."""
    Bk = params.block
    eg = alive = work = lower = 0.0
    top = 0
    if workload.s is not None and workload.o is not None:
        o_law = workload.o
        for p, P in classes:
            for w, piece in _past_hit(workload.s, P, Bk):
                g_, a_, k_ = _net_area(piece, o_law, params, lifecycle)
                eg += p * w * g_
                alive += p * w * a_
                work += p * w * k_
                try:
                    lower += p * w * _backward_mean(piece, o_law, params.chunk, lifecycle)
                except InvalidArgument:
                    lower = math.nan  # a support too large to list: the bound is not computed
                top = max(top, int(peak_tokens(piece.max + o_law.max, Bk)))
        return eg, alive, work, top, lower
    assert workload.joint_s is not None and workload.joint_o is not None
    js, jo = workload.joint_s, workload.joint_o
    for p, P in classes:
        sp_ = js - _hit(js, P, Bk)
        gv_ = lifetime_area(sp_, jo, params)
        n_ = -(-sp_ // params.chunk)
        av_ = (n_ + jo).astype(np.float64)
        oo = jo
        kv_ = (sp_ + jo).astype(np.float64)
        if lifecycle == "vllm":
            kv_ = kv_ - 1
            gv_ = gv_ - peak_tokens(sp_ + jo, Bk)
            av_ = av_ - 1
            oo = jo - 1
        eg += p * float(gv_.mean())
        alive += p * float(av_.mean())
        work += p * float(kv_.mean())
        lower += p * float(_backward(sp_, oo, params.chunk).mean())
        top = max(top, int(peak_tokens(sp_ + jo, Bk).max()))
    return eg, alive, work, top, lower


def _backward(u_: npt.NDArray[np.int64], o_: npt.NDArray[np.int64], chunk: int) -> npt.NDArray[np.float64]:
    """Numeric twin of :func:`kvstab.theory.sharing.backward_area_expr` (``o`` may be 0)."""
    uf, of = u_.astype(np.float64), o_.astype(np.float64)
    nf = np.ceil(uf / chunk)
    return nf * uf - chunk * nf * (nf - 1) / 2 + uf * of + of * (of + 1) / 2


def _backward_mean(s_law: LengthDist, o_law: LengthDist, chunk: int, lifecycle: str) -> float:
    """``E[g⁻(s', o)]`` for independent laws: the backward area is linear in ``o`` and ``o²``."""
    vs, ws = s_law.support()
    mo = workload_moments(Workload(s=Fixed(1), o=o_law), chunk)
    Eo_, Eo2_ = mo.Eo, mo.Eo2
    if lifecycle == "vllm":
        Eo_, Eo2_ = Eo_ - 1, Eo2_ - 2 * Eo_ + 1
    uf = vs.astype(np.float64)
    nf = np.ceil(uf / chunk)
    pre = float(ws @ (nf * uf - chunk * nf * (nf - 1) / 2))
    return pre + float(ws @ uf) * Eo_ + (Eo2_ + Eo_) / 2


def sharing_report(workload: Workload, params: ModelParams, lifecycle: str = "kvstab") -> SharingReport | None:
    """``μ_share``, ``δ_share`` and the any-policy upper bound for a workload with a prefix law
    (``shared``, ``tenants``, ``fewshot``); ``None`` when it has none, or for ``chat``: the
    conversation form (:func:`kvstab.theory.sharing_lru_area.chat_report`) is a mean-field
    estimate 4–16 % above the measured saturated rate (docs/theory.md, (c)), so it does not
    feed what plans and guarantees read (``kvstab mu`` prints it as an estimate)."""
    _check(workload, params, lifecycle)
    if workload.prefix is None or isinstance(workload.prefix, Conversation):
        return None
    found = _classes(workload, params.block)
    if found is None:
        return None
    classes, segments = found
    eg_net, alive, work, top, lower = _net_expectation(workload, params, classes, lifecycle)
    eg_paper = expected_g(workload, params)
    if lifecycle == "vllm":
        # the paper's E[g] under the same lifecycle, so the two μ compare like for like
        eg_paper = _net_expectation(workload, params, [(1.0, 0)], lifecycle)[0]
    held_all = int(sum(tok for _, tok in segments))
    # premise (iii): a segment is held in a slot when one of the N̄ running requests references it,
    # and N̄ = μ_share·E[alive] depends on H: N̄ solves N̄ = E[alive]·(M − H(N̄))/E[g_h], whose right
    # side falls as N̄ rises (H rises), so the root is unique; bisection finds it
    cap = float(params.max_num_seqs) if params.max_num_seqs is not None else math.inf

    def held_at(nb: float) -> float:
        return float(sum(tok * (1.0 - (1.0 - p) ** nb) if p < 1 else tok for p, tok in segments))

    def running(nb: float) -> float:
        return min(max(params.M - held_at(nb), 0.0) / eg_net * alive, cap)  # the cap binds first

    lo_n, hi_n = 0.0, max(running(0.0), 1e-12)
    for _ in range(200):
        mid = 0.5 * (lo_n + hi_n)
        if running(mid) > mid:
            lo_n = mid
        else:
            hi_n = mid
    nbar = 0.5 * (lo_n + hi_n)
    held = held_at(nbar)
    mu_slot = max(params.M - held, 0.0) / eg_net
    seq_cap = params.max_num_seqs / alive if params.max_num_seqs is not None else None
    token_cap = params.token_budget / work if params.token_budget is not None else None
    limits = {"memory": mu_slot, "max_num_seqs": seq_cap, "token budget": token_cap}
    binding = min((k_ for k_, v_ in limits.items() if v_ is not None), key=lambda k_: limits[k_] or 0.0)
    delta = top / (params.M - held) if params.M > held else None
    guarantee = (params.M - held - top) / (params.bbar * eg_net) if delta is not None and delta < 1 else None
    return SharingReport(
        law=workload.prefix.describe(),
        lifecycle=lifecycle,
        E_g=eg_paper,
        E_g_net=eg_net,
        held_once=held,
        held_once_all=held_all,
        mean_running=nbar,
        mu_per_slot=params.M / eg_paper,
        mu_share_per_slot=mu_slot,
        mu_share_per_s=mu_slot / params.bbar,
        gain=mu_slot * eg_paper / params.M,
        ess_sup_net=top,
        delta_share=delta,
        guarantee_share_per_s=guarantee,
        upper_per_slot=params.M / lower if math.isfinite(lower) else None,
        seq_limit_per_slot=seq_cap,
        token_limit_per_slot=token_cap,
        binding=binding,
        predicted_per_slot=float(limits[binding] or 0.0),
    )


def mu_share(workload: Workload, params: ModelParams, lifecycle: str = "kvstab") -> float | None:
    """``μ_share`` in requests per second, or ``None`` when the workload has no prefix law with a
    closed form here.  The function the fleet ``plan`` calls to size a fleet with sharing."""
    rep = sharing_report(workload, params, lifecycle)
    return None if rep is None else rep.mu_share_per_s


def upper_bound_per_slot(workload: Workload, params: ModelParams, lifecycle: str = "kvstab") -> float | None:
    """The any-policy bound (d): completions per slot ``≤ M/E[g⁻(s − ĥ, o)]``."""
    rep = sharing_report(workload, params, lifecycle)
    return None if rep is None else rep.upper_per_slot
