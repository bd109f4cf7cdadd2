"""The fast engine's entry points: :func:`run`, :func:`simulate` and :func:`replay_model`.

:func:`run` is the one entry point: it picks the compiled fast path when the
scheduler is a built-in (exactly the built-in class — a subclass may change
``decide``), otherwise the plug-in path of :mod:`kvstab.engine.plugin`, or the
reference engine when neither is safe; the returned :class:`Run` says which
engine ran.  :func:`simulate` is a drop-in for :func:`kvstab.simulator.simulate`
(same arguments, same :class:`~kvstab.simulator.SimResult`, same
:class:`~kvstab.errors.InvariantViolation`), and :func:`replay_model` for
:func:`kvstab.empirical.replay.replay_model` (same :class:`StepLog`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import Scheduler
from kvstab.engine import _finish_tree
from kvstab.engine import _kernel as K
from kvstab.engine import _layout as L
from kvstab.engine import sglang as sgl
from kvstab.engine._drive import (
    BATCH,
    Bins,
    KernelState,
    Reporting,
    Requests,
    check_plan,
    run_kernel,
    violation,
)
from kvstab.engine._skeleton import config
from kvstab.engine.cached import run_cached, why_not_cached
from kvstab.engine.stream import StreamStats, Summary
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.lifecycles.sglang import SglangEngine
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.model import ModelParams
from kvstab.schedulers import CurrentFit, CurrentFitNoPreempt, Lookahead, Reserve, Sglang, VllmV1
from kvstab.simulator import Horizon, SimResult
from kvstab.simulator import simulate as reference_simulate
from kvstab.validation import MAX_SLOTS

__all__ = ["Run", "run", "simulate", "fast_rule", "has_fast_path", "Lifecycle", "EngineChoice", "BATCH", "finish_table"]

IntArray = npt.NDArray[np.int64]


@contextmanager
def finish_table(mode: tuple[int, int] | None) -> Iterator[None]:
    """Runs started inside keep ``lookahead``'s finish-time table where ``mode`` says
    (``_finish_tree.FORCE``: ``(tree_at, table_at)`` running, ``(0, -1)`` the tree from the first
    request; ``None``: as shipped), for the differential tests and the benchmarks; the previous
    setting comes back after, whatever happens.  (Here, not in ``_finish_tree``, whose text the
    kernels' cache guards hash.)"""
    old = _finish_tree.FORCE
    _finish_tree.FORCE = mode
    try:
        yield
    finally:
        _finish_tree.FORCE = old
Lifecycle = Literal["kvstab", "vllm", "sglang"]  # "sglang": SGLang's own, for the sglang rule only
EngineChoice = Literal["auto", "fast", "reference"]

#: the shortest run on which ``engine="auto"`` takes the plug-in path (measured in
#: benchmarks/bench_engine.py: taping the shapes a paper-scale run meets costs about a second)
PLUGIN_MIN_SLOTS = 20_000

_RULES: dict[type, int] = {
    CurrentFit: L.CURRENT_FIT,
    CurrentFitNoPreempt: L.NO_PREEMPT,
    Reserve: L.RESERVE,
    Lookahead: L.LOOKAHEAD,
    VllmV1: L.VLLM_V1,
}


def fast_rule(scheduler: object) -> int | None:
    """The compiled rule code for ``scheduler``, or ``None`` if it has no compiled
    fast path.  Only the built-in classes themselves qualify: they are frozen
    dataclasses, so their instances cannot carry another ``decide``."""
    return _RULES.get(type(scheduler))


def has_fast_path(scheduler: object) -> bool:
    """Whether ``scheduler`` has a compiled engine: a rule code of the shared kernel
    (:func:`fast_rule`), or ``sglang``'s own kernel (:mod:`kvstab.engine.sglang`)."""
    return fast_rule(scheduler) is not None or sgl.is_fast(scheduler)


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """One run of :func:`run`: which engine ran, the summary, and (when recorded)
    the full :class:`~kvstab.simulator.SimResult`."""

    engine: str = field(metadata={"help": "'fast' (compiled built-in), 'fast-plugin' or 'reference'"})
    summary: Summary = field(metadata={"help": "streamed statistics: batch means, utilisation, waste, latency"})
    result: SimResult | None = field(default=None, metadata={"help": "per-slot arrays (record=True only)"})
    wall_s: float = field(default=0.0, metadata={"help": "wall-clock seconds of the run"})
    reason: str = field(default="", metadata={"help": "why this engine was chosen"})


class _State(KernelState):
    """The flat arrays the compiled engine works on (one run).

    ``R`` is the request table (:data:`_kernel.NF` rows, one column per request);
    the attributes ``s``, ``o``, ``prog``, ``att``, ``served``, ``wasted``, ``npre``,
    ``first``, ``fin`` and ``recomp`` are views of its rows.  Lazy decoders carry
    their progress and areas as of the slot they were last touched: read them after
    :meth:`active` or :meth:`sync`, which bring them up to the current slot."""

    WORK = K.WORK

    def __init__(self, plan: ArrivalPlan) -> None:
        n = len(plan)
        self.pslot = np.ascontiguousarray(plan.slot, dtype=np.int64)
        self.ps = np.ascontiguousarray(plan.s, dtype=np.int64)
        self.po = np.ascontiguousarray(plan.o, dtype=np.int64)
        self.R = np.zeros((L.NF, n), dtype=np.int64)
        for f in (L.F_FIRST, L.F_FIN, L.F_NXT, L.F_PRV):
            self.R[f] = -1
        self.s, self.o, self.prog = self.R[L.F_S], self.R[L.F_O], self.R[L.F_PROG]
        self.att, self.served, self.wasted = self.R[L.F_ATT], self.R[L.F_SERVED], self.R[L.F_WASTED]
        self.npre, self.first, self.fin, self.recomp = (
            self.R[L.F_NPRE], self.R[L.F_FIRST], self.R[L.F_FIN], self.R[L.F_RECOMP]
        )  # fmt: skip
        self.qbuf = np.zeros(n + 1, dtype=np.int64)
        self.elist = np.zeros(n + 1, dtype=np.int64)
        self.hk = np.zeros(n + 1, dtype=np.int64)
        self.hid = np.zeros(n + 1, dtype=np.int64)
        self.ph = np.zeros(1, dtype=np.int64)  # sized for the block size at the first step
        self.B = 1
        self.st = np.zeros(L.ST_SIZE, dtype=np.int64)
        for f in (L.ST_AH, L.ST_AT, L.ST_LAH):
            self.st[f] = -1
        self.no_bins = (np.zeros(1), np.zeros(1), np.zeros(L.BP_SIZE, dtype=np.int64))
        self.ft = np.zeros((2, 1), dtype=np.int64)  # lookahead's finish tree, made at its first step
        self.ft_made = False

    def sync(self) -> None:
        """Bring the lazy decoders' progress and areas up to the current slot."""
        K.sync_lazy(self.R, self.st, self.B)

    def requests(self) -> Requests:
        """The request table's columns, as :func:`~kvstab.engine._drive.finish` reads them."""
        return Requests(self.s, self.o, self.pslot, self.first, self.fin, self.npre, self.served, self.wasted)

    def step(
        self,
        pol: int,
        life: int,
        params: ModelParams,
        check: bool,
        comp: bool,
        t_end: int,
        drain: bool,
        drain_min: int,
        out: IntArray,
        bins: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], IntArray] | None = None,
    ) -> int:
        """Run the compiled engine to ``t_end`` (rows into ``out`` if it has any width; the
        streamed batch-means sums into ``bins``); returns its status code."""
        B = params.block
        if self.ph.shape[0] != B and B <= K.LAZY_BMAX:
            self.ph = np.zeros(B, dtype=np.int64)  # the first step: nothing is lazy yet
        self.B = B
        if pol == L.LOOKAHEAD and not self.ft_made:
            self.ft_made = True
            # a ring that holds every request's whole life (prefill chunks, then decode units)
            longest = int((-(-self.ps // params.chunk) + self.po).max(initial=0))
            W = _finish_tree.ring_for(longest)
            if W:
                mean_o = float(self.po.mean()) if self.po.size else 0.0
                self.ft = _finish_tree.new(W, *_finish_tree.thresholds(params.block, mean_o))
        cfg = config(params, check, t_end, drain, drain_min, self.t, pol=pol, life=life, comp=comp)
        return int(
            K.run_builtins(
                cfg, (self.pslot, self.ps, self.po), self.R, self.qbuf, self.elist, self.hk, self.hid, self.ph,
                self.st, out, self.no_bins if bins is None else bins, self.ft,
            )
        )  # fmt: skip


def _violation(state: _State, scheduler: str, params: ModelParams) -> InvariantViolation:
    """The reference engine's exception for the violation the compiled loop stopped at."""
    return violation(state, scheduler, params)


_check_plan = check_plan  # vllm.py and sglang's path check a plan as the reference engine does


def run(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    slots: int | None = None,
    *,
    drain: bool = False,
    check: bool = True,
    window: int = 8,
    lifecycle: Lifecycle = "kvstab",
    record: bool = True,
    engine: EngineChoice = "auto",
    progress: Callable[[int, int | None], None] | None = None,
    max_slots: int = 10_000_000,
    warmup: float = 0.25,
    batches: int = 20,
    decide_timeout: float | None = None,
    spec: str | None = None,
) -> Run:
    """Run ``plan`` through ``scheduler`` like :func:`kvstab.simulator.simulate`
    (``slots`` slots, or with ``drain`` until every request has finished) on the
    fastest engine that is exact for it.

    ``engine``: ``"auto"`` (compiled built-in, else the plug-in path, else the
    reference engine), ``"fast"`` (refuse if there is no fast path) or
    ``"reference"``.  ``lifecycle="vllm"`` applies vLLM's request lifecycle
    (requests in vLLM's terms, ``o = max_tokens``; see
    :mod:`kvstab.lifecycles.vllm`); ``lifecycle="sglang"`` SGLang's, for the
    ``sglang`` rule (on a server SGLang accepts, :func:`~kvstab.lifecycles.sglang.check_server`; requests in
    SGLang's terms, ``o = max_new_tokens``; :mod:`kvstab.lifecycles.sglang`).
    ``record=False`` keeps no per-slot
    arrays: the :class:`Summary` is computed while the run streams (a fixed
    horizon then keeps O(batches) numbers; a drained run keeps three compact
    series).  ``progress(slot, total)`` is called after every batch of slots.
    Raises :class:`InvariantViolation` like the reference engine (unless
    ``check=False``).  ``decide_timeout`` limits each call of a plug-in's ``decide``
    on the plug-in path and the reference engine alike (a built-in's compiled path
    calls no ``decide``), and ``spec`` names the plug-in in what a fault raises.
    """
    if engine not in ("auto", "fast", "reference"):
        raise InvalidArgument(f"engine must be 'auto', 'fast' or 'reference', got {engine!r}")
    if lifecycle not in ("kvstab", "vllm", "sglang"):
        raise InvalidArgument(f"lifecycle must be 'kvstab', 'vllm' or 'sglang', got {lifecycle!r}")
    if slots is None and not drain:
        raise InvalidArgument("run needs a number of slots, or drain=True")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1):
        raise InvalidArgument(f"slots must be a positive integer, got {slots!r}")
    if slots is not None and slots > MAX_SLOTS:
        raise InvalidArgument(f"slots must be at most {MAX_SLOTS}, got {slots}")
    from kvstab.engine.plugin import Bail, Untraceable, plugin_path

    pol = fast_rule(scheduler)
    start = time.perf_counter()
    h = Horizon(slots, drain, max_slots)
    rep = Reporting(record, progress, warmup, batches)
    if params.prefix_caching:
        return _run_cached(scheduler, params, plan, h, rep, check, window, lifecycle, engine, start)
    if lifecycle == "sglang" and not isinstance(scheduler, Sglang):
        raise InvalidArgument(
            f"lifecycle must be 'kvstab' or 'vllm' for {scheduler.name!r} ('sglang' is SGLang's own lifecycle, "
            "for the sglang rule only)"
        )
    if engine != "reference" and isinstance(scheduler, Sglang) and sgl.is_fast(scheduler):
        summary, result = sgl.run_fast(scheduler, params, plan, h, rep, check, lifecycle)
        return Run("fast", summary, result, time.perf_counter() - start, "compiled fast path of the sglang rule")
    if lifecycle == "sglang" and isinstance(scheduler, Sglang):
        why = "asked for" if engine == "reference" else f"no compiled sglang path: {sgl.no_fast_path(scheduler)}"
        if engine == "fast":
            raise InvalidArgument(f"scheduler {scheduler.name!r} has no fast path ({why})")
        sres = SglangEngine(scheduler, params, check=check, window=window).simulate(plan, h)
        return _ran_reference(sres, h, rep, start, why)
    if engine != "reference" and pol is not None:
        summary, result = _run_fast(pol, scheduler.name, params, plan, h, rep, check, lifecycle)
        return Run("fast", summary, result, time.perf_counter() - start, "compiled fast path of a built-in rule")
    why = "no compiled fast path for this scheduler"
    handed_over = False
    long_run = drain or (slots is not None and slots >= PLUGIN_MIN_SLOTS)
    if engine == "auto" and not long_run:
        why += f"; the plug-in path pays off only from {PLUGIN_MIN_SLOTS} slots (taping costs ~1 ms per view shape)"
    elif engine != "reference":
        path, why = plugin_path(scheduler, lifecycle, decide_timeout, spec)
        if path is not None:
            try:
                summ, res = path.run(params, plan, h, rep, check=check, window=window, decide_timeout=decide_timeout,
                                     spec=spec)  # fmt: skip
            except Untraceable as exc:
                # met a view shape the rule cannot be taped on: nothing is lost, run the reference engine
                path, why = None, f"the rule cannot be traced to a tape ({exc}); ran the reference engine"
            except Bail as exc:
                # a broken invariant, a bad grant or state, or an out-of-range value: the reference
                # engine reports it exactly (it raises, or computes with Python's integers)
                handed_over, why = True, f"the compiled loop handed over at {exc}; ran the reference engine"
            else:
                return Run("fast-plugin", summ, res, time.perf_counter() - start, why)
    if engine == "fast" and not handed_over:
        raise InvalidArgument(f"scheduler {scheduler.name!r} has no fast path ({why}); use engine='reference'")
    on_slot = None if progress is None else (lambda t: progress(t + 1, slots) if (t + 1) % 4096 == 0 else None)
    res = _reference(scheduler, params, plan, h, check, window, lifecycle, on_slot,
                     decide_timeout=decide_timeout, spec=spec)  # fmt: skip
    return _ran_reference(res, h, rep, start, why)


def _ran_reference(res: SimResult, h: Horizon, rep: Reporting, start: float, why: str) -> Run:
    """The :class:`Run` of the reference engine's result ``res`` (started at ``start``, chosen for
    ``why``): its summary computed from the arrays, which are kept with ``rep.record``."""
    summ = StreamStats.of_result(res, h.fixed, rep.warmup, rep.batches)
    return Run("reference", summ, res if rep.record else None, time.perf_counter() - start, why)


def _reference(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    h: Horizon,
    check: bool,
    window: int,
    lifecycle: Lifecycle,
    on_slot: Callable[[int], None] | None = None,
    *,
    decide_timeout: float | None = None,
    spec: str | None = None,
) -> SimResult:
    """The reference engine under kvstab's or vLLM's lifecycle (the engine of last resort);
    ``decide_timeout`` and ``spec`` (the name a plug-in's faults are reported under) as
    :class:`kvstab.simulator.Engine`'s, under kvstab's lifecycle."""
    if lifecycle == "vllm":
        eng = VllmEngine(scheduler, params, check=check, window=window)
        return eng.simulate(_check_plan(plan, params, "vllm"), h)
    return reference_simulate(
        scheduler, params, plan, h.slots, drain=h.drain, check=check, window=window, on_slot=on_slot,
        max_slots=h.max_slots, decide_timeout=decide_timeout, spec=spec,
    )  # fmt: skip


def _run_cached(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    h: Horizon,
    rep: Reporting,
    check: bool,
    window: int,
    lifecycle: Lifecycle,
    engine: EngineChoice,
    start: float,
) -> Run:
    """:func:`run` with prefix caching: the compiled pool (:mod:`kvstab.engine.cached`) for the rules
    it carries, else the reference engine (:mod:`kvstab.prefix_cache`); the ``sglang`` rule runs
    SGLang's radix cache on the reference engine (:mod:`kvstab.lifecycles.sglang_radix`)."""
    if lifecycle == "sglang" and not isinstance(scheduler, Sglang):
        raise InvalidArgument(
            f"lifecycle must be 'kvstab' or 'vllm' for {scheduler.name!r} ('sglang' is SGLang's own lifecycle, "
            "for the sglang rule only)"
        )
    if isinstance(scheduler, Sglang):
        from kvstab.lifecycles.sglang_radix import simulate_radix

        if engine == "fast":
            raise InvalidArgument(
                f"scheduler {scheduler.name!r} has no fast path with prefix caching (the compiled sglang kernel "
                "has no radix cache)"
            )
        sres = simulate_radix(scheduler, params, plan, h.slots, drain=h.drain, max_slots=h.max_slots,
                              spec=scheduler.name)  # fmt: skip
        return _ran_reference(sres, h, rep, start,
                              "SGLang's radix cache, with SGLang's own lifecycle, runs on the reference engine "
                              "(kvstab.lifecycles.sglang_radix)")  # fmt: skip
    why = "asked for" if engine == "reference" else why_not_cached(scheduler, params, lifecycle)
    if engine != "reference" and not why:
        checked = _check_plan(plan, params, lifecycle)
        out = run_cached(scheduler, params, checked, h.slots, drain=h.drain, lifecycle=lifecycle,
                         max_slots=h.max_slots, progress=rep.progress, record=rep.record, warmup=rep.warmup,
                         batches=rep.batches)  # fmt: skip
        if out is not None:
            return Run("fast", out[0], out[1], time.perf_counter() - start,
                       "compiled prefix-cache path of a built-in rule")
        # a rule that never preempts met a full pool: the reference engine raises it exactly
        why = "the compiled prefix-cache loop met a full pool; ran the reference engine"
    elif engine == "fast":
        raise InvalidArgument(f"no compiled prefix-cache path for this run ({why}); use engine='reference'")
    else:
        why = f"prefix caching on the reference engine: {why}"
    res = _reference(scheduler, params, plan, h, check, window, lifecycle)
    return _ran_reference(res, h, rep, start, why)


def _run_fast(
    pol: int,
    name: str,
    params: ModelParams,
    plan: ArrivalPlan,
    h: Horizon,
    rep: Reporting,
    check: bool,
    lifecycle: Lifecycle,
    work: dict[str, int] | None = None,
) -> tuple[Summary, SimResult | None]:
    """The compiled engine's run (``work``, if given, receives :meth:`_State.work`)."""
    plan = _check_plan(plan, params, lifecycle)
    life = L.VLLM_LIFE if lifecycle == "vllm" else L.KVSTAB_LIFE
    state = _State(plan)

    def step(t_end: int, out: IntArray, bins: Bins | None) -> int:
        return state.step(pol, life, params, check, False, t_end, h.drain, h.drain_min, out, bins)

    return run_kernel(state, step, name, params, plan.dropped, h, rep, rows=L.NCOLS, work=work)


def simulate(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    slots: int | None = None,
    *,
    drain: bool = False,
    check: bool = True,
    window: int = 8,
    on_slot: Callable[[int], None] | None = None,
    max_slots: int = 10_000_000,
) -> SimResult:
    """Drop-in for :func:`kvstab.simulator.simulate` on the fastest exact engine
    (``on_slot`` is called for every slot, after the batch that ran it)."""
    done = [0]

    def progress(t: int, total: int | None) -> None:
        if on_slot is not None:
            for k in range(done[0], t):
                on_slot(k)
        done[0] = t

    out = run(
        scheduler,
        params,
        plan,
        slots,
        drain=drain,
        check=check,
        window=window,
        progress=progress if on_slot is not None else None,
        max_slots=max_slots,
    )
    assert out.result is not None  # record=True
    progress(out.result.slots, None)  # the slots after the last report (the reference engine reports every 4096)
    return out.result
