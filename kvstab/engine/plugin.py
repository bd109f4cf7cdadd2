"""Plug-in rules on a faster path: a compiled slot loop, the rule taped per view shape or asked.

A rule written against :class:`kvstab.ops.Ops` computes, for one shape of view
(``K`` active and ``Q`` shown waiting entries), one fixed expression of the
view's values.  :func:`kvstab.engine.tape.trace_tape` records that expression
as a tape of int64 and float64 register operations, and
:func:`kvstab.engine._plugin_kernel.run_plugin_slots` runs
:meth:`kvstab.simulator.Engine.step`'s slot — window widening, preemption,
admission, work, checks, release, the scheduler's state — in numba, reading
each decision off the tape of its shape.  For a shape with no tape it returns to
Python, which either asks the rule itself on the real view (as the reference
engine would: the answer holds for this slot) or tapes the shape: taping costs
about what ten asks do, and at paper scale most of the ~300 shapes a run meets
are met a handful of times (the queue's ramp-up, short queues), a few thousands
of times (a saturated queue: ``Q`` at the window) — :class:`_Rental` decides.
The tapes of a rule on a server are kept in one :class:`_Bank` shared by the
runs of a sweep, held to :data:`TAPE_BYTES` (least recently used dropped).

The loop hands the run to the reference engine whenever something happens that
only the reference reports exactly (a broken invariant, a bad grant or state, a
division by zero, an integer beyond ±2⁶¹): the outcome is the reference
engine's in every case (``tests/test_engine_plugin*.py``).

Why not call the rule only when something can change: at paper scale (1:1,
``M = 131000``, ``λ = 1.2·μ``) 61 % of slots admit, preempt or complete
something, so such a path still decides most slots; what costs is each call and
each slot's Python, which the tape and the loop remove.  And a tape cannot be
stretched to other shapes (padded with absent entries): a rule may branch in
Python on ``len(view.active)``, so only running it on a shape says what it does
there.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import (
    HiddenOutput,
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
from kvstab.engine import _layout as L
from kvstab.engine import _plugin_kernel as PK
from kvstab.engine._drive import Reporting, Requests, drive, finish
from kvstab.engine._skeleton import config
from kvstab.engine.stream import Summary
from kvstab.engine.tape import LIMIT, Tape, Untraceable, active_entry, trace_tape, waiting_entry
from kvstab.errors import InvalidArgument, InvalidScheduler
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE
from kvstab.simulator import DecideTimeout, Horizon, SimResult, time_limit

__all__ = ["plugin_path", "PluginPath", "Untraceable", "trace_rule", "Bail"]


class Bail(Exception):
    """The compiled loop met something only the reference engine reports exactly;
    the driver runs the reference engine instead."""


#: the tapes' memory, all banks together (a rule whose tapes are O(K²) rows — sglang's
#: retraction order — would otherwise hold gigabytes over a long run): past it, the least
#: recently used tapes are dropped, and a dropped shape is asked or taped again when met
TAPE_BYTES = 256 << 20

#: ``None``: a shape is taped once asking the rule on it has cost what taping it is expected to
#: cost (ski rental); an int ``n``: from the ``(n + 1)``-th time the run meets the shape
#: (0: every shape at once; the tests also use a huge ``n``: every shape asked)
TRACE_AFTER: int | None = None

#: until a bank has taped a shape (and so measured what taping costs), shapes are taped from
#: their (FIRST_TRACE_AFTER + 1)-th meeting
FIRST_TRACE_AFTER = 8

#: a tape whose ``ASK`` rows (:data:`kvstab.engine._guards.ASK_SHARE`) left at least this many slots,
#: and one in eight of its runs, to the rule is taped again with those rows kept
ASK_AGAIN = 16

#: row fields of a tape (the kernel's ``code``): their bytes per row
_ROW_BYTES = 6 * 8

#: a class of shapes (same ``Q``) is taped at first sight once at least this many of its shapes were
#: decided by ski rental and at least half of them came to be taped; one new shape in EAGER_SAMPLE
#: is still decided by ski rental, so that the class can turn back
EAGER_AFTER, EAGER_SAMPLE = 4, 4


class _Rental:
    """When to tape a shape rather than ask the rule itself on it once more (one per bank).

    Ski rental: asking costs each time, taping once, and how often a shape will be met is
    unknown, so a shape is taped once the asks spent on it have cost what taping it is
    expected to cost (at most twice the best choice in hindsight).  The expected cost is a
    least-squares line through the CPU seconds the bank's tapes took against their view
    entries ``K + Q + 1``.  Shapes of one ``Q`` behave alike (a saturated queue shows the
    window's ``Q`` in most slots, a short one a few rare ``Q``), so a class whose shapes
    mostly came to be taped has its new shapes taped at first sight."""

    def __init__(self) -> None:
        self.spent: dict[tuple[int, int], float] = {}  # CPU seconds spent asking, per shape not taped
        self.met: dict[tuple[int, int], int] = {}  # times met (TRACE_AFTER's count)
        self.fit = [0.0, 0.0, 0.0, 0.0, 0.0]  # n, Σx, Σy, Σx², Σxy of (entries, seconds) of the tapes
        self.rented: set[tuple[int, int]] = set()  # shapes decided by ski rental
        self.classes: dict[int, list[int]] = {}  # Q -> [shapes met, shapes rented, rented shapes taped]
        self.taped_count = 0  # meetings that taped the shape (the others asked the rule)

    def expected(self, size: int) -> float | None:
        """CPU seconds taping a view of ``size`` entries is expected to cost (None: no tape yet)."""
        n, sx, sy, sxx, sxy = self.fit
        if n == 0:
            return None
        den = n * sxx - sx * sx
        slope = (n * sxy - sx * sy) / den if n >= 2 and den > 0 else 0.0
        if slope <= 0.0:  # one tape, or no trend yet: its cost per entry, with a fixed part worth 16
            return sy / (sx + 16 * n) * (size + 16)
        return max(0.0, (sy - slope * sx) / n) + slope * size

    def tape_now(self, shape: tuple[int, int]) -> bool:
        """Whether to tape ``shape`` at this meeting (see the class docstring and TRACE_AFTER)."""
        met = self.met[shape] = self.met.get(shape, 0) + 1
        if TRACE_AFTER is not None:
            return met > TRACE_AFTER
        expected = self.expected(shape[0] + shape[1] + 1)
        if expected is None:
            return met > FIRST_TRACE_AFTER
        cls = self.classes.setdefault(shape[1], [0, 0, 0])
        if met == 1:
            cls[0] += 1
            if cls[1] >= EAGER_AFTER and 2 * cls[2] >= cls[1] and cls[0] % EAGER_SAMPLE:
                return True
            self.rented.add(shape)
            cls[1] += 1
        return self.spent.get(shape, 0.0) >= expected

    def asked(self, shape: tuple[int, int], seconds: float) -> None:
        self.spent[shape] = self.spent.get(shape, 0.0) + seconds

    def taped(self, shape: tuple[int, int], size: int, seconds: float) -> None:
        self.taped_count += 1
        self.spent.pop(shape, None)
        if shape in self.rented:
            self.rented.discard(shape)
            self.classes[shape[1]][2] += 1
        for i, v in enumerate((1.0, size, seconds, size * size, size * seconds)):
            self.fit[i] += v


class _Bank:
    """The tapes of one rule on one server, as the flat arrays the kernel reads; shared by the
    runs of a sweep (same scheduler, same :class:`ModelParams`), grown as shapes are met, and
    compacted when the least recently used are dropped (:data:`TAPE_BYTES`)."""

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
        self.tused = np.zeros(64, dtype=np.int64)
        self.tcount = np.zeros(128, dtype=np.int64)  # per tape: runs, then slots its ASK rows asked
        self.shapes: list[tuple[int, int]] = []
        self.tid = np.full((16, 16), -1, dtype=np.int64)
        self.R = np.zeros(64, dtype=np.int64)
        self.F = np.zeros(64, dtype=np.float64)
        self.T = np.zeros(64, dtype=np.int64)
        self.rental = _Rental()
        self.evicted = 0
        self.no_ask: set[tuple[int, int]] = set()  # shapes whose ASK rows fired often: taped without

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def nbytes(self) -> int:
        """Bytes the tapes take (rows and outputs, not the slack of the arrays)."""
        return self.rows * _ROW_BYTES + self.nouts * 16

    @staticmethod
    def _grow(a: np.ndarray, need: int, most: int | None = None) -> np.ndarray:
        """``a`` with room for ``need`` entries: doubled, but not beyond ``most`` (unless needed)."""
        if need <= a.shape[0]:
            return a
        size = 2 * a.shape[0] if most is None else min(2 * a.shape[0], most)
        b = np.zeros((max(need, size),) + a.shape[1:], dtype=a.dtype)
        b[: a.shape[0]] = a
        return b

    def add(self, tape: Tape, t: int) -> None:
        """Add ``tape`` for its shape (last used: slot ``t``)."""
        rows, nout, k = tape.code.shape[0], tape.outputs.shape[0], self.count
        # the rows never take more room than the budget allows them (unless one tape needs it): the
        # arrays are the tapes' memory, and a doubling past the budget would hold twice what it says
        most = TAPE_BYTES // _ROW_BYTES + rows
        self.code = self._grow(self.code, self.rows + rows, most)
        self.code[self.rows : self.rows + rows] = tape.code
        self.outs = self._grow(self.outs, self.nouts + nout)
        self.outs[self.nouts : self.nouts + nout] = tape.outputs
        self.okind = self._grow(self.okind, self.nouts + nout)
        self.okind[self.nouts : self.nouts + nout] = tape.okinds
        for name in ("tstart", "tlen", "ostart", "tflags", "tused"):
            setattr(self, name, self._grow(getattr(self, name), k + 1))
        self.tstart[k], self.tlen[k], self.ostart[k] = self.rows, rows, self.nouts
        self.tflags[k] = (1 if tape.has_grants else 0) | (2 if tape.has_state else 0)
        self.tused[k] = t
        self.tcount = self._grow(self.tcount, 2 * k + 2)
        self.tcount[2 * k : 2 * k + 2] = 0
        self.rows += rows
        self.nouts += nout
        self.shapes.append((tape.K, tape.Q))
        self.R = self._grow(self.R, tape.n_regs)
        self.F = self._grow(self.F, tape.n_regs)
        self.T = self._grow(self.T, tape.n_regs)
        if tape.K >= self.tid.shape[0] or tape.Q >= self.tid.shape[1]:
            tid = np.full((max(tape.K + 1, 2 * self.tid.shape[0]), max(tape.Q + 1, 2 * self.tid.shape[1])), -1,
                          dtype=np.int64)  # fmt: skip
            tid[: self.tid.shape[0], : self.tid.shape[1]] = self.tid
            self.tid = tid
        self.tid[tape.K, tape.Q] = k

    def keep(self, ids: list[int]) -> None:
        """Keep only the tapes ``ids`` (increasing), packed to the front of the same arrays: each
        moves towards the front, so moving them in order overwrites only what is dropped (no
        second copy of the tapes, which would double their memory while it is made)."""
        per = {name: getattr(self, name).copy() for name in ("tstart", "tlen", "ostart", "tflags", "tused", "tcount")}
        nouts = [self._nout(k) for k in ids]
        self.tid[:] = -1
        r = o = 0
        for new, (k, m) in enumerate(zip(ids, nouts)):
            n, s0, o0 = int(per["tlen"][k]), int(per["tstart"][k]), int(per["ostart"][k])
            self.code[r : r + n] = self.code[s0 : s0 + n]  # numpy copies overlapping slices correctly
            self.outs[o : o + m] = self.outs[o0 : o0 + m]
            self.okind[o : o + m] = self.okind[o0 : o0 + m]
            self.tstart[new], self.tlen[new], self.ostart[new] = r, n, o
            self.tflags[new], self.tused[new] = per["tflags"][k], per["tused"][k]
            self.tcount[2 * new : 2 * new + 2] = per["tcount"][2 * k : 2 * k + 2]
            self.tid[self.shapes[k]] = new
            r, o = r + n, o + m
        self.evicted += self.count - len(ids)
        self.shapes = [self.shapes[k] for k in ids]
        self.rows, self.nouts = r, o

    def asks_often(self, shape: tuple[int, int]) -> bool:
        """Whether the ``ASK`` rows of ``shape``'s tape left one slot in eight or more to the rule
        (then its tape should keep those rows: a guard true that often is no rare case)."""
        k = int(self.tid[shape])
        fired = int(self.tcount[2 * k + 1])
        return fired >= ASK_AGAIN and 8 * fired >= int(self.tcount[2 * k])

    def drop(self, shape: tuple[int, int]) -> None:
        """Drop ``shape``'s tape."""
        k = int(self.tid[shape])
        self.keep([j for j in range(self.count) if j != k])
        self.evicted -= 1  # not an eviction

    def _nout(self, k: int) -> int:
        end = self.ostart[k + 1] if k + 1 < self.count else self.nouts
        return int(end - self.ostart[k])

    def evict(self, target: int, now: int) -> None:
        """Drop the least recently used tapes until the bank takes at most ``target`` bytes; the
        tapes of slot ``now`` stay whatever they take (the slot is resumed from its start, and
        a window widened in it meets its tapes again: dropping one would loop)."""
        order = sorted(range(self.count), key=lambda k: int(self.tused[k]))
        total = self.nbytes
        drop = set()
        for k in order:
            if total <= target or self.tused[k] >= now:
                break
            drop.add(k)
            total -= int(self.tlen[k]) * _ROW_BYTES + self._nout(k) * 16
        if drop:
            self.keep([k for k in range(self.count) if k not in drop])


#: the banks, least recently used first: (scheduler, params, thread) -> the tapes of its shapes
_TAPES: OrderedDict[tuple[Any, ModelParams, int], _Bank] = OrderedDict()
_TAPES_LOCK = threading.Lock()  # the dict itself (each bank is its thread's own)


def _bank(scheduler: Scheduler, params: ModelParams) -> _Bank:
    """The bank of ``scheduler`` on ``params``: shared across runs when the scheduler is
    hashable (frozen dataclasses are), else one for this run only.  One per thread: a run
    changes its bank's arrays between calls of the kernel (a thread pool running two runs
    of one rule at once must not see the other's half-made changes)."""
    try:
        key = (scheduler, params, threading.get_ident())
        hash(key)
    except TypeError:  # an unhashable scheduler: tapes per run only
        return _Bank()
    with _TAPES_LOCK:
        bank = _TAPES.get(key)
        if bank is None:
            bank = _TAPES[key] = _Bank()
        _TAPES.move_to_end(key)
    return bank


def _within_budget(bank: _Bank, now: int) -> None:
    """Hold all banks to :data:`TAPE_BYTES`: other banks go first (least recently used; a run
    of another thread keeps its own until it ends), then this bank's least recently used tapes
    (not slot ``now``'s), down to three quarters of the budget."""
    with _TAPES_LOCK:
        banks = list(_TAPES.items())
        total = sum(b.nbytes for _, b in banks) + (0 if any(b is bank for _, b in banks) else bank.nbytes)
        for key, other in banks:
            if total <= TAPE_BYTES:
                return
            if other is not bank:
                total -= other.nbytes
                _TAPES.pop(key, None)
    if total > TAPE_BYTES:
        bank.evict(TAPE_BYTES * 3 // 4, now)


def trace_rule(scheduler: Scheduler, params: ModelParams, K: int, Q: int, ask: bool = True) -> Tape:
    """:func:`~kvstab.engine.tape.trace_tape` of ``scheduler`` for views of ``K`` active and
    ``Q`` shown waiting entries (the tape the plug-in path runs for that shape): with ``ask``,
    the rows of a guard that covers most of the tape are left to the rule, else none."""
    return trace_tape(scheduler, params, K, Q, ask)


class _Asker:
    """Asks the rule itself for the decision of the kernel's current slot (one run): builds
    the view :meth:`Engine.view` would, calls the rule, checks its answer as the reference
    engine does, and writes it where the kernel reads a slot's answers (``once_*``, ``ans*``)."""

    def __init__(self, scheduler: Scheduler, params: ModelParams, svars: tuple[StateVar, ...]) -> None:
        self.scheduler, self.params, self.svars = scheduler, params, svars
        self.who = scheduler.name
        self.seen = traits_of(scheduler).clairvoyant
        self.waiting: dict[int, WaitingEntry] = {}  # a waiting entry never changes: one per request
        self.hidden: dict[int, HiddenOutput] = {}  # the placeholder for o (a rule that is not clairvoyant)
        self.once_k = np.zeros(16, dtype=np.int64)
        self.once_q = np.zeros(16, dtype=np.int64)
        self.once_off = np.zeros(16, dtype=np.int64)
        self.once_flags = np.zeros(16, dtype=np.int64)
        self.ends: list[int] = [0] * 16
        self.ans = np.zeros(1024, dtype=np.int64)
        self.ansf = np.zeros(1024, dtype=np.float64)
        self.anst = np.zeros(1024, dtype=np.int64)

    def _hide(self, r: int) -> HiddenOutput:
        h = self.hidden[r] = hidden_output(self.who, r)
        return h

    def view(
        self, shape: tuple[int, int], st: np.ndarray, act: np.ndarray, qbuf: np.ndarray, ps: np.ndarray,
        po: np.ndarray, prog: np.ndarray, sv: np.ndarray, svf: np.ndarray, svtag: np.ndarray,
    ) -> View:  # fmt: skip
        """The view the kernel's current slot shows the rule (as :meth:`Engine.view` builds it)."""
        K, Q = shape
        qh, ql, cap = int(st[L.ST_QH]), int(st[L.ST_QL]), qbuf.shape[0]
        a = act[:K]
        rids = a.tolist()
        if self.seen:
            outs = po[a].tolist()
        else:
            # the placeholder raises on any use (truth included): looked up, never tested
            hidden = self.hidden
            outs = [hidden[r] if r in hidden else self._hide(r) for r in rids]
        active = tuple(map(active_entry, rids, ps[a].tolist(), outs, prog[a].tolist()))
        heads = qbuf[(qh + np.arange(Q)) % cap].tolist() if Q else []
        waiting = []
        for r in heads:
            e = self.waiting.get(r)
            if e is None:
                e = self.waiting[r] = waiting_entry(
                    r, int(ps[r]), int(po[r]) if self.seen else self.hidden[r] if r in self.hidden else self._hide(r)
                )
            waiting.append(e)
        return View(
            active=active,
            waiting=tuple(waiting),
            M=self.params.M,
            chunk=self.params.chunk,
            block=self.params.block,
            token_budget=self.params.token_budget,
            max_num_seqs=self.params.max_num_seqs,
            n_waiting=ql,
            # each variable as the rule returned it last: an int, or (a real one) possibly a float
            state=tuple(float(f) if tag else int(v) for v, f, tag in zip(sv, svf, svtag)),
        )

    def answer(self, view: View, st: np.ndarray) -> None:
        """The rule's own decision on ``view``, for the current slot only; :class:`Bail` for anything
        the reference engine would report (it then runs and reports it)."""
        who = self.who
        try:
            decision = self.scheduler.decide(view, CONCRETE)
            decision = check_decision_values(check_decision_shape(decision, view, who), who)
            if decision.state is not None:
                check_next_state(decision, view.state, self.svars, who)
        except Exception as exc:  # the reference engine raises this as InvalidScheduler, naming the slot
            raise Bail(f"a decision the reference engine refuses ({type(exc).__name__})") from None
        ints = [1 if x else 0 for x in decision.admit]
        ints += [1 if x else 0 for x in decision.preempt]
        if decision.grants is not None:
            ints += [int(g) for g in decision.grants]
        nst = 0 if decision.state is None else len(decision.state)
        x = int(st[L.ST_NONCE])
        off = self.ends[x - 1] if x > 0 else 0
        n = len(ints) + nst
        if off + n > self.ans.shape[0]:
            for name in ("ans", "ansf", "anst"):
                setattr(self, name, _Bank._grow(getattr(self, name), off + n))
        if x + 1 > self.once_k.shape[0]:
            for name in ("once_k", "once_q", "once_off", "once_flags"):
                setattr(self, name, _Bank._grow(getattr(self, name), x + 1))
            self.ends += [0] * (x + 1 - len(self.ends))
        if decision.state is not None:  # checked: ints, and floats for real variables
            for m, v in enumerate(decision.state):
                v = v.item() if isinstance(v, np.generic) else v
                if isinstance(v, float):
                    self.ansf[off + len(ints) + m], self.anst[off + len(ints) + m] = v, 1
                    v = 0
                else:
                    self.anst[off + len(ints) + m] = 0
                ints.append(int(v))
        if ints and (max(ints) > LIMIT or min(ints) < -LIMIT):
            raise Bail("a value beyond the 64-bit registers")
        self.ans[off : off + n] = ints
        self.once_k[x], self.once_q[x], self.once_off[x] = len(view.active), len(view.waiting), off
        self.once_flags[x] = (1 if decision.grants is not None else 0) | (2 if decision.state is not None else 0)
        self.ends[x] = off + n
        st[L.ST_NONCE] = x + 1


@dataclass(frozen=True, slots=True)
class PluginPath:
    """A plug-in rule's faster path (see the module docstring)."""

    scheduler: Scheduler

    def run(
        self,
        params: ModelParams,
        plan: ArrivalPlan,
        h: Horizon,
        rep: Reporting,
        *,
        check: bool,
        window: int,
        decide_timeout: float | None = None,
        spec: str | None = None,
    ) -> tuple[Summary, SimResult | None]:
        """:func:`kvstab.simulator.simulate`'s run on the compiled loop: the summary and
        (with ``record``) the :class:`SimResult`.  Raises :class:`Bail` where the
        reference engine must run instead, :class:`Untraceable` for a shape the rule
        cannot be taped on, and :class:`InvalidScheduler` (naming ``spec``) when a call of
        the rule — taping a shape calls ``decide`` once, asking it once per slot — runs
        past ``decide_timeout`` seconds, as the reference engine does."""
        if h.slots is None and not h.drain:
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
        st = np.zeros(L.ST_SIZE, dtype=np.int64)
        st[L.ST_PEND] = -1
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
        bank = _bank(self.scheduler, params)
        bank.tused[: bank.count] = -1  # this run's use orders the tapes for eviction
        asker = _Asker(self.scheduler, params, svars)
        dec = np.zeros(3 * (n + 1) + len(svars), dtype=np.int64)
        decf = np.zeros(max(len(svars), 1), dtype=np.float64)
        dect = np.zeros(max(len(svars), 1), dtype=np.int64)
        prev = np.zeros(n + 1, dtype=np.int64)
        # the loop stops at max_slots; a fixed horizon beyond it is refused once the loop is back
        horizon = min(h.end, h.max_slots)
        stats = rep.stats(params.M, horizon if h.fixed else None)
        reqs = (ps, po, prog, att, served, wasted, npre, first, fin)
        svs = (sv, svf, svtag, svreal, svlo, svhi, svflo, svfhi)
        decision = (dec, decf, dect)
        scratch = (tmp, scr, prev)

        who = spec or self.scheduler.name

        def limited() -> AbstractContextManager[None]:
            return decide_limited(decide_timeout, who, int(st[L.ST_T]))

        def step(t_end: int, out: np.ndarray, bins: object) -> int:
            """Run the loop to ``t_end``, taping or asking the rule for each shape it needs."""
            t0 = int(st[L.ST_T])
            while True:
                cfg = config(params, check, t_end, h.drain, h.drain_min, t0, window=window)
                tapes = (bank.code, bank.code.view(np.float64), bank.tstart, bank.tlen, bank.ostart, bank.outs,
                         bank.okind, bank.tflags, bank.tid, bank.tused, bank.tcount)  # fmt: skip
                once = (asker.once_k, asker.once_q, asker.once_off, asker.once_flags, asker.ans, asker.ansf,
                        asker.anst)  # fmt: skip
                status = PK.run_plugin_slots(
                    cfg, pslot, reqs, qbuf, act, st, svs, tapes, once, (bank.R, bank.F, bank.T), decision, scratch, out
                )  # fmt: skip
                if status != L.NEED_TAPE:
                    break
                shape = (int(st[L.ST_NEEDK]), int(st[L.ST_NEEDQ]))
                ask = bool(st[L.ST_ASK])  # the shape's tape left this slot to the rule (an ASK row)
                if ask and bank.asks_often(shape):  # tape it again, keeping the rows it asks for
                    bank.no_ask.add(shape)
                    bank.drop(shape)
                    ask = False
                    st[L.ST_ASK] = 0
                    with limited():
                        tape = trace_rule(self.scheduler, params, *shape, ask=False)
                    bank.add(tape, int(st[L.ST_T]))
                    _within_budget(bank, int(st[L.ST_T]))
                elif not ask and bank.rental.tape_now(shape):
                    c0 = time.process_time()
                    with limited():
                        tape = trace_rule(self.scheduler, params, *shape, ask=shape not in bank.no_ask)
                    bank.rental.taped(shape, shape[0] + shape[1] + 1, time.process_time() - c0)
                    bank.add(tape, int(st[L.ST_T]))
                    _within_budget(bank, int(st[L.ST_T]))
                else:  # ski rental: ask the rule itself until the shape has cost what taping it would
                    c0 = time.process_time()
                    view = asker.view(shape, st, act, qbuf, ps, po, prog, sv, svf, svtag)
                    with limited():
                        asker.answer(view, st)
                    if not ask:
                        bank.rental.asked(shape, time.process_time() - c0)
            if status == L.BAIL:
                raise Bail(f"slot {int(st[L.ST_T])}")
            return status

        drive(step, st, stats, rows=L.NCOLS, horizon=horizon, fixed=h.fixed, max_slots=h.max_slots,
              progress=rep.progress, on_violation=lambda: Bail("a violation"), streamed=False)  # fmt: skip
        t = int(st[L.ST_T])
        if h.fixed and t < h.end:
            raise InvalidArgument(f"simulation did not drain within max_slots={h.max_slots}")
        req = Requests(ps, po, pslot, first, fin, npre, served, wasted)
        return finish(stats, self.scheduler.name, params, t, int(st[L.ST_I]), req, plan.dropped, rep.record,
                      window=window, window_hid_slots=int(st[L.ST_HID]))  # fmt: skip


@contextmanager
def decide_limited(seconds: float | None, who: str, slot: int) -> Iterator[None]:
    """Calls of the rule ``who`` inside this block (taping a shape, asking for a slot's decision)
    end with the reference engine's :class:`InvalidScheduler` and words after ``seconds`` of wall
    time (``None``: no limit); ``slot`` is the slot the run is at."""
    if seconds is not None and threading.current_thread() is not threading.main_thread():
        raise InvalidArgument("a decide timeout needs the main thread (it uses signal.setitimer)")
    try:
        with time_limit(seconds):
            yield
    except DecideTimeout:
        raise InvalidScheduler(
            f"scheduler {who!r} in slot {slot}: decide did not return within the {seconds:g} s limit (--decide-timeout)"
        ) from None


def plugin_path(
    scheduler: Scheduler, lifecycle: str, decide_timeout: float | None = None, spec: str | None = None
) -> tuple[PluginPath | None, str]:
    """The faster path for a plug-in rule, or ``None`` and the reason there is none.

    The rule is taped on a small view (2 active, 2 waiting entries) to find out
    early whether it can be taped at all (under ``decide_timeout``, naming the rule
    ``spec``: :func:`decide_limited`); every other shape is taped when the
    run first meets it, and an untapeable shape there also falls back."""
    if lifecycle != "kvstab":
        return None, "the plug-in path runs kvstab's lifecycle only"
    try:
        traits_of(scheduler)
        with decide_limited(decide_timeout, spec or scheduler.name, 0):
            trace_tape(scheduler, ModelParams(M=64, chunk=4), 2, 2)
    except (Untraceable, InvalidScheduler) as exc:
        return None, f"the rule cannot be traced to a tape ({exc})"
    return PluginPath(scheduler), (
        "a compiled loop: the rule taped to register code for the view shapes met often, asked itself for the others"
    )
