"""A fleet's critical rate: bisection on the sign of the queue growth, with intervals.

The single-server search (:mod:`kvstab.audit.stability`) runs one server per
point; a fleet point is a whole fleet behind a router, so the search is
repeated here with the same statistics:

* at a rate ``λ``, ``seeds`` independent replications (common random numbers:
  replication ``r`` uses the same seed at every rate) each give
  :data:`BATCHES` batch means of the per-second growth of the fleet's number
  in system over the last half of the run; pooled, they give a Student-t 95 %
  interval.  A rate whose interval lies above the threshold ``h`` is
  *unstable*, below it *stable*; an undecided rate gets more replications up
  to ``max_seeds``, then is classified by its point estimate (and says so);
* above ``λ*`` the growth is ``λ − λ*``, so the crossing of ``h`` sits at
  ``λ* + h``: the search reports ``λ* = c − h`` with the interval from the
  bracketing rates, refined until its half-width is within ``tolerance·Σμ``;
* beside it, the fleet's **saturated throughput** under overload — for an FCFS
  fleet whose replicas all saturate (identical replicas behind round-robin),
  the estimator that has no relaxation bias (see ``docs/audit.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from kvstab.errors import InvalidArgument
from kvstab.fleet.arrivals import FleetArrivals, poisson_times
from kvstab.fleet.routers import PromptChains
from kvstab.fleet.simulate import (
    SLOPE_START,
    FleetResult,
    Replica,
    caching_replicas,
    needs_prompts,
    replica_infos,
    simulate_fleet,
)
from kvstab.metrics import Estimate, against_threshold
from kvstab.model import prefill_slots
from kvstab.validation import positive_float, positive_int
from kvstab.workload import Workload

__all__ = ["RateVerdict", "CriticalRate", "evaluate_rate", "find_fleet_critical_rate", "BATCHES"]

#: batches per replication
BATCHES = 10


@dataclass(frozen=True, slots=True)
class RateVerdict:
    """The replications at one rate, pooled."""

    rate: float = field(metadata={"help": "λ, requests per second"})
    slope: Estimate = field(metadata={"help": "growth of the fleet's number in system, requests per second"})
    throughput: Estimate = field(metadata={"help": "fleet completions per second"})
    verdict: str = field(metadata={"help": "'stable' or 'unstable'"})
    decided_by: str = field(metadata={"help": "'interval' or 'point estimate'"})
    seeds: int
    example: FleetResult | None = field(default=None, repr=False, metadata={"help": "the first replication"})


@dataclass(frozen=True, slots=True)
class CriticalRate:
    """``λ*`` of a fleet with its interval and what was measured on the way."""

    router: str
    critical: float
    low: float
    high: float
    threshold: float = field(metadata={"help": "h, requests per second"})
    saturated: Estimate | None = field(metadata={"help": "fleet throughput under overload, requests per second"})
    mu_total: float = field(metadata={"help": "Σ μ_i"})
    theory_rate: float = field(metadata={"help": "the router's critical rate by kvstab.theory.fleet"})
    resolved: bool
    evaluations: tuple[RateVerdict, ...]
    notes: tuple[str, ...] = ()


def _pooled(x: Sequence[float], level: float = 0.95) -> Estimate:
    a = np.asarray(x, dtype=np.float64)
    c = float(a.mean())
    half = float(stats.t.ppf(0.5 + level / 2, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size))
    return Estimate(c, c - half, c + half, level)


def _batches(res: FleetResult) -> tuple[list[float], list[float]]:
    """Batch means of the fleet's growth (last half) and throughput (after warm-up), per second."""
    n = res.in_system.sum(axis=0)
    dt = float(res.grid_s[1] - res.grid_s[0])
    inc = np.diff(n[int(SLOPE_START * (n.size - 1)) :]) / dt
    size = inc.size // BATCHES
    slope = inc[: size * BATCHES].reshape(BATCHES, size).mean(axis=1)
    done = np.concatenate([r.finish_s[np.isfinite(r.finish_s)] for r in res.replicas])
    edges = np.linspace(0.25 * res.horizon_s, res.horizon_s, BATCHES + 1)
    thr = np.histogram(done, bins=edges)[0] / np.diff(edges)
    return [float(v) for v in slope], [float(v) for v in thr]


#: arrivals at a rate: ``draw(rate, horizon_s, seed, prompts) -> FleetArrivals``
Draw = Callable[[float, float, int, bool], FleetArrivals]


def evaluate_rate(
    replicas: Sequence[Replica], router: str | Any, workload: Workload, rate: float, horizon_s: float, *,
    seeds: int = 3, max_seeds: int = 8, threshold: float = 0.0, seed: int = 0, classify: bool = True,
    draw: Draw | None = None,
) -> RateVerdict:
    """Replicate ``rate`` and classify it against the growth threshold ``threshold`` (req/s).

    ``draw`` makes the arrivals at a rate (default: Poisson with lengths i.i.d. from ``workload``;
    e.g. :func:`~kvstab.fleet.arrivals.trace_rows_poisson` for a trace's rows and prompts)."""
    slopes: list[float] = []
    thr: list[float] = []
    caching = needs_prompts(replicas, router)  # replicas with caching, and prefix routers, need the prompts' content
    first: FleetResult | None = None
    reps = 0
    decided = False
    while True:
        target = seeds if reps == 0 else min(2 * reps, max_seeds)
        while reps < target:
            rseed = seed * 1_000_003 + reps
            arr = (poisson_times(workload, rate, horizon_s, seed=rseed, prompts=caching) if draw is None
                   else draw(rate, horizon_s, rseed, caching))
            res = simulate_fleet(replicas, router, workload, arr, seed=seed * 1_000_003 + reps)
            first = first or res
            sl, th = _batches(res)
            slopes += sl
            thr += th
            reps += 1
        slope = _pooled(slopes)
        decided = slope.low > threshold or slope.high < threshold
        if not classify or decided or reps >= max_seeds:
            break
    verdict = "unstable" if slope.value > threshold else "stable"
    how = "interval" if decided else "point estimate"
    return RateVerdict(rate, slope, _pooled(thr), verdict, how, reps, first)


#: the fewest mean request lifetimes a run of the critical-rate search may hold
MIN_LIFETIMES = 12


def mean_service_slots(workload: Workload, replicas: Sequence[Replica]) -> float:
    """``E[n(s) + o]``: the mean slots a request is served for, with the largest chunk of the fleet
    (a lower bound on the lifetime, so the horizon check never refuses a run it should allow)."""
    chunk = max(r.params.chunk for r in replicas)
    rng = np.random.default_rng(0)
    s, o = workload.sample(rng, 20_000)
    return float(np.mean(prefill_slots(s, chunk) + o))


def find_fleet_critical_rate(
    replicas: Sequence[Replica],
    router: str,
    workload: Workload,
    *,
    horizon_s: float,
    tolerance: float = 0.01,
    seeds: int = 3,
    max_seeds: int = 8,
    max_evaluations: int = 14,
    overload: float | None = 1.2,
    seed: int = 0,
    log: Callable[[str], None] = lambda _line: None,
    draw: Draw | None = None,
) -> CriticalRate:
    """``λ*`` of ``replicas`` behind ``router`` to within ``tolerance·Σμ`` (see the module docstring).

    The bracket starts at the router's theoretical critical rate (round-robin:
    ``N·min μ_i``; a random or weighted split: ``min μ_i/p_i`` with the shares it
    gives over 200 000 draws; a state-dependent router: ``Σ μ_i``) ± 10 % and
    widens until it brackets.
    ``overload`` (× that rate): also measure the saturated throughput there
    (``None``: skip).  ``draw``: the arrivals at a rate, as :func:`evaluate_rate` takes them
    (``workload`` is then the law the theory's ``μ_i`` is computed for).
    """
    from kvstab.fleet.routers import load_router, reads_prompts
    from kvstab.theory import critical_rate

    tolerance = positive_float("the tolerance", tolerance, maximum=1.0)
    seeds = positive_int("seeds", seeds, maximum=1000)
    if seeds < 2:
        raise InvalidArgument("seeds must be at least 2 for an interval")
    horizon_s = positive_float("the horizon (seconds)", horizon_s, maximum=1e9)
    infos, _ = replica_infos(replicas, workload)
    # a run must hold many request lifetimes, or the queue's warm-up reads as growth and λ* comes out
    # low with a confident interval: refuse horizons under MIN_LIFETIMES mean lifetimes on the slowest replica
    life = max(i.bbar for i in infos) * mean_service_slots(workload, replicas)
    if horizon_s < MIN_LIFETIMES * life:
        raise InvalidArgument(
            f"the horizon {horizon_s:g} s holds fewer than {MIN_LIFETIMES} mean request lifetimes ({life:.3g} s each "
            f"on the slowest replica), so λ* would be biased low; use --horizon {math.ceil(MIN_LIFETIMES * life)} or more"
        )
    mus = [i.mu for i in infos]
    total = float(sum(mus))
    rt = load_router(router)
    if rt.state_dependent:
        theory = total
    elif reads_prompts(rt):
        # a split by content: its shares come from the prompts themselves (a hot prefix's replica takes its share)
        sample = (draw or (lambda r, hz, s, p: poisson_times(workload, r, hz, seed=s, prompts=p)))(1.0, 20_000.0, seed, True)
        theory = _static_rate(rt, infos, mus, critical_rate, sample)
    else:
        theory = _static_rate(rt, infos, mus, critical_rate)
    tol = tolerance * total
    h = 0.5 * tol
    evals: list[RateVerdict] = []
    notes: list[str] = []

    def ev(rate: float) -> RateVerdict:
        v = evaluate_rate(replicas, router, workload, rate, horizon_s, seeds=seeds, max_seeds=max_seeds,
                          threshold=h, seed=seed, draw=draw)  # fmt: skip
        evals.append(v)
        log(f"  λ = {rate:.5g}/s: {against_threshold(v.slope, h)}, {v.seeds} seeds; "
            f"throughput {v.throughput.value:.5g}/s")  # fmt: skip
        if v.decided_by != "interval":
            side = "above" if v.verdict == "unstable" else "below"
            notes.append(f"λ = {rate:.5g}/s stayed undecided at {v.seeds} seeds: classified {v.verdict} by its point "
                         f"estimate {v.slope.value:+.4g}/s, {side} the growth threshold h = {h:.4g}/s")  # fmt: skip
        return v

    lo, hi = 0.9 * theory, 1.1 * theory
    low_ok = high_ok = False
    while len(evals) < max_evaluations:
        if ev(lo).verdict == "stable":
            low_ok = True
            break
        hi, lo = lo, lo * 0.8  # lo was unstable: it bounds λ* from above
        high_ok = True
    while not high_ok and len(evals) < max_evaluations:
        if ev(hi).verdict == "unstable":
            high_ok = True
            break
        lo, hi = hi, hi * 1.2
    if not (low_ok and high_ok):
        notes.append(f"no bracket within {max_evaluations} evaluations: no rate was found "
                     f"{'stable' if not low_ok else 'unstable'}")  # fmt: skip
    while (hi - lo) / 2 > tol and len(evals) < max_evaluations:
        mid = (lo + hi) / 2
        if ev(mid).verdict == "stable":
            lo = mid
        else:
            hi = mid
    if caching_replicas(replicas):
        notes.append("prefix caching on replica(s) " + ", ".join(caching_replicas(replicas)) + " (each its own block "
                     "pool): Σμ and the theory's rate use the no-sharing μ, which shared blocks can exceed")
    resolved = low_ok and high_ok and (hi - lo) / 2 <= tol * (1 + 1e-9)
    if not resolved:
        notes.append(f"the interval did not reach ±{tol:.4g}/s within {max_evaluations} evaluations")
    saturated = None
    if overload is not None:
        # with prefix caching the fleet can serve more than the no-sharing theory: overload past what it kept up with
        base = max(theory, hi) if caching_replicas(replicas) else theory
        sat = evaluate_rate(replicas, router, workload, overload * base, horizon_s, seeds=seeds, classify=False,
                            seed=seed, draw=draw)  # fmt: skip
        saturated = sat.throughput
        log(f"  saturated throughput at λ = {overload * base:.5g}/s: {sat.throughput.value:.5g}/s "
            f"[{sat.throughput.low:.5g}, {sat.throughput.high:.5g}]")  # fmt: skip
    return CriticalRate(
        router=rt.name, critical=(lo + hi) / 2 - h, low=max(lo - h, 0.0), high=hi - h, threshold=h,
        saturated=saturated, mu_total=total, theory_rate=theory, resolved=resolved, evaluations=tuple(evals),
        notes=tuple(notes),
    )  # fmt: skip


def _static_rate(rt: Any, infos: Sequence[Any], mus: list[float], critical_rate: Callable[..., float],
                 sample: FleetArrivals | None = None) -> float:
    """The critical rate of a state-independent router from the long-run shares it gives each replica
    (a prompt-reading one: the shares it gives the requests of ``sample``)."""
    if sample is not None:
        n = len(sample)
        where = np.asarray(rt.assign(n, infos, np.random.default_rng(0), PromptChains(sample.prompts, n)),
                           dtype=np.int64)
        share = np.bincount(where, minlength=len(mus)) / max(n, 1)
        return float(critical_rate(mus, share / share.sum()))
    n = 200_000
    where = np.asarray(rt.assign(n, infos, np.random.default_rng(0)), dtype=np.int64)
    share = np.bincount(where, minlength=len(mus)) / n
    return float(critical_rate(mus, share / share.sum()))
