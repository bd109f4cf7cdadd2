"""Plug-in rules on a faster path: the rule taped once per view shape, run by a compiled loop.

A rule written against :class:`kvstab.ops.Ops` computes, for one shape of view
(``K`` active and ``Q`` shown waiting entries), one fixed expression of the
view's values.  :func:`kvstab.engine.tape.trace_tape` records that expression
as a tape of int64 register operations, once per shape (cached across runs),
and :func:`kvstab.engine._plugin_kernel.run_plugin_slots` runs
:meth:`kvstab.simulator.Engine.step`'s slot — window widening, preemption,
admission, work, checks, release, the scheduler's state — in numba, reading
each decision off the tape.  It returns to Python only to tape a shape it has
not met, and hands the run to the reference engine whenever something happens
that only the reference reports exactly (a broken invariant, a bad grant or
state, a division by zero, an integer beyond ±2⁶¹): the outcome is the
reference engine's in every case (``tests/test_engine_plugin*.py``).

Why a tape and not fewer rule calls: at paper scale (1:1, ``M = 131000``,
``λ = 1.2·μ``) 61 % of slots admit, preempt or complete something, so a path
that calls the rule only when something can change still calls it in most
slots; what costs is each call and each slot's Python, and the tape removes both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import (
    ActiveEntry,
    Scheduler,
    StateVar,
    View,
    WaitingEntry,
    check_decision_shape,
    check_decision_values,
    check_next_state,
    hidden_output,
    state_vars_of,
    traits_of,
)
from kvstab.engine import _kernel as K
from kvstab.engine import _plugin_kernel as PK
from kvstab.engine.stream import StreamStats, Summary
from kvstab.engine.tape import LIMIT, OP, Tape, Untraceable, float_bits, trace_tape
from kvstab.errors import InvalidArgument, InvalidScheduler
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE
from kvstab.simulator import SimResult

__all__ = ["plugin_path", "PluginPath", "Untraceable", "trace_rule", "Bail"]

#: slots per call of the compiled loop (as the built-in fast path)
BATCH = 1 << 16


class Bail(Exception):
    """The compiled loop met something only the reference engine reports exactly;
    the driver runs the reference engine instead."""


#: tapes shared by runs (a sweep runs one rule at many rates): (scheduler, params, K, Q) -> tape
_TAPES: dict[tuple[Any, ModelParams, int, int], Tape] = {}
_TAPES_MAX = 20_000


def trace_rule(scheduler: Scheduler, params: ModelParams, K: int, Q: int) -> Tape:
    """:func:`~kvstab.engine.tape.trace_tape`, cached across runs when the scheduler
    is hashable (frozen dataclasses are)."""
    try:
        key = (scheduler, params, K, Q)
        hit = _TAPES.get(key)
    except TypeError:  # an unhashable scheduler: tape per run only
        return trace_tape(scheduler, params, K, Q)
    if hit is None:
        if len(_TAPES) >= _TAPES_MAX:
            _TAPES.clear()
        hit = _TAPES[key] = trace_tape(scheduler, params, K, Q)
    return hit


#: a shape is taped the (TRACE_AFTER + 1)-th time a run meets it; until then the rule is
#: asked directly (taping a shape of ~100 active entries costs about what 4 direct calls of a
#: rule linear in the view do — hundreds for sglang, whose O(K²) retraction order the concrete
#: rule skips — and at paper scale half the shapes a run meets are met once or twice)
TRACE_AFTER = 3


def _cached(scheduler: Scheduler, params: ModelParams, K: int, Q: int) -> bool:
    try:
        return (scheduler, params, K, Q) in _TAPES
    except TypeError:
        return False


def _view(
    scheduler: Scheduler, params: ModelParams, shape: tuple[int, int], st: np.ndarray, act: np.ndarray,
    qbuf: np.ndarray, ps: np.ndarray, po: np.ndarray, prog: np.ndarray, sv: np.ndarray, svf: np.ndarray,
    svtag: np.ndarray,
) -> View:  # fmt: skip
    """The view the kernel's current slot shows the rule (as :meth:`Engine.view` builds it)."""
    K, Q = shape
    qh, ql, cap = int(st[PK.ST_QH]), int(st[PK.ST_QL]), qbuf.shape[0]
    who = scheduler.name
    seen = traits_of(scheduler).clairvoyant

    def out_len(r: int) -> Any:
        return int(po[r]) if seen else hidden_output(who, r)

    acts = [int(r) for r in act[:K]]
    heads = [int(qbuf[(qh + j) % cap]) for j in range(Q)]
    return View(
        active=tuple(ActiveEntry(r, int(ps[r]), out_len(r), int(prog[r])) for r in acts),
        waiting=tuple(WaitingEntry(r, int(ps[r]), out_len(r)) for r in heads),
        M=params.M,
        chunk=params.chunk,
        block=params.block,
        token_budget=params.token_budget,
        max_num_seqs=params.max_num_seqs,
        n_waiting=ql,
        # each variable as the rule returned it last: an int, or (a real one) possibly a float
        state=tuple(float(f) if tag else int(v) for v, f, tag in zip(sv, svf, svtag)),
    )


def _answer(scheduler: Scheduler, view: View, svars: tuple[StateVar, ...]) -> Tape:
    """The rule's own decision on ``view`` as a tape of constants (valid for this slot only);
    :class:`Bail` for anything the reference engine would report (it then runs and reports it)."""
    who = scheduler.name
    try:
        decision = scheduler.decide(view, CONCRETE)
        decision = check_decision_values(check_decision_shape(decision, view, who), who)
        if decision.state is not None:
            check_next_state(decision, view.state, svars, who)
    except Exception as exc:  # the reference engine raises this as InvalidScheduler, naming the slot
        raise Bail(f"a decision the reference engine refuses ({type(exc).__name__})") from None
    values: list[int | float] = [int(bool(x)) for x in decision.admit]
    values += [int(bool(x)) for x in decision.preempt]
    if decision.grants is not None:
        values += [int(g) for g in decision.grants]
    if decision.state is not None:  # checked: ints, and floats for real variables
        values += [v.item() if isinstance(v, np.generic) else v for v in decision.state]
    if any(isinstance(v, int) and abs(v) > LIMIT for v in values):
        raise Bail("a value beyond the 64-bit registers")
    base = 4 * len(view.active) + 3 * len(view.waiting) + 1 + len(view.state)
    regs = np.arange(base, base + len(values), dtype=np.int64)
    floats = np.array([isinstance(v, float) for v in values], dtype=bool)
    code = np.zeros((len(values), 6), dtype=np.int64)
    code[:, 0] = np.where(floats, OP["FCONST"], OP["CONST"])
    code[:, 1] = regs
    code[:, 2] = [float_bits(v) if isinstance(v, float) else v for v in values]
    return Tape(
        K=len(view.active),
        Q=len(view.waiting),
        code=code,
        outputs=regs,
        okinds=floats.astype(np.int64),
        n_regs=base + len(values),
        has_grants=decision.grants is not None,
        has_state=decision.state is not None,
    )


class _TapeSet:
    """The tapes of one run as the flat arrays the kernel reads, grown as shapes are met."""

    def __init__(self) -> None:
        self.code = np.zeros((1024, 6), dtype=np.int64)
        self.rows = 0
        self.outs = np.zeros(1024, dtype=np.int64)
        self.okind = np.zeros(1024, dtype=np.int64)
        self.nouts = 0
        self.tstart = np.zeros(64, dtype=np.int64)
        self.tlen = np.zeros(64, dtype=np.int64)
        self.ostart = np.zeros(64, dtype=np.int64)
        self.tflags = np.zeros(64, dtype=np.int64)
        self.count = 0
        self.tid = np.full((16, 16), -1, dtype=np.int64)
        self.R = np.zeros(64, dtype=np.int64)
        self.F = np.zeros(64, dtype=np.float64)
        self.T = np.zeros(64, dtype=np.int64)
        self.once_k = np.zeros(64, dtype=np.int64)
        self.once_q = np.zeros(64, dtype=np.int64)
        self.once_id = np.zeros(64, dtype=np.int64)

    @staticmethod
    def _grow(a: np.ndarray, need: int) -> np.ndarray:
        if need <= a.shape[0]:
            return a
        b = np.zeros((max(need, 2 * a.shape[0]),) + a.shape[1:], dtype=a.dtype)
        b[: a.shape[0]] = a
        return b

    def add(self, tape: Tape, st: np.ndarray | None = None) -> None:
        """Add ``tape`` for its shape, or (given the kernel's ``st``) for the current slot only."""
        rows, nout, k = tape.code.shape[0], tape.outputs.shape[0], self.count
        self.code = self._grow(self.code, self.rows + rows)
        self.code[self.rows : self.rows + rows] = tape.code
        self.outs = self._grow(self.outs, self.nouts + nout)
        self.outs[self.nouts : self.nouts + nout] = tape.outputs
        self.okind = self._grow(self.okind, self.nouts + nout)
        self.okind[self.nouts : self.nouts + nout] = tape.okinds
        for name in ("tstart", "tlen", "ostart", "tflags"):
            setattr(self, name, self._grow(getattr(self, name), k + 1))
        self.tstart[k], self.tlen[k], self.ostart[k] = self.rows, rows, self.nouts
        self.tflags[k] = (1 if tape.has_grants else 0) | (2 if tape.has_state else 0)
        self.rows += rows
        self.nouts += nout
        self.count += 1
        self.R = self._grow(self.R, tape.n_regs)
        self.F = self._grow(self.F, tape.n_regs)
        self.T = self._grow(self.T, tape.n_regs)
        if st is not None:
            x = int(st[PK.ST_NONCE])
            for name in ("once_k", "once_q", "once_id"):
                setattr(self, name, self._grow(getattr(self, name), x + 1))
            self.once_k[x], self.once_q[x], self.once_id[x] = tape.K, tape.Q, k
            st[PK.ST_NONCE] = x + 1
            return
        if tape.K >= self.tid.shape[0] or tape.Q >= self.tid.shape[1]:
            tid = np.full((max(tape.K + 1, 2 * self.tid.shape[0]), max(tape.Q + 1, 2 * self.tid.shape[1])), -1,
                          dtype=np.int64)  # fmt: skip
            tid[: self.tid.shape[0], : self.tid.shape[1]] = self.tid
            self.tid = tid
        self.tid[tape.K, tape.Q] = k


@dataclass(frozen=True, slots=True)
class PluginPath:
    """A plug-in rule's faster path (see the module docstring)."""

    scheduler: Scheduler

    def run(
        self,
        params: ModelParams,
        plan: ArrivalPlan,
        slots: int | None,
        *,
        drain: bool,
        check: bool,
        window: int,
        max_slots: int,
        record: bool = True,
        progress: Callable[[int, int | None], None] | None = None,
        warmup: float = 0.25,
        batches: int = 20,
    ) -> tuple[Summary, SimResult | None]:
        """:func:`kvstab.simulator.simulate`'s run on the compiled loop: the summary and
        (with ``record``) the :class:`SimResult`.  Raises :class:`Bail` where the
        reference engine must run instead, :class:`Untraceable` for a shape the rule
        cannot be taped on."""
        if slots is None and not drain:
            raise InvalidArgument("simulate needs a number of slots, or drain=True")
        plan = plan.fit_to(params)
        n = len(plan)
        svars = state_vars_of(self.scheduler)
        pslot = np.ascontiguousarray(plan.slot, dtype=np.int64)
        ps = np.ascontiguousarray(plan.s, dtype=np.int64)
        po = np.ascontiguousarray(plan.o, dtype=np.int64)
        z = lambda: np.zeros(n, dtype=np.int64)  # noqa: E731
        prog, att, served, wasted, npre = z(), z(), z(), z(), z()
        first = np.full(n, -1, dtype=np.int64)
        fin = np.full(n, -1, dtype=np.int64)
        qbuf = np.zeros(n + 1, dtype=np.int64)
        act = np.zeros(n + 1, dtype=np.int64)
        tmp = np.zeros(n + 1, dtype=np.int64)
        scr = np.zeros(n + 1, dtype=np.int64)
        st = np.zeros(PK.ST_SIZE, dtype=np.int64)
        st[PK.ST_PEND] = -1
        # the state as the engine carries it: each value an int (sv) or a float (svf), as svtag says
        svtag = np.array([isinstance(v.initial, float) for v in svars], dtype=np.int64)
        sv = np.array([0 if isinstance(v.initial, float) else int(v.initial) for v in svars], dtype=np.int64)
        svf = np.array([float(v.initial) if isinstance(v.initial, float) else 0.0 for v in svars], dtype=np.float64)
        svreal = np.array([v.real for v in svars], dtype=np.int64)
        svlo = np.array([0 if v.real else int(v.lo) for v in svars], dtype=np.int64)
        svhi = np.array([0 if v.real else int(v.hi) for v in svars], dtype=np.int64)
        # a real variable's bounds in float64 (exact: trace_tape refuses int bounds beyond 2**53)
        svflo = np.array([float(v.lo) for v in svars], dtype=np.float64)
        svfhi = np.array([float(v.hi) for v in svars], dtype=np.float64)
        tapes = _TapeSet()
        visits: dict[tuple[int, int], int] = {}
        fixed = slots is not None and not drain
        horizon = min(int(slots), max_slots) if fixed else max_slots  # type: ignore[arg-type]
        drain_min = 0 if slots is None else int(slots)
        stats = StreamStats(params.M, horizon if fixed else None, warmup, batches, keep_all=record)
        out = np.zeros((K.NCOLS, min(BATCH, max(horizon, 1))), dtype=np.int64)
        budget = -1 if params.token_budget is None else params.token_budget
        maxseq = -1 if params.max_num_seqs is None else params.max_num_seqs
        while True:
            t0 = int(st[PK.ST_T])
            t_end = min(t0 + out.shape[1], horizon)
            out[:] = 0
            while True:
                status = PK.run_plugin_slots(
                    params.M, params.chunk, params.block, budget, maxseq, check, window, t_end, drain, drain_min,
                    t0, pslot, ps, po, prog, att, served, wasted, npre, first, fin, qbuf, act, st, sv, svf, svtag,
                    svreal, svlo, svhi, svflo, svfhi, tapes.code, tapes.code.view(np.float64), tapes.tstart,
                    tapes.tlen, tapes.ostart, tapes.outs, tapes.okind, tapes.tflags, tapes.tid,
                    tapes.once_k, tapes.once_q, tapes.once_id, tapes.R, tapes.F, tapes.T, tmp, scr, out,
                )  # fmt: skip
                if status != PK.NEED_TAPE:
                    break
                shape = (int(st[PK.ST_NEEDK]), int(st[PK.ST_NEEDQ]))
                ask = bool(st[PK.ST_ASK])  # the shape's tape left this slot to the rule (an ASK row)
                st[PK.ST_ASK] = 0
                met = visits[shape] = visits.get(shape, 0) + 1
                if not ask and (met > TRACE_AFTER or _cached(self.scheduler, params, *shape)):
                    tapes.add(trace_rule(self.scheduler, params, *shape))
                else:  # ski rental: ask the rule itself until the shape has cost what taping it would
                    view = _view(self.scheduler, params, shape, st, act, qbuf, ps, po, prog, sv, svf, svtag)
                    tapes.add(_answer(self.scheduler, view, svars), st)
            if status == PK.BAIL:
                raise Bail(f"slot {int(st[PK.ST_T])}")
            t = int(st[PK.ST_T])
            stats.add(out[:, : t - t0])
            if progress is not None:
                progress(t, horizon if fixed else None)
            if status == PK.DRAINED or (fixed and t >= horizon):
                break
            if t >= max_slots:
                raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
        if fixed and t < int(slots):  # type: ignore[arg-type]
            raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
        arrived = int(st[PK.ST_I])
        arrival = pslot[:arrived].copy()
        finish = fin[:arrived].copy()
        summary = stats.summary(arrival, finish, wasted[:arrived], served[:arrived], npre[:arrived], t)
        if not record:
            return summary, None
        cols = stats.columns()
        result = SimResult(
            scheduler=self.scheduler.name,
            params=params,
            slots=t,
            arrived=cols["arrived"],
            admitted=cols["admitted"],
            preempted=cols["preempted"],
            completed=cols["completed"],
            running=cols["running"],
            memory=cols["memory"],
            wasted=cols["wasted"],
            tokens=cols["tokens"],
            queue=cols["queue"],
            s=ps[:arrived].copy(),
            o=po[:arrived].copy(),
            arrival=arrival,
            first_admit=first[:arrived].copy(),
            finish=finish,
            preemptions=npre[:arrived].copy(),
            served=served[:arrived].copy(),
            request_wasted=wasted[:arrived].copy(),
            dropped=plan.dropped,
            window=window,
            window_hid_slots=int(st[PK.ST_HID]),
        )
        return summary, result


def plugin_path(scheduler: Scheduler, lifecycle: str) -> tuple[PluginPath | None, str]:
    """The faster path for a plug-in rule, or ``None`` and the reason there is none.

    The rule is taped on a small view (2 active, 2 waiting entries) to find out
    early whether it can be taped at all; every other shape is taped when the
    run first meets it, and an untapeable shape there also falls back."""
    if lifecycle != "kvstab":
        return None, "the plug-in path runs kvstab's lifecycle only"
    try:
        traits_of(scheduler)
        trace_tape(scheduler, ModelParams(M=64, chunk=4), 2, 2)
    except (Untraceable, InvalidScheduler) as exc:
        return None, f"the rule cannot be traced to a tape ({exc})"
    return PluginPath(scheduler), "the rule taped to register code once per view shape, run by a compiled loop"
