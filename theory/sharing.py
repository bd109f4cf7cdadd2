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

Three premises, each named where it is used: (i) the shared prompts stay cached
(the pool is large enough never to evict a referenced tenant's prompt: true for
one prompt, and for tenants whose prompts together fit); (ii) under
saturation the running set is never empty, so the shared part is referenced
every slot; (iii) for tenants, a prompt is referenced in a slot when one of the
``N̄`` running requests belongs to its tenant, with independent tenant draws:
probability ``1 − (1 − π_t)^N̄`` (Little's law gives ``N̄``).

The numeric twins here evaluate ``E[g_h]`` exactly with the same code as the
paper's ``E[g]`` (:func:`kvstab.theory.area.expected_g`), on the law of
``s − h``: no sampling.  The lifecycle matters by one step: under vLLM's
(``lifecycle="vllm"``) the first output token comes with the last prefill
chunk, so a request of ``o`` outputs has ``o − 1`` decode steps and its area
is ``g(s − h, o) − B⌈(s − h + o)/B⌉``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
import sympy as sp

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix_laws import FewShot, Shared, Tenants, zipf_weights
from kvstab.theory.area import expected_g, lifetime_area, peak_tokens, workload_moments
from kvstab.theory.claims import Claim
from kvstab.theory.g import g_continuous_expr, g_exact_expr
from kvstab.theory.laws import circular_convolve, law_of, residues, rounding
from kvstab.theory.moments import eg_moments
from kvstab.theory.symbols import B, Eo, Es, Es2, Eso, M, bbar, j, k, lam, n, o, s, shat
from kvstab.workload import Fixed, LengthDist, Uniform, Workload

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
    "SharingReport",
    "sharing_report",
    "mu_share",
    "upper_bound_per_slot",
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


# --- numeric --------------------------------------------------------------------------


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
    """``B·⌊min(P, s − 1)/B⌋`` (numpy twin of :func:`hit_expr`)."""
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
        g_ = lifetime_area(sp_, jo, params)
        n_ = -(-sp_ // params.chunk)
        a_ = (n_ + jo).astype(np.float64)
        oo = jo
        k_ = (sp_ + jo).astype(np.float64)
        if lifecycle == "vllm":
            k_ = k_ - 1
            g_ = g_ - peak_tokens(sp_ + jo, Bk)
            a_ = a_ - 1
            oo = jo - 1
        eg += p * float(g_.mean())
        alive += p * float(a_.mean())
        work += p * float(k_.mean())
        lower += p * float(_backward(sp_, oo, params.chunk).mean())
        top = max(top, int(peak_tokens(sp_ + jo, Bk).max()))
    return eg, alive, work, top, lower


def _backward(u_: npt.NDArray[np.int64], o_: npt.NDArray[np.int64], chunk: int) -> npt.NDArray[np.float64]:
    """Numeric twin of :func:`backward_area_expr` (``o`` may be 0)."""
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
    (``shared``, ``tenants``, ``fewshot``); ``None`` when it has none or its law has no closed
    form here (``chat``: a conversation's hits depend on think time and load)."""
    _check(workload, params, lifecycle)
    if workload.prefix is None:
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
    # premise (iii): a segment is held in a slot when one of the N̄ running requests references it;
    # N̄ = μ_share·E[alive] depends on H, so iterate (H falls as N̄ falls: a monotone fixed point)
    held = float(held_all)
    nbar = 0.0
    for _ in range(50):
        mu_slot = max(params.M - held, 0.0) / eg_net
        nbar = mu_slot * alive
        if params.max_num_seqs is not None:
            nbar = min(nbar, float(params.max_num_seqs))  # the cap binds first: at most N_max run
        new = float(sum(tok * (1.0 - (1.0 - p) ** nbar) if p < 1 else tok for p, tok in segments))
        if abs(new - held) < 1e-9 * max(1.0, held_all):
            held = new
            break
        held = new
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
