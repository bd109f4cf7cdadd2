"""One simulation point: the only place the audit and the sweep run a simulation.

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
import time
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, prefill_slots
from kvstab.workload import Workload, parse_workload

__all__ = ["Point", "PointResult", "run_point", "derive_seed", "load_workload", "BATCHES", "SERIES_POINTS"]

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
    from kvstab.arrivals import poisson_arrivals
    from kvstab.engine import run

    t0 = time.perf_counter()
    sched = scheduler if scheduler is not None else _scheduler(point.scheduler)
    workload = load_workload(point.workload)
    plan = poisson_arrivals(workload, point.rate, point.params, point.slots, seed=point.seed)
    if point.drop_oversize:
        plan = plan.fit_to(point.params, drop_oversize=True)
    out = run(sched, point.params, plan, point.slots, engine="auto")
    res = out.result
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
