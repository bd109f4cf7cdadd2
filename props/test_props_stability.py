"""Properties 9 and 10: stability and saturated throughput, statistically.

Theory meets simulation through explicit tolerances and batch-means confidence
intervals (``kvstab.metrics``), never seeded golden numbers: the seeds only
make a run reproducible, and every assertion compares a confidence interval
with a bound derived from the model.

The limits come from ``kvstab.theory.area`` (``μ = M / E[g]`` per slot) and
the scheduler's declared margin ``Δ`` (``δ_policy = Δ / M``).  ``reserve`` and
``lookahead`` declare ``Δ = M − 1`` (no useful margin), so for them the
"policy limit" is the one of a policy that reserves peaks:
``(M − max peak) / E[peak · (n(s) + o)]`` — while either of them leaves the
queue head waiting, the peaks of its running requests already exceed
``M − max peak``, and each running request keeps its peak for ``n(s) + o``
slots.  (``reserve``'s own optimistic limit, ``M / E[peak·(n(s)+o)]``, is
this without the packing loss.)
"""

from __future__ import annotations

import numpy as np

from kvstab.arrivals import ArrivalPlan, fixed_arrivals, poisson_arrivals
from kvstab.contract import traits_of
from kvstab.engine import fast_rule, run  # the fast engine: identical results, compiled for built-ins
from kvstab.metrics import Estimate, queue_slope, throughput
from kvstab.model import ModelParams, tokens_held
from kvstab.simulator import SimResult
from kvstab.testing.checks import margin_of
from kvstab.testing.pytest_plugin import AuditTarget, Budget
from kvstab.theory.area import expected_g, lifetime_area, mu_per_slot
from kvstab.workload import Uniform, Workload

#: prompts rarely a multiple of the chunk; peaks up to 128 tokens
WORKLOAD = Workload(s=Uniform(1, 64), o=Uniform(1, 64), name="s,o ~ U(1,64)")
CHUNK = 16
#: a queue "stays bounded" if less than this fraction of arrivals accumulates
STABLE_GROWTH_TOL = 0.10
WARMUP = 0.25


def server(b: Budget) -> ModelParams:
    """The server of the statistical runs (its size is set by the profile)."""
    return ModelParams(M=b.stat_M, chunk=CHUNK)


def expected_reserved_area(w: Workload, p: ModelParams) -> float:
    """``E[peak · (n(s) + o)]``: memory-slots a request holds under peak reservation."""
    assert w.s is not None and w.o is not None
    sv, sp = w.s.support()
    ov, op = w.o.support()
    S, O = np.meshgrid(sv, ov, indexing="ij")
    peak = -(-(S + O) // p.block) * p.block
    slots = -(-S // p.chunk) + O
    return float((peak * slots * np.outer(sp, op)).sum())


def policy_limit(target: AuditTarget, w: Workload, p: ModelParams) -> tuple[float, str]:
    """Arrivals per slot below which the policy is stable, and how it was derived."""
    delta = margin_of(target.scheduler, p, w.max_s, w.max_o)
    if delta < p.M - 1:
        return mu_per_slot(w, p) * (1 - delta / p.M), f"μ(1 − Δ/M) with Δ = {delta}"
    peak_max = int(tokens_held(w.max_total, p.block))
    return (p.M - peak_max) / expected_reserved_area(w, p), "(M − max peak)/E[peak·(n(s)+o)]"


def horizon(target: AuditTarget, b: Budget) -> int:
    """Slots of an overloaded run.  Look-ahead projects every admitted request at
    every finish slot (O(n²) per slot on the reference engine) and an overloaded
    server runs many: a rule without a compiled fast path that calls itself
    ``lookahead`` gets a shorter horizon (the growth it must detect, ≥ 0.2 μ per
    slot, is large); the built-in runs compiled, its finish-time table in O(log n)."""
    if target.spec == "lookahead" and fast_rule(target.scheduler) is None:
        return b.stat_slots // 2
    return b.stat_slots


def simulate(target: AuditTarget, p: ModelParams, plan: ArrivalPlan, slots: int) -> SimResult:
    """The run on the fast engine (``kvstab.engine.run``): compiled for a built-in (checked
    here: a long-horizon property must not fall back to the slot loop unseen), the plug-in
    path or the reference engine for a plug-in."""
    out = run(target.scheduler, p, plan, slots)
    assert fast_rule(target.scheduler) is None or out.engine == "fast", (target.spec, out.engine, out.reason)
    assert out.result is not None
    return out.result


def run_at(target: AuditTarget, p: ModelParams, rate: float, slots: int, seed: int) -> SimResult:
    plan = poisson_arrivals(WORKLOAD, rate, ModelParams(bbar=1.0), slots, seed=seed)  # b̄ = 1: rates are per slot
    return simulate(target, p, plan, slots)


def describe(name: str, est: Estimate) -> str:
    return f"{name} {est.value:.4f} [{est.low:.4f}, {est.high:.4f}]"


def test_p9_stable_below_the_policy_limit(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    p = server(props_budget)
    limit, how = policy_limit(audited_scheduler, WORKLOAD, p)
    assert 0 < limit <= mu_per_slot(WORKLOAD, p)
    rate = 0.8 * limit
    # a stable run is cheap (few requests in system) and needs a long horizon for
    # a confidence interval narrower than the tolerance
    res = run_at(audited_scheduler, p, rate, 2 * props_budget.stat_slots, seed=11)
    slope = queue_slope(res, warmup=WARMUP)
    assert slope.high < STABLE_GROWTH_TOL * rate, (
        f"{audited_scheduler.spec} at λ = 0.8 × {how} = {rate:.4f}/slot: queue grows, "
        f"{describe('slope', slope)} ≥ {STABLE_GROWTH_TOL} λ"
    )


def test_p9_unstable_above_mu(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    p = server(props_budget)
    mu = mu_per_slot(WORKLOAD, p)
    res = run_at(audited_scheduler, p, 1.2 * mu, horizon(audited_scheduler, props_budget), seed=12)
    slope = queue_slope(res, warmup=WARMUP)
    # no policy serves more than μ: the queue grows by at least 0.2 μ per slot on average
    assert slope.low > 0, f"{audited_scheduler.spec} at λ = 1.2 μ: {describe('slope', slope)} does not exclude 0"


def test_p10_saturated_throughput(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    p = server(props_budget)
    mu = mu_per_slot(WORKLOAD, p)
    slots = horizon(audited_scheduler, props_budget) // 2
    # an infinite backlog: more requests at slot 0 than could ever be served in the horizon
    n = int(1.5 * mu * slots) + 50
    rng = np.random.default_rng(13)
    s, o = WORKLOAD.sample(rng, n)
    res = simulate(audited_scheduler, p, fixed_arrivals([(0, int(a), int(b)) for a, b in zip(s, o)]), slots)
    assert res.queue[-1] > 0, "the backlog ran dry: the run is not saturated"

    # sample path: completed requests were served at least their g, and no slot serves more than M
    done = res.finish >= 0
    assert lifetime_area(res.s[done], res.o[done], p).sum() <= res.memory.sum() <= p.M * res.slots

    thr = throughput(res, warmup=WARMUP)
    assert thr.low <= mu, f"{audited_scheduler.spec}: {describe('throughput', thr)} exceeds μ = {mu:.4f}/slot"

    # a lower bound for policies that keep memory (or reserved peaks) busy while the queue waits
    window = slice(int(res.slots * WARMUP), res.slots)
    waste = float(res.wasted[window].mean())
    delta = margin_of(audited_scheduler.scheduler, p, WORKLOAD.max_s, WORKLOAD.max_o)
    if traits_of(audited_scheduler.scheduler).work_conserving:
        if delta < p.M - 1:
            floor = (p.M - delta - waste) / expected_g(WORKLOAD, p)  # μ(1 − δ) − measured waste
            how = f"(M − Δ − waste)/E[g] with Δ = {delta}, waste {waste:.1f}/slot"
        else:
            floor, how = policy_limit(audited_scheduler, WORKLOAD, p)
        assert thr.high >= floor, f"{audited_scheduler.spec}: {describe('throughput', thr)} below {how} = {floor:.4f}"
