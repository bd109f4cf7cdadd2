"""Arrivals to a fleet, in continuous time (seconds).

A fleet's replicas run on different clocks (slot lengths ``b̄_i``), so the
fleet's arrivals are times in seconds, not slots; each replica maps a request
it receives at time ``t`` to its own slot ``⌊t/b̄_i⌋`` (as
:func:`kvstab.arrivals.trace_arrivals` maps a trace).

* :func:`poisson_times`: a Poisson stream of rate ``λ`` over ``[0, H)``.
* :func:`piecewise_poisson`: a Poisson stream whose rate is constant within
  each window and follows a given sequence of window rates — e.g. a trace's own
  arrival rate per window (:func:`window_rates`), which keeps the trace's
  non-stationarity while drawing fresh, seeded arrivals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.prefix import PromptSet
from kvstab.prefix_laws import Conversation
from kvstab.traces import Trace
from kvstab.validation import MAX_RATE, positive_float
from kvstab.workload import Workload

__all__ = ["FleetArrivals", "poisson_times", "trace_rows_poisson", "piecewise_poisson", "window_rates", "peak_window", "MAX_FLEET_REQUESTS"]

#: the most requests one fleet run may be expected to hold (three arrays of this
#: length are ~0.7 GB; a larger run is a mistake, not a study)
MAX_FLEET_REQUESTS = 3 * 10**7

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class FleetArrivals:
    """Requests in arrival order: request ``k`` arrives at ``time[k]`` seconds."""

    time: FloatArray
    s: IntArray
    o: IntArray
    horizon_s: float
    #: the requests' prompt content, for replicas with prefix caching (``None``: every prompt its own)
    prompts: PromptSet | None = None

    def __post_init__(self) -> None:
        n = self.time.size
        if self.s.size != n or self.o.size != n:
            raise InvalidArgument("fleet arrivals: time, s and o must have the same length")
        if self.prompts is not None and len(self.prompts) != n:
            raise InvalidArgument(f"fleet arrivals: {len(self.prompts)} prompts for {n} requests")
        if n and (np.any(np.diff(self.time) < 0) or self.time[0] < 0 or not np.all(np.isfinite(self.time))):
            raise InvalidArgument("fleet arrivals: times must be finite, non-negative and non-decreasing")
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise InvalidArgument(f"fleet arrivals: the horizon must be a positive number of seconds, got {self.horizon_s!r}")

    def __len__(self) -> int:
        return int(self.time.size)


def _expect(expected: float) -> None:
    if expected > MAX_FLEET_REQUESTS:
        raise InvalidArgument(
            f"the run would draw about {expected:.3g} requests, more than a fleet run holds ({MAX_FLEET_REQUESTS:.0e}); "
            "lower the rate or the horizon"
        )


def _prompts(workload: Workload, rng: np.random.Generator, s: IntArray, wanted: bool) -> PromptSet | None:
    """The prompts of the workload's prefix law for lengths ``s`` (drawn after the lengths, so the times
    and lengths are those drawn without them), where ``wanted`` and the workload has one."""
    if not wanted or workload.prefix is None:
        return None
    if isinstance(workload.prefix, Conversation):
        raise InvalidArgument(
            "prefix=chat(K,T): a fleet's arrivals are a stream of single requests, and a conversation's turns "
            "arrive one after another; with prefix caching a fleet takes prefix=shared, tenants or fewshot"
        )
    return workload.prefix.prompts(rng, s)


def poisson_times(workload: Workload, rate: float, horizon_s: float, seed: int = 0, *,
                  prompts: bool = False) -> FleetArrivals:
    """A Poisson stream of rate ``rate`` (req/s) over ``[0, horizon_s)``, lengths i.i.d. from ``workload``
    (with ``prompts``, their content from its prefix law too: for replicas with prefix caching)."""
    rate = positive_float("the arrival rate λ", rate, maximum=MAX_RATE)
    horizon_s = positive_float("the horizon (seconds)", horizon_s, maximum=1e9)
    _expect(rate * horizon_s)
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * horizon_s))
    # given the count, Poisson arrival times are uniform order statistics
    time = np.sort(rng.uniform(0.0, horizon_s, size=n))
    s, o = workload.sample(rng, n)
    s = np.asarray(s, dtype=np.int64)
    return FleetArrivals(time, s, np.asarray(o, dtype=np.int64), float(horizon_s), _prompts(workload, rng, s, prompts))


def trace_rows_poisson(trace: Trace, rate: float, horizon_s: float, seed: int = 0, *,
                       prompts: bool = False) -> FleetArrivals:
    """A Poisson stream of rate ``rate`` over ``[0, horizon_s)`` whose requests are a trace's rows in the
    trace's own order, from a seeded random row on (wrapping round at its end): their lengths, and with
    ``prompts`` their prompts (a Mooncake trace's ``hash_ids``).  The rate is the one chosen, not the
    trace's; the order keeps the trace's locality (a conversation's turns follow each other), which
    i.i.d. draws of its rows would scatter."""
    rate = positive_float("the arrival rate λ", rate, maximum=MAX_RATE)
    horizon_s = positive_float("the horizon (seconds)", horizon_s, maximum=1e9)
    _expect(rate * horizon_s)
    if len(trace) == 0:
        raise InvalidArgument(f"trace {trace.path} has no rows")
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate * horizon_s))
    time = np.sort(rng.uniform(0.0, horizon_s, size=n))
    rows = (int(rng.integers(len(trace))) + np.arange(n, dtype=np.int64)) % len(trace)
    content = trace.prompts.take(rows) if prompts and trace.prompts is not None else None
    return FleetArrivals(time, trace.s[rows].astype(np.int64), trace.o[rows].astype(np.int64), float(horizon_s),
                         content)


def piecewise_poisson(workload: Workload, rates: npt.ArrayLike, window_s: float, seed: int = 0, *,
                      prompts: bool = False) -> FleetArrivals:
    """Poisson arrivals with rate ``rates[w]`` in window ``[w·W, (w+1)·W)``; the
    horizon is ``len(rates)·W``.  A window of rate 0 gets no arrivals.  ``prompts``: as
    :func:`poisson_times`."""
    window_s = positive_float("the window (seconds)", window_s, maximum=1e9)
    r = np.asarray(rates, dtype=np.float64).ravel()
    if r.size == 0 or not np.all(np.isfinite(r)) or np.any(r < 0) or r.max() > MAX_RATE or r.max() == 0:
        raise InvalidArgument("window rates must be finite, >= 0, not all zero, and at most 1e9 req/s")
    _expect(float(r.sum() * window_s))
    rng = np.random.default_rng(seed)
    counts = rng.poisson(r * window_s)
    start = np.repeat(np.arange(r.size, dtype=np.float64) * window_s, counts)
    time = np.sort(start + rng.uniform(0.0, window_s, size=start.size))
    s, o = workload.sample(rng, int(time.size))
    s = np.asarray(s, dtype=np.int64)
    return FleetArrivals(time, s, np.asarray(o, dtype=np.int64), float(r.size * window_s),
                         _prompts(workload, rng, s, prompts))


def window_rates(trace: Trace, window_s: float) -> FloatArray:
    """A trace's own arrival rate (req/s) in consecutive windows of ``window_s``
    seconds from its first arrival (the last window is counted over its full length)."""
    if trace.arrival is None:
        raise InvalidArgument(f"trace {trace.path} records no arrival times; its rate per window is unknown")
    window_s = positive_float("the window (seconds)", window_s, maximum=1e9)
    t = np.asarray(trace.arrival, dtype=np.float64)
    t = t - t.min()
    span = float(t.max())
    n = max(1, int(math.ceil(span / window_s)) if span > 0 else 1)
    counts = np.bincount(np.minimum((t // window_s).astype(np.int64), n - 1), minlength=n).astype(np.float64)
    # every window counts over its full length: a last window cut short by the
    # trace's end would otherwise inflate the peak with a handful of requests
    return counts / window_s


def peak_window(rates: npt.ArrayLike) -> tuple[int, float]:
    """``(index, rate)`` of the busiest window."""
    r = np.asarray(rates, dtype=np.float64)
    if r.size == 0:
        raise InvalidArgument("no windows to take a peak of")
    i = int(np.argmax(r))
    return i, float(r[i])
