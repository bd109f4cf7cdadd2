"""The Python loop around every compiled kernel, and the :class:`SimResult` it ends with.

A compiled kernel (:mod:`~kvstab.engine._kernel`, :mod:`~kvstab.engine._kernel_sglang`,
:mod:`~kvstab.engine._plugin_kernel`) runs slots from ``st[ST_T]`` towards a slot it is
given and returns a status.  :func:`drive` calls it batch by batch — :data:`BATCH` slots a
call, so that a progress bar moves and statistics stream — and does what every path does
between calls: raise the reference engine's exception at a violation, add the batch's
rows to the :class:`StreamStats`, report progress, stop at the horizon or a drain, and
refuse a run that does not drain within ``max_slots``.  :func:`finish` then adds the
streamed totals and builds the :class:`Summary` and (with ``record``) the
:class:`SimResult` from the request table.  The three paths differ only in the step
function they hand in (and the request table they read out); the two built-in kernels
run the whole sequence through :func:`run_kernel`.  Every path takes where the run stops
as a :class:`~kvstab.simulator.Horizon` and what it reports as a :class:`Reporting`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.engine import _kernel as K
from kvstab.engine import _layout as L
from kvstab.engine.stream import StreamStats, Summary
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.simulator import Horizon, SimResult
from kvstab.steplog import check_vllm_peaks

__all__ = [
    "BATCH", "Reporting", "KernelState", "Requests", "drive", "run_kernel", "finish", "check_plan", "violation",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
#: the streamed batch-means bins a kernel adds to (throughput, queue slope, parameters)
Bins = tuple[FloatArray, FloatArray, IntArray]
#: a kernel's step: run towards slot ``t_end``, rows into ``out`` (if it has width), the streamed
#: sums into the bins (if any); returns the kernel's status code
Step = Callable[[int, IntArray, "Bins | None"], int]

#: slots per call of a compiled loop: small enough for a responsive progress bar and little
#: memory when streaming, large enough that the call overhead vanishes
BATCH = 1 << 16


@dataclass(frozen=True, slots=True)
class Reporting:
    """What a run reports besides its end: the per-slot arrays (``record``), ``progress(slot, total)``
    after every batch, and the summary's steady window (the ``warmup`` fraction left out, ``batches``
    batch means)."""

    record: bool = True
    progress: Callable[[int, int | None], None] | None = None
    warmup: float = 0.25
    batches: int = 20

    def stats(self, M: int, horizon: int | None) -> StreamStats:
        """The streamed statistics of a run on capacity ``M`` (``horizon``: its length when fixed)."""
        return StreamStats(M, horizon, self.warmup, self.batches, keep_all=self.record)


class KernelState:
    """What the driver reads of a compiled kernel's state between calls: its scalar state ``st``
    (:mod:`~kvstab.engine._layout`'s ``ST_*``) and its request table ``R``, whose list of actives
    sits at the same rows in every kernel."""

    st: IntArray
    R: IntArray
    #: the work counters the kernel reports (name, index into ``st``)
    WORK: tuple[tuple[str, int], ...] = ()

    @property
    def t(self) -> int:
        """The next slot to run."""
        return int(self.st[L.ST_T])

    @property
    def arrived(self) -> int:
        """How many requests of the plan have arrived."""
        return int(self.st[L.ST_I])

    def sync(self) -> None:
        """Bring the lazy decoders' progress and areas up to the current slot."""

    def active(self) -> IntArray:
        """Ids of the active requests, in the kernel's order (their areas brought up to date)."""
        self.sync()
        return np.asarray(K.active_ids(self.R, self.st))

    def requests(self) -> Requests:
        """The request table's columns, as :func:`finish` reads them."""
        raise NotImplementedError

    def work(self) -> dict[str, int]:
        """What the run cost so far (slots run one by one and skipped, events, …)."""
        return {name: int(self.st[k]) for name, k in self.WORK}


@dataclass(frozen=True, slots=True)
class Requests:
    """The per-request columns a run ends with (each at least as long as the requests arrived)."""

    s: IntArray
    o: IntArray
    arrival: IntArray
    first: IntArray
    finish: IntArray
    npre: IntArray
    served: IntArray
    wasted: IntArray


def drive(
    step: Step,
    st: IntArray,
    stats: StreamStats,
    *,
    rows: int,
    horizon: int,
    fixed: bool,
    max_slots: int,
    progress: Callable[[int, int | None], None] | None,
    on_violation: Callable[[], Exception],
    streamed: bool = True,
) -> Bins | None:
    """Run ``step`` batch by batch from ``st[ST_T]`` to ``horizon`` (``fixed``) or to a drain;
    returns the kernel bins it streamed into (``None``: every row went through ``stats``).

    ``rows`` is the height of the kernel's row block; with ``streamed`` a fixed horizon that
    keeps no rows lets the kernel add the batch-means sums itself (``stats.kernel_bins``)."""
    bins = stats.kernel_bins() if streamed else None
    width = 0 if bins is not None else min(BATCH, max(horizon, 1))
    out = np.zeros((rows, width), dtype=np.int64)
    while True:
        t0 = int(st[L.ST_T])
        if width:
            out[:] = 0
        status = step(min(t0 + BATCH, horizon), out, bins)
        if status == L.VIOLATION:
            raise on_violation()
        t = int(st[L.ST_T])
        if width:
            stats.add(out[:, : t - t0])
        if progress is not None:
            progress(t, horizon if fixed else None)
        if status == L.DRAINED or (fixed and t >= horizon):
            break
        if t >= max_slots:
            raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
    if bins is not None:
        stats.add_streamed(t, int(st[L.ST_I]), int(st[L.ST_DONE]), int(st[L.ST_MEMSUM]))
    return bins


def run_kernel(
    state: KernelState,
    step: Step,
    name: str,
    params: ModelParams,
    dropped: int,
    h: Horizon,
    rep: Reporting,
    *,
    rows: int,
    work: dict[str, int] | None = None,
) -> tuple[Summary, SimResult | None]:
    """A built-in rule's compiled run, from ``state`` to ``h``'s end: ``step`` (the kernel) driven
    batch by batch (:func:`drive`; at a violation, the reference engine's exception naming the rule
    ``name``), the lazy decoders brought up to date, ``work`` (if given) filled with the kernel's
    counters, and the summary and result :func:`finish` builds (``dropped``: requests the plan left out)."""
    stats = rep.stats(params.M, h.end if h.fixed else None)
    drive(step, state.st, stats, rows=rows, horizon=h.end, fixed=h.fixed, max_slots=h.max_slots,
          progress=rep.progress, on_violation=lambda: violation(state, name, params))  # fmt: skip
    state.sync()
    if work is not None:
        work.update(state.work())
    return finish(stats, name, params, state.t, state.arrived, state.requests(), dropped, rep.record)


def finish(
    stats: StreamStats,
    name: str,
    params: ModelParams,
    slots: int,
    n: int,
    req: Requests,
    dropped: int,
    record: bool,
    **extra: int,
) -> tuple[Summary, SimResult | None]:
    """The run's :class:`Summary` and (with ``record``) its :class:`SimResult`, from the first ``n``
    requests of ``req`` (``extra``: further SimResult fields, e.g. the plug-in path's window)."""
    arrival = req.arrival[:n].copy()
    finish_ = req.finish[:n].copy()
    summary = stats.summary(arrival, finish_, req.wasted[:n], req.served[:n], req.npre[:n], slots)
    if not record:
        return summary, None
    cols = stats.columns()
    result = SimResult(
        scheduler=name,
        params=params,
        slots=slots,
        arrived=cols["arrived"],
        admitted=cols["admitted"],
        preempted=cols["preempted"],
        completed=cols["completed"],
        running=cols["running"],
        memory=cols["memory"],
        wasted=cols["wasted"],
        tokens=cols["tokens"],
        queue=cols["queue"],
        s=req.s[:n].copy(),
        o=req.o[:n].copy(),
        arrival=arrival,
        first_admit=req.first[:n].copy(),
        finish=finish_,
        preemptions=req.npre[:n].copy(),
        served=req.served[:n].copy(),
        request_wasted=req.wasted[:n].copy(),
        dropped=dropped,
        **extra,  # type: ignore[arg-type]
    )
    return summary, result


def violation(state: KernelState, scheduler: str, params: ModelParams) -> InvariantViolation:
    """The reference engine's exception for the violation a compiled loop stopped at."""
    st = state.st
    running = tuple(int(r) for r in state.active())
    kind, t, value = (int(st[k]) for k in (L.ST_VKIND, L.ST_VSLOT, L.ST_VVALUE))
    ids = ", ".join(str(r) for r in running[:12])
    shown = f"[{ids}{', …' if len(running) > 12 else ''}] ({len(running)} in all)"
    if kind == L.V_MEMORY:
        msg = f"slot {t}: scheduler {scheduler!r} uses {value} tokens of KV memory, M={params.M} (active requests {shown})"
    elif kind == L.V_SEQS:
        msg = f"slot {t}: scheduler {scheduler!r} runs {value} requests, more than max_num_seqs={params.max_num_seqs}"
    else:
        msg = (
            f"slot {t}: scheduler {scheduler!r} processes {value} tokens, more than the token budget "
            f"{params.token_budget} (a rule that ignores the budget breaks it)"
        )
    memory = int(st[L.ST_VMEM])  # the slot's memory, whatever was broken (as the reference reports it)
    return InvariantViolation(msg, slot=t, memory=memory, capacity=params.M, requests=running)


def check_plan(plan: ArrivalPlan, params: ModelParams, lifecycle: str) -> ArrivalPlan:
    """The reference engine's admission checks on arrival, for the whole plan at once."""
    if lifecycle == "kvstab":
        return plan.fit_to(params)
    # vLLM's lifecycle: (s, o) is the kvstab request (s, o - 1), peak s + o - 1
    check_vllm_peaks(plan, params.block, params.M, "M", "vLLM could never finish it")
    return plan
