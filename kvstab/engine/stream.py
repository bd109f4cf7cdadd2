"""Summary statistics of a run, computed while it streams.

A run of 10⁷ slots would need ~0.7 GB for its nine per-slot series; the
statistics users ask of a long run need far less.  :class:`StreamStats`
receives the per-slot rows batch by batch and keeps, for a fixed horizon,
only the batch sums that :mod:`kvstab.metrics`' batch-means estimators use
(the batch boundaries are known in advance, so nothing else is needed); a
drained run (horizon unknown) keeps three compact int32 series instead.  The
estimators are the same ones :mod:`kvstab.metrics` computes — same steady
window, same batches, same Student-t interval — so a streamed summary and one
computed from a recorded :class:`~kvstab.simulator.SimResult` agree to
rounding (``tests/test_engine_stream.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy import stats

from kvstab.engine import _layout as L
from kvstab.errors import InvalidArgument
from kvstab.metrics import Estimate, batch_means
from kvstab.simulator import SimResult

__all__ = ["Summary", "StreamStats"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Summary:
    """What a long run is read for (per-slot figures; multiply by ``1/b̄`` for seconds)."""

    slots: int = field(metadata={"help": "slots run"})
    arrived: int = field(metadata={"help": "requests that arrived"})
    completed: int = field(metadata={"help": "requests that finished"})
    throughput: Estimate | None = field(metadata={"help": "completions per slot in the steady window (batch means)"})
    queue_slope: Estimate | None = field(metadata={"help": "growth of the number in system per slot (batch means)"})
    utilisation: float = field(metadata={"help": "mean memory / M in the steady window"})
    wasted: int = field(metadata={"help": "area thrown away by preemptions (token·slots)"})
    served: int = field(metadata={"help": "all area served, wasted attempts included"})
    preemptions: int = field(metadata={"help": "preemptions in all"})
    latency: dict[str, float] = field(
        metadata={"help": "percentiles p50/p90/p99/max of finish − arrival + 1 (slots) over finished requests"}
    )

    @property
    def waste_fraction(self) -> float:
        """Wasted area over all area served (0 when nothing was served)."""
        return self.wasted / self.served if self.served else 0.0


def _latency(arrival: IntArray, finish: IntArray) -> dict[str, float]:
    done = finish >= 0
    if not done.any():
        return {}
    lat = (finish[done] - arrival[done] + 1).astype(np.float64)
    p50, p90, p99 = np.percentile(lat, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(lat.max())}


def _maybe(x: npt.NDArray[np.float64] | IntArray, batches: int) -> Estimate | None:
    """``batch_means`` where it is defined (it needs at least 4 observations)."""
    return batch_means(x, batches) if np.asarray(x).size >= 4 else None


class _Bins:
    """Batch sums of one series over ``[first, first + length)``, cut as
    :func:`kvstab.metrics.batch_means` cuts it."""

    def __init__(self, first: int, length: int, batches: int) -> None:
        self.first = first
        self.length = length
        b = batches
        if length < 2 * b:
            b = max(2, length // 2)
        self.batches = b
        self.size = length // b if length >= 4 else 0
        self.sums = np.zeros(max(b, 1), dtype=np.float64)

    def add(self, t0: int, values: IntArray) -> None:
        """``values[k]`` is the series at slot ``t0 + k``."""
        if self.size == 0:
            return
        lo = max(t0, self.first)
        hi = min(t0 + values.size, self.first + self.size * self.batches)
        if hi <= lo:
            return
        idx = (np.arange(lo, hi) - self.first) // self.size
        self.sums += np.bincount(idx, weights=values[lo - t0 : hi - t0].astype(np.float64), minlength=self.batches)[
            : self.batches
        ]

    def estimate(self, level: float = 0.95) -> Estimate | None:
        """The batch-means estimate (the formula of :func:`kvstab.metrics.batch_means`)."""
        if self.size == 0:
            return None
        means = self.sums / self.size
        centre = float(self.sums.sum() / (self.size * self.batches))
        half = float(stats.t.ppf(0.5 + level / 2, self.batches - 1) * means.std(ddof=1) / np.sqrt(self.batches))
        return Estimate(centre, centre - half, centre + half, level)


class StreamStats:
    """Accumulates the per-slot rows of a run (blocks of :data:`_kernel.COLUMNS`)."""

    def __init__(self, M: int, horizon: int | None, warmup: float, batches: int, *, keep_all: bool) -> None:
        if not 0 <= warmup < 1:
            raise InvalidArgument(f"warm-up fraction must be in [0, 1), got {warmup!r}")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 2:
            raise InvalidArgument(f"batches must be an integer >= 2, got {batches!r}")
        self.M = M
        self.horizon = horizon
        self.warmup = warmup
        self.batches = batches
        self.keep_all = keep_all
        self.t = 0
        self.blocks: list[IntArray] = []
        self.compact: list[npt.NDArray[np.int32]] = []  # arrived, completed, memory (drained runs)
        self.arrived = 0
        self.completed = 0
        self.bins: tuple[_Bins, _Bins] | None = None
        self.mem_sum = 0
        if horizon is not None and not keep_all:
            start = int(horizon * warmup)
            length = horizon - start
            self.start = start
            # throughput: completed[start:]; queue slope: in_system increments at slots start+1 …
            self.bins = (_Bins(start, length, batches), _Bins(start + 1, max(length - 1, 0), batches))

    def add(self, block: IntArray) -> None:
        """The rows of slots ``self.t`` … ``self.t + width − 1``."""
        w = block.shape[1]
        if w == 0:
            return
        arrived, completed, memory = block[0], block[3], block[5]
        self.arrived += int(arrived.sum())
        self.completed += int(completed.sum())
        if self.keep_all:
            self.blocks.append(block[:9].copy())
        elif self.bins is not None:
            self.bins[0].add(self.t, completed)
            self.bins[1].add(self.t, arrived - completed)
            lo = max(self.t, self.start)
            if lo < self.t + w:
                self.mem_sum += int(memory[lo - self.t :].sum())
        else:
            self.compact.append(np.stack([arrived, completed, memory]).astype(np.int32))
        self.t += w

    def kernel_bins(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], IntArray] | None:
        """For a streamed fixed horizon, the arrays the compiled engine adds to directly — the
        throughput and queue-slope batch sums and their cuts (:data:`_kernel.BP_SIZE` ints) —
        so that no per-slot row is made; ``None`` otherwise (rows go through :meth:`add`)."""
        if self.bins is None:
            return None
        thr, slope = self.bins
        bp = np.zeros(L.BP_SIZE, dtype=np.int64)
        bp[L.BP_ON] = 1
        bp[L.BP_F1], bp[L.BP_S1], bp[L.BP_N1] = thr.first, thr.size, thr.batches
        bp[L.BP_F2], bp[L.BP_S2], bp[L.BP_N2] = slope.first, slope.size, slope.batches
        bp[L.BP_MEM] = self.start
        return thr.sums, slope.sums, bp

    def add_streamed(self, slots: int, arrived: int, completed: int, mem_sum: int) -> None:
        """The totals of a run whose batch sums went to :meth:`kernel_bins`' arrays."""
        self.t = slots
        self.arrived = arrived
        self.completed = completed
        self.mem_sum = mem_sum

    def columns(self) -> dict[str, IntArray]:
        """The recorded per-slot series (``keep_all`` only)."""
        names = L.COLUMNS[:9]
        if not self.blocks:
            return {n: np.zeros(0, dtype=np.int64) for n in names}
        whole = np.concatenate(self.blocks, axis=1)
        return {n: np.ascontiguousarray(whole[k]) for k, n in enumerate(names)}

    def summary(
        self, arrival: IntArray, finish: IntArray, wasted: IntArray, served: IntArray, npre: IntArray, slots: int
    ) -> Summary:
        """The summary of the run so far (``slots`` run in all)."""
        if self.bins is not None:
            length = slots - self.start
            thr, slope = self.bins[0].estimate(), self.bins[1].estimate()
            util = self.mem_sum / length / self.M if length > 0 else 0.0
        else:
            if self.keep_all:
                cols = self.columns()
                arr, comp, mem = cols["arrived"], cols["completed"], cols["memory"]
            elif self.compact:
                whole = np.concatenate(self.compact, axis=1).astype(np.int64)
                arr, comp, mem = whole[0], whole[1], whole[2]
            else:
                arr = comp = mem = np.zeros(0, dtype=np.int64)
            thr, slope, util = _series_estimates(arr, comp, mem, self.M, self.warmup, self.batches)
        return Summary(
            slots=slots,
            arrived=self.arrived,
            completed=self.completed,
            throughput=thr,
            queue_slope=slope,
            utilisation=util,
            wasted=int(wasted.sum()),
            served=int(served.sum()),
            preemptions=int(npre.sum()),
            latency=_latency(arrival, finish),
        )

    @staticmethod
    def of_result(res: SimResult, fixed: bool, warmup: float = 0.25, batches: int = 20) -> Summary:
        """The summary of a recorded run (any engine)."""
        thr, slope, util = _series_estimates(res.arrived, res.completed, res.memory, res.params.M, warmup, batches)
        return Summary(
            slots=res.slots,
            arrived=int(res.arrived.sum()),
            completed=int(res.completed.sum()),
            throughput=thr,
            queue_slope=slope,
            utilisation=util,
            wasted=int(res.request_wasted.sum()),
            served=int(res.served.sum()),
            preemptions=int(res.preemptions.sum()),
            latency=_latency(res.arrival, res.finish),
        )


def _series_estimates(
    arrived: IntArray, completed: IntArray, memory: IntArray, M: int, warmup: float, batches: int
) -> tuple[Estimate | None, Estimate | None, float]:
    """Throughput, queue slope and utilisation as :mod:`kvstab.metrics` computes them."""
    slots = arrived.size
    start = int(slots * warmup)
    in_system = np.cumsum(arrived) - np.cumsum(completed)
    thr = _maybe(completed[start:], batches)
    slope = _maybe(np.diff(in_system[start:].astype(np.float64)), batches)
    util = float(memory[start:].mean() / M) if slots > start else 0.0
    return thr, slope, util
