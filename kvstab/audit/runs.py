"""One simulation run: the only place the audit, the sweep and ``kvstab simulate`` run one.

The pipeline is written once: the arrivals (:func:`poisson_plan` from a
workload and a rate, :func:`trace_plan` from a trace's own times), the engine
(:func:`run_model`) and, for ``kvstab simulate``, the summary beside the theory
(:func:`prepare_simulation` then :func:`simulate_prepared`, a
:class:`SimulationReport`).

Every rate the stability search evaluates and every row of a sweep goes
through :func:`run_point`, so switching the whole audit to another engine
(e.g. the fast engine) is a change to this one function.  A :class:`Point`
is a frozen, picklable description (scheduler spec, server, workload spec,
rate, horizon, seed), so points travel to any ``concurrent.futures.Executor``
— local processes or Dask workers — and a point's result depends on nothing
but the point.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument
from kvstab.jsonform import JsonRecord, record_json
from kvstab.model import DEFAULT_WINDOW, ModelParams, prefill_slots
from kvstab.validation import MAX_SLOTS
from kvstab.workload import Workload, parse_workload

if TYPE_CHECKING:
    from kvstab.arrivals import ArrivalPlan
    from kvstab.engine.stream import Summary
    from kvstab.simulator import SimResult
    from kvstab.theory.report import StabilityReport

__all__ = [
    "Point", "PointResult", "run_point", "derive_seed", "load_workload", "BATCHES", "SERIES_POINTS",
    "poisson_plan", "trace_plan", "ModelRun", "run_model", "SimulationSetup", "SimulationReport",
    "prepare_simulation", "simulate_prepared", "Certificate",
]

Engine = Literal["auto", "fast", "reference"]

#: batches per replication for the batch-means intervals
BATCHES = 10
#: samples kept of a run's queue-length and memory series (for plots)
SERIES_POINTS = 400
#: warm-up fraction excluded from every estimate
WARMUP = 0.25
#: the growth slope is measured over the last part of the run only: a stable
#: queue started empty fills towards its stationary level for a relaxation
#: time that grows as the load nears λ*, and that filling reads as growth
SLOPE_WARMUP = 0.5


@dataclass(frozen=True, slots=True)
class Point:
    """One simulation to run: everything its result depends on."""

    scheduler: str = field(metadata={"help": "registered name or module:attr"})
    params: ModelParams = field(metadata={"help": "the server (its b̄ sets the slot length)"})
    workload: str = field(metadata={"help": "workload spec (kvstab.workload.parse_workload)"})
    rate: float = field(metadata={"help": "Poisson arrival rate λ, requests per second"})
    slots: int = field(metadata={"help": "horizon in slots"})
    seed: int = field(metadata={"help": "seed of the arrival generator"})
    series: bool = field(default=False, metadata={"help": "keep downsampled queue and memory series"})
    drop_oversize: bool = field(
        default=False, metadata={"help": "drop arrivals whose s + o cannot fit in M (else the workload must fit)"}
    )
    window: int = field(
        default=DEFAULT_WINDOW, metadata={"help": "the queue-head window shown to the rule first (--window)"}
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and math.isfinite(self.rate) and self.rate > 0):
            raise InvalidArgument(f"arrival rate must be a finite number > 0 requests/s, got {self.rate!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 4 * BATCHES:
            raise InvalidArgument(f"a point needs at least {4 * BATCHES} slots, got {self.slots!r}")


@dataclass(frozen=True, slots=True)
class PointResult:
    """What one run measured over its steady window (after the warm-up)."""

    point: Point
    window: int  # slots in the steady window
    arrived: int
    completed: int
    throughput: float  # completions per slot in the window
    slope: float  # growth of the number in system per slot over the last SLOPE_WARMUP of the run
    throughput_batches: tuple[float, ...]  # batch means, for pooled intervals
    slope_batches: tuple[float, ...]
    in_system_end: int
    utilisation: float  # mean memory / M in the window
    preemptions: int
    waste: float  # area thrown away by preemption / area served, in the window
    ttft: tuple[float, float, float]  # p50, p90, p99 in slots
    e2e: tuple[float, float, float]  # p50, p90, p99 in slots
    latency_requests: int  # finished requests the percentiles are over
    queue_series: tuple[int, ...] = ()
    memory_series: tuple[float, ...] = ()
    series_step: int = 1
    wall_s: float = 0.0
    dropped: int = 0  # arrivals that could not fit in M, dropped (Point.drop_oversize)


def derive_seed(*key: object) -> int:
    """A 63-bit seed from a key: the same key gives the same seed on any worker,
    in any order (blake2b of the key's ``repr``; Python's ``hash`` is salted)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@lru_cache(maxsize=32)
def load_workload(spec: str) -> Workload:
    """The workload a spec names (parsed once per process: traces are files)."""
    return parse_workload(spec)


@lru_cache(maxsize=32)
def _scheduler(spec: str) -> Scheduler:
    from kvstab.registry import load_scheduler

    return load_scheduler(spec)


def _percentiles(x: npt.NDArray[np.int64]) -> tuple[float, float, float]:
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    p = np.percentile(x, [50, 90, 99])
    return (float(p[0]), float(p[1]), float(p[2]))


def _batch(x: npt.NDArray[np.float64]) -> tuple[float, ...]:
    size = x.size // BATCHES
    return tuple(float(v) for v in x[: size * BATCHES].reshape(BATCHES, size).mean(axis=1))


def run_point(point: Point, scheduler: Scheduler | None = None) -> PointResult:
    """Simulate ``point`` and summarise its steady window.

    ``scheduler`` overrides loading ``point.scheduler`` by name (for a scheduler
    object that no spec can load).  This is the one simulation call of the
    audit and the sweep: the fast engine (:func:`kvstab.engine.run`), whose
    results are identical to the reference simulator's, on the compiled path
    for built-ins and the plug-in path or the reference engine otherwise.
    """
    t0 = time.perf_counter()
    sched = scheduler if scheduler is not None else _scheduler(point.scheduler)
    workload = load_workload(point.workload)
    plan = poisson_plan(workload, point.params, point.rate, point.slots, point.seed,
                        drop_oversize=point.drop_oversize)
    res = run_model(sched, point.params, plan, point.slots, window=point.window).result
    assert res is not None  # record=True keeps the per-slot arrays this summary reads
    start = int(point.slots * WARMUP)
    n = res.in_system.astype(np.float64)
    window = point.slots - start
    completions = res.completed[start:].astype(np.float64)
    slope_start = int(point.slots * SLOPE_WARMUP)
    increments = np.diff(n[slope_start - 1 :])
    served = float(res.memory[start:].sum())
    # latency over requests that arrived in the window and finished (censored
    # in an unstable run: the ones still waiting are not counted)
    arrived_in = res.arrival >= start
    done = arrived_in & (res.finish >= 0)
    # TTFT: the first token is sampled with the last prefill chunk (vLLM), n(s)
    # slots after the first admission — exact without a token budget and
    # without a preemption during the first prefill
    n_s = prefill_slots(res.s[done], point.params.chunk)
    ttft = res.first_admit[done] + n_s - res.arrival[done]
    e2e = res.finish[done] + 1 - res.arrival[done]
    step = max(1, point.slots // SERIES_POINTS)
    return PointResult(
        point=point,
        window=window,
        arrived=int(arrived_in.sum()),
        completed=int(completions.sum()),
        throughput=float(completions.mean()),
        slope=float(increments.mean()),
        throughput_batches=_batch(completions),
        slope_batches=_batch(increments),
        in_system_end=int(n[-1]),
        utilisation=float(res.memory[start:].mean() / point.params.M),
        preemptions=int(res.preempted[start:].sum()),
        waste=float(res.wasted[start:].sum() / served) if served else 0.0,
        ttft=_percentiles(ttft),
        e2e=_percentiles(e2e),
        latency_requests=int(done.sum()),
        queue_series=tuple(int(v) for v in n[::step]) if point.series else (),
        memory_series=tuple(float(v) for v in res.memory[::step] / point.params.M) if point.series else (),
        series_step=step,
        wall_s=time.perf_counter() - t0,
        dropped=plan.dropped,
    )


def poisson_plan(workload: Workload, params: ModelParams, rate: float, slots: int, seed: int, *,
                 drop_oversize: bool = False) -> ArrivalPlan:
    """Poisson arrivals at ``rate`` req/s of ``workload``'s requests over ``slots`` slots of the
    server's ``b̄`` seconds; with ``drop_oversize`` those that can never fit in ``M`` are dropped (and counted).
    Without it every request must fit: the callers check the law first
    (:meth:`~kvstab.workload.Workload.check_fits`), so the plan is not checked again."""
    from kvstab.arrivals import poisson_arrivals

    plan = poisson_arrivals(workload, rate, params, slots, seed=seed)
    return plan.fit_to(params, drop_oversize=True) if drop_oversize else plan


def _same_trace(spec: str, path: str) -> bool:
    """Whether workload ``spec`` is the joint law of the trace at ``path``."""
    text = spec.strip()
    if not (text.startswith("trace(") and text.endswith(")")):
        return False
    inner = text[len("trace(") : -1].strip()
    try:
        return os.path.samefile(inner, path)
    except OSError:
        return False


def trace_plan(path: str, params: ModelParams, time_scale: float | None, slots: int | None,
               workload: str | None = None) -> tuple[Workload, ArrivalPlan, int]:
    """A trace's own arrivals (times multiplied by ``time_scale``), the law of its requests
    and the slots to run (``slots``, or the trace's span) — refused before any work where
    ``workload`` is given and is not the trace's own law, or the span is too long."""
    from kvstab.arrivals import trace_arrivals
    from kvstab.traces import load_trace

    if workload is not None and not _same_trace(workload, path):
        raise InvalidArgument(
            f"--workload {workload!r} is not the law of the trace's own requests, which --trace-arrivals "
            f"replays: μ, δ and λ/μ would describe other requests; drop --workload (the trace's law is used) "
            f"or pass --workload 'trace({path})'"
        )
    trace = load_trace(path)
    law = Workload.joint(trace.s, trace.o, name=f"trace({path})")
    plan = trace_arrivals(trace, params, time_scale if time_scale is not None else 1.0)
    last = int(plan.slot[-1]) if len(plan) else 0
    if slots is None and last + 1 > MAX_SLOTS:
        raise InvalidArgument(
            f"trace {path} spans {last + 1} slots of b̄={params.bbar} s (more than {MAX_SLOTS}); pass --slots to "
            "simulate its beginning, or a smaller --time-scale"
        )
    return law, plan, slots if slots is not None else last + 1


@dataclass(frozen=True, slots=True, eq=False)
class ModelRun:
    """One run of the model on the engine :func:`run_model` chose."""

    summary: Summary = field(metadata={"help": "streamed statistics: batch means, utilisation, waste, latency"})
    result: SimResult | None = field(metadata={"help": "per-slot arrays (record=True, or the reference engine)"})
    window_hid_slots: int | None = field(
        metadata={"help": "slots the queue window hid requests in; None where the engine does not count them"}
    )
    window: int = field(metadata={"help": "the queue window at the end (the reference engine widens it)"})
    engine: str = field(metadata={"help": "'fast', 'fast-plugin' or 'reference'"})
    reason: str = field(metadata={"help": "why this engine ran"})


def run_model(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    slots: int,
    *,
    engine: Engine = "auto",
    record: bool = True,
    warmup: float = 0.25,
    window: int = 8,
    progress: Callable[[int], None] | None = None,
    plugins_on_reference: bool = False,
    spec: str | None = None,
    decide_timeout: float | None = None,
    lifecycle: Literal["kvstab", "vllm"] = "kvstab",
) -> ModelRun:
    """Run ``plan`` for ``slots`` slots on the fastest engine that is exact for ``scheduler``
    (:func:`kvstab.engine.run`; ``engine`` as there, ``progress(slot)`` now and then).

    ``plugins_on_reference`` keeps a rule without a compiled built-in path on the
    reference engine (:func:`kvstab.simulator.simulate`) under ``auto`` too, where a
    plug-in's faults are named by ``spec``, and every slot is recorded (``kvstab
    simulate``); otherwise ``auto`` tries the plug-in path first (the audit's points).
    ``decide_timeout`` limits each call of a plug-in's ``decide`` on either path."""
    from kvstab.engine import run as engine_run
    from kvstab.schedulers import Sglang

    # sglang with caching is SGLang's radix cache, which only engine_run carries (not vLLM's pool)
    radix = params.prefix_caching and isinstance(scheduler, Sglang)
    if plugins_on_reference and lifecycle == "kvstab" and not radix:
        from kvstab.engine.driver import has_fast_path
        from kvstab.engine.stream import StreamStats
        from kvstab.simulator import simulate

        if params.prefix_caching:
            from kvstab.engine.cached import why_not_cached

            not_fast = why_not_cached(scheduler, params, "kvstab")
        else:
            not_fast = "" if has_fast_path(scheduler) else "the scheduler has no compiled fast path"
        if not (engine == "fast" or (engine == "auto" and not not_fast)):
            why = "asked for" if engine == "reference" else not_fast
            res = simulate(scheduler, params, plan, slots, window=window, on_slot=progress, spec=spec,
                           decide_timeout=decide_timeout)
            return ModelRun(StreamStats.of_result(res, True, warmup), res, res.window_hid_slots, res.window,
                            "reference", why)
        engine = "fast"
    out = engine_run(
        scheduler, params, plan, slots, window=window, engine=engine, record=record, warmup=warmup,
        progress=None if progress is None else (lambda t, _n: progress(t)), lifecycle=lifecycle,
        decide_timeout=decide_timeout, spec=spec,
    )
    # the compiled engine runs head-of-line built-ins, whose decisions the window never changes, and does
    # not count the slots it hid requests in: unknown (None), not 0
    return ModelRun(out.summary, out.result, None, window, out.engine, out.reason)


@dataclass(frozen=True, slots=True)
class Certificate(JsonRecord):
    """The rate certified for one policy, and on what grounds."""

    certified_rate_per_s: float | None = field(metadata={"help": "stable below this rate (req/s); None: none certified"})
    certified_basis: str = field(metadata={"help": "why (the theorem and the premise it used), or why none"})

    @classmethod
    def of(cls, scheduler: Scheduler, params: ModelParams, law: Workload, mu: float) -> Certificate:
        """What :func:`kvstab.theory.certified.policy_guarantee` certifies for ``scheduler`` on
        ``params`` under ``law``, whose ``μ`` is ``mu`` req/s."""
        from kvstab.theory.certified import policy_guarantee

        return cls(*policy_guarantee(scheduler, params, law, mu))


@dataclass(frozen=True, slots=True, eq=False)
class SimulationSetup:
    """What ``kvstab simulate`` runs, checked before any work: the arrivals and the theory they meet."""

    workload: Workload = field(metadata={"help": "the law the requests are drawn from (a trace's own)"})
    law: Workload = field(metadata={"help": "the law the theory is of: given s + o fitting, with drop_oversize"})
    fit_p: float = field(metadata={"help": "P(s + o fits in M)"})
    theory: StabilityReport = field(metadata={"help": "μ, E[g], δ of the law"})
    certificate: Certificate = field(metadata={"help": "the rate certified for the policy, and why"})
    plan: ArrivalPlan = field(metadata={"help": "the arrivals that reach the server"})
    slots: int = field(metadata={"help": "slots to run"})
    rate: float = field(metadata={"help": "λ offered, req/s"})
    fit_rate: float = field(metadata={"help": "λ of the requests that fit, req/s"})
    source: str = field(metadata={"help": "how the arrivals were made"})
    warmup: float = field(metadata={"help": "warm-up fraction excluded from the estimates"})


def prepare_simulation(
    scheduler: Scheduler,
    params: ModelParams,
    *,
    workload: str | None = None,
    trace: str | None = None,
    time_scale: float | None = None,
    rate: float | None = None,
    load: float = 1.2,
    slots: int | None = None,
    seed: int = 0,
    warmup: float = 0.25,
    drop_oversize: bool = False,
) -> SimulationSetup:
    """The arrivals (Poisson at ``rate``, or ``load``·μ, of ``workload``; or ``trace``'s own)
    over ``slots`` slots (with a trace, ``None`` is its span) and the theory of what reaches
    the server, refused before any work if they disagree."""
    from kvstab.theory import stability_report

    if trace is None:
        if time_scale is not None:
            raise InvalidArgument("--time-scale scales a trace's arrival times; it needs --trace-arrivals PATH")
        if slots is None:
            raise InvalidArgument("Poisson arrivals need a number of slots (only a trace has a span of its own)")
        w = parse_workload(workload if workload is not None else "paper-1:1")
        offered, n, source = None, slots, ""
    else:
        w, offered, n = trace_plan(trace, params, time_scale, slots, workload)
        source = f"trace {trace} (time x{time_scale if time_scale is not None else 1.0:g})"
    w.check_fits(params, drop_oversize=drop_oversize)
    # the server sees only the requests that fit: with drop_oversize the theory is of the law given fitting
    law, fit_p = w.given_fit(params) if drop_oversize else (w, 1.0)
    theory = stability_report(law, params)
    certificate = Certificate.of(scheduler, params, law, theory.mu_per_s)
    if offered is None:
        # the load is the load of what reaches the server: λ·P(fit) = load·μ
        lam = rate if rate is not None else load * theory.mu_per_s / fit_p
        plan = poisson_plan(w, params, lam, n, seed, drop_oversize=drop_oversize)
        source = f"Poisson, seed {seed}"
        fit_rate = lam * fit_p
    else:
        # λ of what is offered inside the simulated window, not of all the trace's rows
        lam = int((offered.slot < n).sum()) / (n * params.bbar)
        plan = offered.fit_to(params, drop_oversize=drop_oversize)
        fit_rate = int((plan.slot < n).sum()) / (n * params.bbar)
    if n - int(n * warmup) < 4:
        raise InvalidArgument(
            f"--slots {n} with --warmup {warmup:g} leaves {n - int(n * warmup)} slot(s) to "
            "estimate from; the batch-means estimates need at least 4 (pass more --slots or a smaller --warmup)"
        )
    return SimulationSetup(w, law, fit_p, theory, certificate, plan, n, lam, fit_rate, source, warmup)


@dataclass(frozen=True, slots=True)
class SimulationReport(JsonRecord):
    """``kvstab simulate``'s result: the run's throughput, growth, memory, waste and latency beside
    ``μ``, ``δ`` and the certified rate (its JSON form is ``kvstab simulate --json``)."""

    scheduler: str = field(metadata={"help": "the scheduler's spec"})
    workload: str = field(metadata={"help": "the law the requests are drawn from"})
    arrivals: str = field(metadata={"help": "how the arrivals were made"})
    params: ModelParams = field(
        metadata={"help": "the server (JSON: M, chunk, block, token_budget, max_num_seqs and b̄ as bbar_s)"}
    )
    slots: int = field(metadata={"help": "slots run"})
    window: int = field(metadata={"help": "the queue window at the end"})
    # the compiled engine runs head-of-line built-ins, whose decisions the window never changes, and does
    # not count the slots it hid requests in: unknown (null) there, not 0
    window_hid_slots: int | None = field(metadata={"help": "slots the queue window hid requests in"})
    scheduler_traits: list[str] = field(metadata={"help": "what the rule claims"})
    warmup_fraction: float = field(metadata={"help": "warm-up fraction excluded"})
    arrival_rate_per_s: float = field(metadata={"help": "λ offered"})
    fitting_rate_per_s: float = field(metadata={"help": "λ of the requests that fit"})
    offered_load_lambda_over_mu: float = field(metadata={"help": "λ·P(fit)/μ"})
    arrived: int = field(metadata={"help": "requests that arrived"})
    completed: int = field(metadata={"help": "requests that finished"})
    dropped_oversize: int = field(metadata={"help": "requests dropped as never fitting"})
    theory_workload: str = field(metadata={"help": "the law the theory is of"})
    fit_probability: float = field(metadata={"help": "P(s + o fits in M)"})
    theory_note: str | None = field(metadata={"help": "why the theory's law differs from the workload's"})
    throughput_per_slot: float = field(metadata={"help": "completions per slot"})
    throughput_per_slot_ci95: list[float] = field(metadata={"help": "its 95 % interval"})
    throughput_per_s: float = field(metadata={"help": "completions per second"})
    throughput_per_s_ci95: list[float] = field(metadata={"help": "its 95 % interval"})
    queue_growth_per_slot: float = field(metadata={"help": "growth of the number in system per slot"})
    queue_growth_per_slot_ci95: list[float] = field(metadata={"help": "its 95 % interval"})
    in_system_at_end: int = field(metadata={"help": "arrived − completed"})
    memory_utilisation: float = field(metadata={"help": "mean memory / M"})
    preemptions: int = field(metadata={"help": "preemptions in all"})
    preemptions_per_completion: float | None = field(metadata={"help": "None when nothing completed"})
    wasted_area_fraction: float = field(metadata={"help": "wasted area / served area"})
    latency_slots: dict[str, float] = field(metadata={"help": "p50/p90/p99/max of finish − arrival + 1"})
    theory: StabilityReport = field(metadata={
        "help": "μ, E[g], δ of the theory's law (JSON: E_g_tokens_slots, mu_formula_per_s, mu_formula_per_slot "
                "(μ·b̄), delta, mu_1_minus_delta_per_s: None where δ ≥ 1)"})
    certificate: Certificate = field(metadata={
        "help": "the rate certified for the policy (JSON: policy_certified_rate_per_s, policy_certified_rate_basis)"})
    measured_over_mu: float = field(metadata={"help": "measured throughput / μ"})
    engine: str = field(metadata={"help": "the engine that ran"})
    engine_reason: str = field(metadata={"help": "why"})
    wall_s: float = field(metadata={"help": "wall-clock seconds of the run"})
    prefix_caching: bool = field(
        default=False,
        metadata={"help": "whether the server ran with prefix caching (μ is then the paper's no-sharing formula)"},
    )
    lifecycle: str = field(
        default="kvstab",
        metadata={"help": "request lifecycle: 'kvstab' (restart on preemption) or 'vllm' (vLLM's: outputs kept)"},
    )
    mu_sharing_per_s: float | None = field(
        default=None,
        metadata={"help": "with prefix caching, μ with sharing (docs/theory.md, 'Prefix caching'), req/s; None "
                          "without caching or for a prefix law with no closed form (chat, a trace)"},
    )

    def to_json(self) -> dict[str, Any]:
        """``kvstab simulate --json``: the fields in order, the server, the theory's figures and the
        certificate spelled out where they stand."""
        p, th, c = self.params, self.theory, self.certificate
        spelled: dict[str, dict[str, Any]] = {
            "params": {"M": p.M, "chunk": p.chunk, "block": p.block, "token_budget": p.token_budget,
                       "max_num_seqs": p.max_num_seqs, "bbar_s": p.bbar},
            "theory": {"E_g_tokens_slots": th.E_g, "mu_formula_per_s": th.mu_per_s,
                       "mu_formula_per_slot": th.mu_per_s * p.bbar, "delta": th.delta,
                       "mu_1_minus_delta_per_s": th.guarantee_per_s},
            "certificate": {"policy_certified_rate_per_s": c.certified_rate_per_s,
                            "policy_certified_rate_basis": c.certified_basis},
        }
        out: dict[str, Any] = {}
        for k, v in record_json(self).items():
            out.update(spelled.get(k, {k: v}))
        return out


def simulate_prepared(
    spec: str,
    scheduler: Scheduler,
    params: ModelParams,
    setup: SimulationSetup,
    *,
    engine: Engine = "auto",
    window: int = 8,
    decide_timeout: float | None = None,
    progress: Callable[[int], None] | None = None,
    lifecycle: Literal["kvstab", "vllm"] = "kvstab",
) -> SimulationReport:
    """Run ``setup`` (streamed on the fast engine: no per-slot arrays; the reference engine for a
    rule without a compiled path, see :func:`run_model`) and set the run beside the theory."""
    from kvstab.contract import traits_of

    t0 = time.perf_counter()
    out = run_model(scheduler, params, setup.plan, setup.slots, engine=engine, record=False, warmup=setup.warmup,
                    window=window, progress=progress, plugins_on_reference=True, spec=spec,
                    decide_timeout=decide_timeout, lifecycle=lifecycle)
    wall = time.perf_counter() - t0
    summ, th, law = out.summary, setup.theory, setup.law
    thr, slope = summ.throughput, summ.queue_slope
    assert thr is not None and slope is not None  # at least 4 steady slots, checked by prepare_simulation
    completed = summ.completed
    mu, bbar = th.mu_per_s, params.bbar
    return SimulationReport(
        scheduler=spec,
        workload=setup.workload.describe(),
        arrivals=setup.source,
        params=params,
        slots=summ.slots,
        window=out.window,
        window_hid_slots=out.window_hid_slots,
        scheduler_traits=traits_of(scheduler).tags(),
        warmup_fraction=setup.warmup,
        arrival_rate_per_s=setup.rate,
        fitting_rate_per_s=setup.fit_rate,
        offered_load_lambda_over_mu=setup.fit_rate / mu,
        arrived=summ.arrived,
        completed=completed,
        dropped_oversize=setup.plan.dropped,
        theory_workload=law.describe(),
        fit_probability=setup.fit_p,
        theory_note=(
            f"μ, E[g] and δ are of {law.describe()}: the law given s + o fitting in M (P = {setup.fit_p:.4g}), what "
            "reaches the server; λ/μ counts the requests that fit"
        ) if law is not setup.workload else None,
        throughput_per_slot=thr.value,
        throughput_per_slot_ci95=[thr.low, thr.high],
        throughput_per_s=thr.value / bbar,
        throughput_per_s_ci95=[thr.low / bbar, thr.high / bbar],
        queue_growth_per_slot=slope.value,
        queue_growth_per_slot_ci95=[slope.low, slope.high],
        in_system_at_end=summ.arrived - completed,
        memory_utilisation=summ.utilisation,
        preemptions=summ.preemptions,
        preemptions_per_completion=summ.preemptions / completed if completed else None,
        wasted_area_fraction=summ.waste_fraction,
        latency_slots=summ.latency,
        theory=th,
        certificate=setup.certificate,
        measured_over_mu=(thr.value / bbar) / mu,
        engine=out.engine,
        engine_reason=out.reason,
        wall_s=wall,
        prefix_caching=params.prefix_caching,
        lifecycle=lifecycle,
        mu_sharing_per_s=_mu_sharing(law, params, lifecycle) if params.prefix_caching else None,
    )


def _mu_sharing(law: Workload, params: ModelParams, lifecycle: str) -> float | None:
    """μ with sharing of ``law`` on ``params`` (req/s), or ``None`` where it has no closed form."""
    from kvstab.theory.sharing_area import mu_share

    got = mu_share(law, params, lifecycle)
    return got if got is not None and math.isfinite(got) else None
