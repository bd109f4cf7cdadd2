"""Estimators over a replay: saturated service rate, queue growth, and ``b̄``.

The saturated rate is what the paper calls ``μ_gpu``: completions per step
(or per second) over the steady-state window of an overloaded run — the first
``warmup`` fraction of the steps is dropped (the system fills up), and the run
stops at its horizon while the queue is still growing, so no drain is counted.
Confidence intervals come from batch means (:func:`kvstab.metrics.batch_means`);
no seeded golden numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from kvstab.errors import InvalidArgument
from kvstab.metrics import Estimate, batch_means
from kvstab.steplog import StepLog

__all__ = [
    "window",
    "saturated_rate",
    "saturated_rate_per_second",
    "queue_growth",
    "BatchTimeSummary",
    "bbar_estimates",
    "relative_gap",
]


def window(log: StepLog, warmup: float = 0.25) -> slice:
    """The steady-state window: the steps after the ``warmup`` fraction."""
    if not 0 <= warmup < 1:
        raise InvalidArgument(f"warm-up fraction must be in [0, 1), got {warmup!r}")
    start = int(log.steps * warmup)
    if log.steps - start < 8:
        raise InvalidArgument(
            f"a steady-state window needs at least 8 steps, the run has {log.steps} with warm-up {warmup}"
        )
    return slice(start, log.steps)


def saturated_rate(log: StepLog, warmup: float = 0.25, batches: int = 20) -> Estimate:
    """Completed requests per step over the steady-state window, with a batch-means CI."""
    return batch_means(log.completed[window(log, warmup)], batches)


def saturated_rate_per_second(
    log: StepLog, step_times: npt.ArrayLike, warmup: float = 0.25, batches: int = 20
) -> Estimate:
    """Completed requests per second over the window when step ``t`` lasts
    ``step_times[t]``: a ratio estimator (completions / time) per batch."""
    w = window(log, warmup)
    c = log.completed[w].astype(np.float64)
    dt = np.asarray(step_times, dtype=np.float64)[w]
    if dt.size != c.size or np.any(dt <= 0):
        raise InvalidArgument("step times must be positive, one per step")
    batches = max(2, min(batches, c.size // 2))
    size = c.size // batches
    cb = c[: size * batches].reshape(batches, size).sum(axis=1)
    tb = dt[: size * batches].reshape(batches, size).sum(axis=1)
    centre = float(c.sum() / dt.sum())
    ratios = cb / tb
    half = float(stats.t.ppf(0.975, batches - 1) * ratios.std(ddof=1) / np.sqrt(batches))
    return Estimate(centre, centre - half, centre + half)


def queue_growth(log: StepLog, warmup: float = 0.25, batches: int = 20) -> Estimate:
    """Growth of the number in system per step over the window (batch-means CI).

    Below ``μ`` the interval covers 0; above it the slope estimates ``λ − μ``.
    """
    n = log.in_system.astype(np.float64)
    w = window(log, warmup)
    return batch_means(np.diff(n[max(0, w.start - 1) : w.stop]), batches)


@dataclass(frozen=True, slots=True)
class BatchTimeSummary:
    """``b̄`` estimated from step times (seconds)."""

    median: float
    trimmed_mean: float
    mean: float
    trim: float
    steps: int

    def as_dict(self) -> dict[str, float]:
        """Plain values for reports."""
        return {"median": self.median, "trimmed_mean": self.trimmed_mean, "mean": self.mean, "trim": self.trim}


def bbar_estimates(step_times: npt.ArrayLike, trim: float = 0.1) -> BatchTimeSummary:
    """``b̄`` as the median and as the ``trim``-trimmed mean of the step times
    (the paper's choice when batch times are heavy-tailed)."""
    x = np.asarray(step_times, dtype=np.float64)
    if x.size == 0:
        raise InvalidArgument("no step times to estimate b̄ from")
    if not 0 <= trim < 0.5:
        raise InvalidArgument(f"trim fraction must be in [0, 0.5), got {trim!r}")
    return BatchTimeSummary(
        median=float(np.median(x)),
        trimmed_mean=float(stats.trim_mean(x, trim)),
        mean=float(x.mean()),
        trim=trim,
        steps=int(x.size),
    )


def relative_gap(predicted: float, measured: float) -> float:
    """``(predicted − measured) / measured``, the paper's gap with its sign kept."""
    if measured == 0:
        raise InvalidArgument("measured rate is 0: the run completed nothing in its window")
    return (predicted - measured) / measured
