"""Estimators over a simulation run: throughput, queue growth, utilisation.

Statistics on autocorrelated series use batch means: the steady-state window
is cut into equal batches, and the batch averages are treated as roughly
independent, giving a Student-t confidence interval.  No seeded golden numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from kvstab.errors import InvalidArgument
from kvstab.simulator import SimResult

__all__ = ["Estimate", "against_threshold", "batch_means", "throughput", "queue_slope", "utilisation", "steady_window",
           "hit_tokens"]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with a two-sided confidence interval."""

    value: float
    low: float
    high: float
    level: float = 0.95

    def excludes_zero(self) -> bool:
        """Whether the interval lies strictly on one side of zero."""
        return self.low > 0 or self.high < 0

    def scaled(self, k: float) -> Estimate:
        """The estimate times a positive constant (e.g. per slot → per second)."""
        return Estimate(self.value * k, self.low * k, self.high * k, self.level)


def batch_means(x: npt.ArrayLike, batches: int = 20, level: float = 0.95) -> Estimate:
    """Mean of ``x`` with a batch-means confidence interval."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.size < 2 * batches:
        batches = max(2, arr.size // 2)
    if arr.size < 4:
        raise InvalidArgument(f"need at least 4 observations for a confidence interval, got {arr.size}")
    size = arr.size // batches
    means = arr[: size * batches].reshape(batches, size).mean(axis=1)
    centre = float(arr[: size * batches].mean())
    half = float(stats.t.ppf(0.5 + level / 2, batches - 1) * means.std(ddof=1) / np.sqrt(batches))
    return Estimate(centre, centre - half, centre + half, level)


def steady_window(result: SimResult, warmup: float = 0.25) -> slice:
    """Slots after the warm-up fraction (the whole run is one window by default)."""
    if not 0 <= warmup < 1:
        raise InvalidArgument(f"warm-up fraction must be in [0, 1), got {warmup!r}")
    start = int(result.slots * warmup)
    return slice(start, result.slots)


def throughput(result: SimResult, warmup: float = 0.25, batches: int = 20) -> Estimate:
    """Completed requests per slot over the steady-state window."""
    return batch_means(result.completed[steady_window(result, warmup)], batches)


def hit_tokens(result: SimResult, lifecycle: str = "kvstab", warmup: float = 0.25, batches: int = 20) -> Estimate:
    """Prompt tokens found in the prefix cache per request first admitted in the steady-state window.

    A run records no hit per request, but it records the tokens computed per slot: a request admitted
    in a batch computes ``s − h + o`` tokens (``o − 1`` decode steps under vLLM's lifecycle), so
    per batch ``Σ(s + o) − Σ tokens`` over its admissions and its slots is ``Σ h`` up to the work in
    flight at the batch's two ends, which telescopes over the window (a noise the batch-means
    interval carries, not a bias).  Exact only without preemptions: a preempted request's recomputed
    tokens count as misses, so the estimate is then low."""
    if lifecycle not in ("kvstab", "vllm"):
        raise InvalidArgument(f"lifecycle must be 'kvstab' or 'vllm', got {lifecycle!r}")
    win = steady_window(result, warmup)
    t0, t1 = win.start, win.stop
    if t1 - t0 < 2 * batches:
        raise InvalidArgument(f"need at least {2 * batches} slots after the warm-up for {batches} batches")
    first = result.first_admit
    ok = (first >= t0) & (first < t1)
    work = (result.s[ok] + result.o[ok] - (1 if lifecycle == "vllm" else 0)).astype(np.float64)
    size = (t1 - t0) // batches
    at = first[ok] - t0
    keep = at < size * batches
    work_b = np.bincount(at[keep] // size, weights=work[keep], minlength=batches)
    count_b = np.bincount(at[keep] // size, minlength=batches).astype(np.float64)
    tok_b = result.tokens[t0 : t0 + size * batches].astype(np.float64).reshape(batches, size).sum(axis=1)
    if np.any(count_b == 0):
        raise InvalidArgument("a batch of the window admitted no request: run longer or use fewer batches")
    per = (work_b - tok_b) / count_b
    centre = float((work_b.sum() - tok_b.sum()) / count_b.sum())
    half = float(stats.t.ppf(0.975, batches - 1) * per.std(ddof=1) / np.sqrt(batches))
    return Estimate(centre, centre - half, centre + half)


def queue_slope(result: SimResult, warmup: float = 0.25, batches: int = 20) -> Estimate:
    """Growth of the number in system per slot (mean increment, batch-means CI)."""
    n = result.in_system.astype(np.float64)
    inc = np.diff(n[steady_window(result, warmup)])
    return batch_means(inc, batches)


def utilisation(result: SimResult, warmup: float = 0.25) -> float:
    """Mean memory used over ``M`` in the steady-state window."""
    return float(result.memory[steady_window(result, warmup)].mean() / result.params.M)


def against_threshold(growth: Estimate, h: float, unit: str = "/s", digits: int = 4) -> str:
    """A queue growth beside the threshold ``h`` it is classified against, and the reading.

    A critical-rate search calls a rate unstable when its growth exceeds ``h``, not
    zero (above ``λ*`` the growth is ``λ − λ*``, so the search aims at ``λ* + h``): an
    interval wholly above zero but below ``h`` is *stable*.  Printing ``h`` and the side
    the interval (or, when the interval straddles ``h``, the point estimate) lies on
    keeps such a line from reading as a contradiction.
    """
    v, lo, hi = growth.value, growth.low, growth.high
    verdict = "unstable" if v > h else "stable"
    side = "above" if v > h else "below"
    if lo > h or hi < h:
        why = f"interval {side} h"
    else:
        why = f"point estimate {side} h; the interval straddles h"
    return (
        f"growth {v:+.{digits}g} [{lo:+.{digits}g}, {hi:+.{digits}g}]{unit} vs h = {h:+.{digits}g}{unit} "
        f"→ {verdict} ({why})"
    )
