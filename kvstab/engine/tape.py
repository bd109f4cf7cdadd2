"""A plug-in rule traced to a *tape*: straight-line register code the compiled slot loop evaluates.

A rule written against :class:`kvstab.ops.Ops` may not branch on the values it
reads (the contract; z3 could not run it otherwise), so for one *shape* of view
— ``K`` active entries, ``Q`` shown waiting entries, the server's fixed
parameters — it computes one fixed expression of the view's values.
:class:`TapeOps` runs the rule once on recording values and writes that
expression down as a tape: one row ``(op, dst, a, b, c)`` per operation on
int64 and float64 registers.  :mod:`kvstab.engine._plugin_kernel` evaluates the tape every
slot inside its numba loop, so a plug-in rule costs a few nanoseconds per
operation instead of a Python call per operation.

Exactness (the tape computes what :data:`kvstab.ops.CONCRETE` computes):

* every integer operation has Python's integer semantics on int64 (floor
  division and modulo round towards −∞; bools are 0/1 and add as ints);
* each integer register carries static bounds (interval arithmetic from the
  inputs' ranges); an addition, subtraction, negation or product whose bounds
  could leave ±2⁶¹ is emitted as a *checked* operation that stops the run when
  the value really does, and a division or modulo stops it on a zero divisor —
  the driver then runs the reference engine, which reproduces Python's own
  outcome (a big integer, or the plug-in's ``ZeroDivisionError`` as
  ``InvalidScheduler``);
* floats are IEEE doubles in a float64 register file, as Python's are: ``+``,
  ``−``, ``*``, ``/`` round once each (numba compiles without fast-math, so no
  fused multiply-add; ``tests/test_engine_plugin_tape.py`` checks it), ``//``
  and ``%`` follow CPython's ``float_divmod`` step for step, ``int / int`` is
  true division; an int meets a float only where float64 holds it exactly
  (|i| ≤ 2⁵³; beyond, the run stops and the reference engine computes it), so
  an int–float comparison is Python's exact one; a sum with floats is a chain
  of additions, as CPython < 3.12's ``sum`` (3.12 compensates: not taped);
* each register carries its Python type (``bool``, ``int``, either of the two,
  ``float``, or int-or-float — ``0 if d else x * ratio`` — held with a run-time
  tag, so ``min``/``max`` keep the first of equals with its own type): a
  decision whose ``admit``/``preempt`` entries are not surely ``bool``, grants
  or an integer state variable's next value not surely ``int``, or a real one's
  possibly a ``bool``, is not taped;
* anything else a rule does with a value — ``bool()``/``int()``/``float()``,
  indexing, hashing, ``**``, a non-ops function — raises :class:`Untraceable`
  while the rule is traced; the run then takes the reference engine (and says so).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstab.contract import (
    ActiveEntry,
    HiddenOutput,
    Scheduler,
    View,
    WaitingEntry,
    check_decision_shape,
    count_of,
    hidden_output,
    state_vars_of,
    traits_of,
)
from kvstab.contract.admission import Projected, projected_entries, walk_projected
from kvstab.engine import _guards
from kvstab.engine._guards import with_guards
from kvstab.engine._opcodes import EXACT, LIMIT, OP, OPS
from kvstab.errors import InvalidScheduler
from kvstab.model import ModelParams
from kvstab.schedulers.lookahead import Projection
from kvstab.validation import MAX_TOKENS

__all__ = ["Tape", "TapeOps", "Untraceable", "trace_tape", "OPS", "LIMIT", "EXACT"]


class Untraceable(Exception):
    """The rule did something with a value that a fixed expression cannot record."""


#: bounds of the view's values (request ids and queue lengths: far beyond any plan)
_LEN = (1, MAX_TOKENS)
_PROGRESS = (0, 2 * MAX_TOKENS)
_COUNT = (0, MAX_TOKENS)

#: Python types a register may hold: surely bool, surely int, either of the two, surely float,
#: or int-or-float (``NUM``: known only when the tape runs, as ``0 if d else x * ratio``)
BOOL, INT, EITHER, FLOAT, NUM = "b", "i", "?", "f", "n"
_INTS = (BOOL, INT, EITHER)
#: where a register's value lives in the kernel: the int64 file ``R``, the float64 file ``F``,
#: or either, as the tag file ``T`` says at run time (0: ``R``, 1: ``F``)
STORE = {BOOL: 0, INT: 0, EITHER: 0, FLOAT: 1, NUM: 2}

#: Python's ``sum`` adds floats one by one before 3.12 (3.12 compensates: Neumaier), so a float sum is
#: a chain of additions only there
_SEQUENTIAL_FLOAT_SUM = sys.version_info < (3, 12)


_ADD, _SUB, _MUL, _FDIV, _MOD, _TDIV = OP["ADD"], OP["SUB"], OP["MUL"], OP["FDIV"], OP["MOD"], OP["XTDIV"]
_LT, _LE, _GT, _GE, _EQ, _NE = OP["LT"], OP["LE"], OP["GT"], OP["GE"], OP["EQ"], OP["NE"]


class _V:
    """A value of the traced rule: a register of the tape, its type and bounds."""

    __slots__ = ("reg", "kind", "lo", "hi", "tape")

    def __init__(self, reg: int, kind: str, lo: int, hi: int, tape: TapeOps) -> None:
        self.reg, self.kind, self.lo, self.hi, self.tape = reg, kind, lo, hi, tape

    def __add__(self, o: Any) -> Any:
        # the common case inline (two int registers of this trace, no overflow possible): tracing
        # is Python-bound, and a call less per row is a good part of its cost
        if type(o) is _V and self.kind is INT and o.kind is INT and o.tape is self.tape:
            lo, hi = self.lo + o.lo, self.hi + o.hi
            if -LIMIT <= lo and hi <= LIMIT:
                tape = self.tape
                reg = tape.n_regs
                tape.n_regs = reg + 1
                tape.flat += (_ADD, reg, self.reg, o.reg, 0, 0)
                return _V(reg, INT, lo, hi, tape)
        return self.tape.arith(_ADD, self, o)

    def __radd__(self, o: Any) -> Any:
        return self.tape.arith(_ADD, o, self)

    def __sub__(self, o: Any) -> Any:
        if type(o) is _V and self.kind is INT and o.kind is INT and o.tape is self.tape:  # as __add__
            lo, hi = self.lo - o.hi, self.hi - o.lo
            if -LIMIT <= lo and hi <= LIMIT:
                tape = self.tape
                reg = tape.n_regs
                tape.n_regs = reg + 1
                tape.flat += (_SUB, reg, self.reg, o.reg, 0, 0)
                return _V(reg, INT, lo, hi, tape)
        return self.tape.arith(_SUB, self, o)

    def __rsub__(self, o: Any) -> Any:
        return self.tape.arith(_SUB, o, self)

    def __mul__(self, o: Any) -> Any:
        return self.tape.arith(_MUL, self, o)

    def __rmul__(self, o: Any) -> Any:
        return self.tape.arith(_MUL, o, self)

    def __floordiv__(self, o: Any) -> Any:
        return self.tape.arith(_FDIV, self, o)

    def __rfloordiv__(self, o: Any) -> Any:
        return self.tape.arith(_FDIV, o, self)

    def __mod__(self, o: Any) -> Any:
        return self.tape.arith(_MOD, self, o)

    def __rmod__(self, o: Any) -> Any:
        return self.tape.arith(_MOD, o, self)

    def __truediv__(self, o: Any) -> Any:
        return self.tape.arith(_TDIV, self, o)

    def __rtruediv__(self, o: Any) -> Any:
        return self.tape.arith(_TDIV, o, self)

    def __neg__(self) -> Any:
        return self.tape.neg(self)

    def __lt__(self, o: Any) -> Any:
        return self.tape.cmp(_LT, self, o)

    def __le__(self, o: Any) -> Any:
        return self.tape.cmp(_LE, self, o)

    def __gt__(self, o: Any) -> Any:
        return self.tape.cmp(_GT, self, o)

    def __ge__(self, o: Any) -> Any:
        return self.tape.cmp(_GE, self, o)

    def __eq__(self, o: Any) -> Any:  # type: ignore[override]
        return self.tape.cmp(_EQ, self, o)

    def __ne__(self, o: Any) -> Any:  # type: ignore[override]
        return self.tape.cmp(_NE, self, o)

    def _refuse(self, *_: Any) -> Any:
        raise Untraceable(f"the rule used a value with Python control flow or a conversion (register {self.reg})")

    __bool__ = __index__ = __int__ = __float__ = __hash__ = __iter__ = __len__ = _refuse  # type: ignore[assignment]
    __abs__ = __pos__ = __invert__ = __and__ = __or__ = __xor__ = __pow__ = _refuse  # type: ignore[assignment]


def _fold(x: Any) -> bool:
    """Whether ``x`` is a plain Python value (computed now, not recorded)."""
    return type(x) is not _V


_CHECKED = {_ADD: OP["ADDC"], _SUB: OP["SUBC"], _MUL: OP["MULC"]}
_FOLD = {
    _ADD: lambda x, y: x + y,
    _SUB: lambda x, y: x - y,
    _MUL: lambda x, y: x * y,
    _FDIV: lambda x, y: x // y,
    _MOD: lambda x, y: x % y,
    _TDIV: lambda x, y: x / y,
}
#: the float-or-mixed twin of each operation (``XTDIV``, true division, has no integer form)
_X = {OP[n]: OP["X" + n] for n in ("ADD SUB MUL FDIV MOD NEG LT LE GT GE EQ NE ITE MIN MAX TRUTH").split()}
_X[_TDIV] = _TDIV
_CMP = {
    _LT: lambda x, y: x < y,
    _LE: lambda x, y: x <= y,
    _GT: lambda x, y: x > y,
    _GE: lambda x, y: x >= y,
    _EQ: lambda x, y: x == y,
    _NE: lambda x, y: x != y,
}
_CONST, _NEG, _ITE = OP["CONST"], OP["NEG"], OP["ITE"]
_MIN, _MAX, _AND, _OR, _NOT, _TRUTH = OP["MIN"], OP["MAX"], OP["AND"], OP["OR"], OP["NOT"], OP["TRUTH"]
_FCONST = OP["FCONST"]
_PJV, _PROJ, _PJO = OP["PJV"], OP["PROJ"], OP["PJO"]


def _merge(x: str, y: str) -> str:
    """The Python type of a value that is one of two registers (``ite``, ``min``, ``max``)."""
    if x == y:
        return x
    if x in _INTS and y in _INTS:
        return EITHER
    if x in (BOOL, EITHER) or y in (BOOL, EITHER):
        raise Untraceable("a value that may be a bool or a float")
    return NUM


def float_bits(x: float) -> int:
    """``x``'s IEEE bits as an int64 (how a float constant sits in a tape row)."""
    return int(np.float64(x).view(np.int64))


class TapeOps:
    """The ops interface recording a tape (``ConcreteOps``' semantics on int64 registers).

    Tracing runs once per view shape, hundreds of times in a run, so the
    recording is kept lean: a flat list of row fields, opcodes as ints."""

    symbolic = False  # engines build concrete views for it; rules must not look

    def __init__(self, n_inputs: int) -> None:
        self.flat: list[int] = []
        self.n_regs = n_inputs
        self._consts: dict[tuple[str, int | str], _V] = {}  # ints by value, floats by their hex (bits)
        self.projected_native = True  # fcfs_admit_projected over lookahead's projection: one native walk

    # --- registers
    def _new(self, op: int, a: int, b: int, c: int, kind: str, lo: int, hi: int, k: int = 0) -> _V:
        reg = self.n_regs
        self.n_regs = reg + 1
        self.flat += (op, reg, a, b, c, k)
        return _V(reg, kind, lo, hi, self)

    def _x(self, op: int, kind: str, *xs: _V) -> _V:
        """A float or mixed operation: the row's 6th field holds where each operand (2 bits
        each, in order) and the result (bits 6–7) live (:data:`STORE`).  Bounds are not
        tracked for floats (they cannot overflow into an exception); the kernel checks every
        integer result of a mixed operation against ±2⁶¹ instead."""
        k = STORE[kind] << 6
        regs = [0, 0, 0]
        for n, v in enumerate(xs):
            k |= STORE[v.kind] << (2 * n)
            regs[n] = v.reg
        return self._new(op, regs[0], regs[1], regs[2], kind, -LIMIT, LIMIT, k)

    def code(self) -> np.ndarray:
        """The rows recorded so far, as the kernel reads them: ``(rows, 6)`` int64."""
        return np.fromiter(self.flat, dtype=np.int64, count=len(self.flat)).reshape(-1, 6)

    def leaf(self, reg: int, kind: str, lo: int, hi: int) -> _V:
        """Input register ``reg`` (filled by the kernel before each evaluation)."""
        return _V(reg, kind, lo, hi, self)

    def val(self, x: Any) -> _V:
        """``x`` as a register: a recorded value, or a constant loaded once."""
        tx = type(x)
        if tx is _V:
            if x.tape is not self:
                raise Untraceable("a value from another trace")
            return x
        if tx is int:  # the common constant (0, 1, M, chunk): one lookup
            hit = self._consts.get((INT, x))
            if hit is not None:
                return hit
        if isinstance(x, HiddenOutput):
            x._read()  # a non-clairvoyant rule read o: the reference engine raises the same
        if isinstance(x, (bool, np.bool_)):
            key, value = (BOOL, int(bool(x)))
        elif isinstance(x, (int, np.integer)):
            key, value = (INT, int(x))
            if abs(value) > LIMIT:
                raise Untraceable(f"the constant {value} does not fit the tape's 64-bit registers")
        elif isinstance(x, (float, np.floating)):
            f = float(x)
            hit = self._consts.get((FLOAT, f.hex()))  # by bits: 0.0 and -0.0 are different constants
            if hit is None:
                hit = self._consts[(FLOAT, f.hex())] = self._new(_FCONST, float_bits(f), 0, 0, FLOAT, -LIMIT, LIMIT)
            return hit
        else:
            raise Untraceable(f"the rule combined a value with {type(x).__name__} {x!r}")
        hit = self._consts.get((key, value))
        if hit is None:
            hit = self._consts[(key, value)] = self._new(_CONST, value, 0, 0, key, value, value)
        return hit

    # --- arithmetic with bounds; checked where the bounds could leave ±LIMIT
    def _as_int(self, a: _V) -> _V:
        """``a`` as Python's int of it (``x + 0`` for a bool is the int 1 or 0: same register)."""
        return a if a.kind == INT else _V(a.reg, INT, a.lo, a.hi, self)

    def arith(self, op: int, x: Any, y: Any) -> Any:
        tx, ty = type(x), type(y)
        if tx is not _V and ty is not _V:
            return _FOLD[op](x, y)
        # identities of Python's integers (x + 0, 0 + x, x - 0, x * 1, 1 * x, x // 1 are x as an int),
        # recorded as no row: tokens_held's ``⌈p / 1⌉ · 1`` and sum's starting 0 cost nothing
        if tx is int and (x == 0 and op == _ADD or x == 1 and op == _MUL):
            b = y if y.tape is self else self.val(y)
            if b.kind in _INTS:
                return self._as_int(b)
        a = x if tx is _V and x.tape is self else self.val(x)
        if (
            ty is int
            and a.kind in _INTS
            and (y == 0 and (op == _ADD or op == _SUB) or y == 1 and (op == _MUL or op == _FDIV))
        ):
            return self._as_int(a)
        b = y if ty is _V and y.tape is self else self.val(y)
        ka, kb = a.kind, b.kind
        if op == _TDIV or ka not in _INTS or kb not in _INTS:
            # Python: true division is always a float; a float operand makes the result one;
            # an int-or-float operand with an int one leaves the type to the run
            kind = FLOAT if op == _TDIV or FLOAT in (ka, kb) else NUM
            return self._x(_X[op], kind, a, b)
        if op == _ADD:
            lo, hi = a.lo + b.lo, a.hi + b.hi
        elif op == _SUB:
            lo, hi = a.lo - b.hi, a.hi - b.lo
        elif op == _MUL:
            ends = (a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
            lo, hi = min(ends), max(ends)
        elif op == _FDIV:  # |a // b| <= |a| for any integer b != 0 (0 stops the run)
            m = max(-a.lo, a.hi)
            lo, hi = -m, m
        else:  # MOD: |a % b| < |b|
            m = max(-b.lo, b.hi)
            lo, hi = -m, m
        if lo < -LIMIT or hi > LIMIT:
            op, lo, hi = _CHECKED[op], max(lo, -LIMIT), min(hi, LIMIT)
        reg = self.n_regs
        self.n_regs = reg + 1
        self.flat += (op, reg, a.reg, b.reg, 0, 0)
        return _V(reg, INT, lo, hi, self)

    def neg(self, x: Any) -> Any:
        if type(x) is not _V:
            return -x
        a = self.val(x)
        if a.kind not in _INTS:
            return self._x(_X[_NEG], a.kind, a)
        return self._new(_NEG, a.reg, 0, 0, INT, -a.hi, -a.lo)

    def cmp(self, op: int, x: Any, y: Any) -> Any:
        tx, ty = type(x), type(y)
        if tx is not _V and ty is not _V:
            return _CMP[op](x, y)
        a = x if tx is _V and x.tape is self else self.val(x)
        b = y if ty is _V and y.tape is self else self.val(y)
        if a.kind not in _INTS or b.kind not in _INTS:  # Python compares an int with a float exactly
            return self._x(_X[op], BOOL, a, b)
        reg = self.n_regs
        self.n_regs = reg + 1
        self.flat += (op, reg, a.reg, b.reg, 0, 0)
        return _V(reg, BOOL, 0, 1, self)

    def _truth(self, x: _V) -> _V:
        """``bool(x)`` as a 0/1 register (a float is true unless ±0.0; NaN is true; a bool is itself)."""
        if x.kind == BOOL:
            return x
        if x.kind in _INTS:
            return self._new(_TRUTH, x.reg, 0, 0, BOOL, 0, 1)
        return self._x(_X[_TRUTH], BOOL, x)

    # --- the Ops interface
    def const(self, value: int) -> Any:
        return int(value)

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if type(cond) is not _V:  # decided by the shape alone
            return then if cond else other
        if isinstance(then, tuple) or isinstance(other, tuple):
            raise Untraceable("ite on tuples")
        c = cond if cond.tape is self else self.val(cond)
        a = then if type(then) is _V and then.tape is self else self.val(then)
        b = other if type(other) is _V and other.tape is self else self.val(other)
        if a is b:  # either way the same register (no row)
            return a
        kind = _merge(a.kind, b.kind)
        if kind not in _INTS or c.kind not in _INTS:
            return self._x(_X[_ITE], kind, c, a, b)
        reg = self.n_regs
        self.n_regs = reg + 1
        self.flat += (_ITE, reg, c.reg, a.reg, b.reg, 0)
        return _V(reg, kind, a.lo if a.lo < b.lo else b.lo, a.hi if a.hi > b.hi else b.hi, self)

    def _fold_chain(self, op: int, xs: tuple[Any, ...]) -> Any:
        acc = self.val(xs[0])
        for x in xs[1:]:
            r = x if type(x) is _V and x.tape is self else self.val(x)
            kind = _merge(acc.kind, r.kind)
            if kind not in _INTS:  # Python's min/max keep the first of equals with its own type
                acc = self._x(_X[op], kind, acc, r)
                continue
            if op == _MIN:
                lo, hi = min(acc.lo, r.lo), min(acc.hi, r.hi)
            else:
                lo, hi = max(acc.lo, r.lo), max(acc.hi, r.hi)
            acc = self._new(op, acc.reg, r.reg, 0, kind, lo, hi)
        return acc

    def min(self, *xs: Any) -> Any:
        for x in xs:
            if type(x) is _V:
                return self._fold_chain(_MIN, xs)
        return min(xs)

    def max(self, *xs: Any) -> Any:
        for x in xs:
            if type(x) is _V:
                return self._fold_chain(_MAX, xs)
        return max(xs)

    def _logic(self, op: int, xs: tuple[Any, ...]) -> Any:
        nodes = []
        for x in xs:
            if type(x) is _V:
                nodes.append(x)
            elif op == _AND:  # Python's all/any: a plain operand decides at once or drops out
                if not x:
                    return False
            elif x:
                return True
        if not nodes:
            return op == _AND
        acc = self._truth(self.val(nodes[0]))
        for r in nodes[1:]:
            v = self.val(r)
            acc = self._new(op, acc.reg, (v if v.kind in _INTS else self._truth(v)).reg, 0, BOOL, 0, 1)
        return acc

    def and_(self, *xs: Any) -> Any:
        if len(xs) == 2:  # the common ``and_(present, test)`` of a concrete view: no row, the test itself
            x, y = xs
            if type(x) is bool and type(y) is _V and y.kind is BOOL and y.tape is self:
                return y if x else False
        return self._logic(_AND, xs)

    def or_(self, *xs: Any) -> Any:
        return self._logic(_OR, xs)

    def not_(self, x: Any) -> Any:
        if type(x) is not _V:
            return not x
        v = self.val(x)
        return self._new(_NOT, (v if v.kind in _INTS else self._truth(v)).reg, 0, 0, BOOL, 0, 1)

    def sum(self, xs: Iterable[Any]) -> Any:
        acc: Any = 0  # Python's sum starts at 0 (so a sum of bools is an int)
        for x in xs:
            if not _SEQUENTIAL_FLOAT_SUM and (
                isinstance(x, (float, np.floating)) or (type(x) is _V and x.kind in (FLOAT, NUM))
            ):
                raise Untraceable("a sum of floats (CPython >= 3.12 compensates it; the tape adds one by one)")
            acc = acc + x if type(acc) is not _V and type(x) is not _V else self.arith(_ADD, acc, x)
        return acc

    def lt(self, a: Any, b: Any) -> Any:
        return self.cmp(_LT, a, b)

    def le(self, a: Any, b: Any) -> Any:
        return self.cmp(_LE, a, b)

    def eq(self, a: Any, b: Any) -> Any:
        return self.cmp(_EQ, a, b)

    def div(self, a: Any, b: Any) -> Any:
        return self.arith(_FDIV, a, b)

    def floor(self, x: Any) -> Any:
        if type(x) is not _V:
            return math.floor(x)
        a = self.val(x)
        if a.kind == INT:
            return a
        if a.kind in _INTS:  # a bool: ⌊True⌋ is the int 1
            return self.arith(_ADD, a, 0)
        # a float (or a value that is a float in some slots): the kernel floors it to an int
        # register, and stops the run beyond ±2⁶¹ (inf and NaN included: Python raises there)
        return self._x(OP["XFLOOR"], INT, a)

    def ceil_div(self, a: Any, b: Any) -> Any:
        return self.neg(self.arith(_FDIV, self.neg(a), b))

    def count(self, xs: Iterable[Any]) -> Any:
        # an int sum (associative): the plain entries (``a.present`` of a concrete view) are counted
        # here and added once, after the recorded ones
        plain = 0
        acc: Any = 0
        for x in xs:
            if type(x) is not _V:
                if x:
                    plain += 1
            else:
                acc = self.arith(_ADD, acc, self._truth(self.val(x)))
        return self.arith(_ADD, acc, plain)

    # --- the projection walk (see _TapeQueue)
    def projected_walk(self, view: View, act: list[Projected], cands: list[Projected]) -> tuple[Any, ...] | None:
        """The admit flags of :func:`~kvstab.contract.walk_projected` as ``PJV``/``PROJ``/``PJO``
        rows, or ``None`` where the native walk does not apply (the caller unrolls it)."""
        K, Q = len(act), len(cands)
        chunk, block, cap = view.chunk, view.block, view.max_num_seqs
        projs = [p for p in (*act, *cands) if type(p) is Projection]
        if not (Q <= 60 and len(projs) == K + Q):
            return None
        if not (type(chunk) is int and type(block) is int and chunk >= 1 and block >= 1):
            return None
        if Q == 0:
            # nobody to admit, and the projection's formula cannot raise (it divides by the block
            # only): the unrolled walk's K² rows would all be dead
            return ()
        if not (cap is None or (type(cap) is int and cap >= 0)):
            return None
        if not all(w.present is True for w in view.waiting):
            return None
        fields: list[_V] = []
        for p in projs:
            for x in (p.s, p.p, p.f, p.rp, p.present):
                v = self.val(x)  # what the unrolled walk would refuse, val refuses too
                if v.kind not in _INTS:
                    return None
                fields.append(v)
        # every total the walk forms stays within ±2⁶¹ (it then computes in int64 exactly what Python does)
        mag = lambda v: max(abs(v.lo), abs(v.hi))  # noqa: E731
        tau = max(mag(f) for f in fields[2::5])  # the walk evaluates held_at at finish slots only
        big = 0
        for i in range(K + Q):
            s_, p_, _f, rp_ = fields[5 * i : 5 * i + 4]
            prog = max(mag(p_) + tau * chunk, mag(s_), max(mag(p_), mag(s_)) + tau + mag(rp_))
            big = max(big, prog + block)
        m = self.val(view.M)
        if m.kind not in _INTS or (K + Q + 1) * big > LIMIT:
            return None
        running0 = self.val(count_of(view.active, lambda a: a.present, self))
        header = [self.val(chunk), self.val(block), self.val(-1 if cap is None else cap), self.val(K), self.val(Q)]
        prev = -1
        for v in (*fields, *header):
            r = self._new(_PJV, v.reg, v.reg if prev < 0 else prev, 0, INT, v.lo, v.hi)
            prev = r.reg
        walk = self._new(_PROJ, prev, m.reg, running0.reg, INT, 0, (1 << Q) - 1)
        return tuple(self._new(_PJO, walk.reg, j, 0, BOOL, 0, 1) for j in range(Q))


class _TapeQueue(tuple):  # type: ignore[type-arg]
    """The waiting entries of a traced view: a tuple that compiles
    :func:`~kvstab.contract.fcfs_admit_projected` over lookahead's projection into a few rows.

    **The projection walk.**  Unrolled, the walk is ``O(K²)`` rows a shape (the projected total
    at every active finish slot, each a sum over the active requests): ~10⁵ rows at ``K = 100``,
    evaluated in every slot, and ~0.4 s to trace.  When every projection is lookahead's
    :class:`~kvstab.schedulers.lookahead.Projection` (whose ``held_at`` is a fixed formula of
    its five fields, the view's chunk and block), the tape instead copies the five fields of
    each projection into a block of registers (``PJV`` rows), runs the walk natively (one
    ``PROJ`` row: :func:`kvstab.engine._plugin_kernel.projected_walk`) and reads each admit flag
    off its result (``PJO`` rows).  The native walk computes the same flags (it is the same
    function of the same values: ``tests/test_engine_plugin_tape.py`` compares it with the
    unrolled rows and with the rule itself), but it stops at the first check that fails, as
    no check can raise: the formula divides only by the block (a positive constant), and the
    walk is taken only where the fields' bounds keep every total within ±2⁶¹.  Anything else
    (another projection class, a float field, a queue longer than 60) is unrolled as before."""

    __slots__ = ()

    def __kvstab_projected__(self, view: View, ops: Any, project: Any) -> tuple[Any, ...]:
        act, cands = projected_entries(view, project)
        if isinstance(ops, TapeOps) and ops.projected_native:
            native = ops.projected_walk(view, act, cands)
            if native is not None:
                return native
        return walk_projected(view, ops, act, cands)


@dataclass(frozen=True, slots=True, eq=False)
class Tape:
    """One view shape's decision as register code (see the module docstring).

    Input registers: active entry ``k`` at ``4k`` … ``4k+3`` (rid, s, o,
    progress), waiting entry ``j`` at ``4K+3j`` … ``4K+3j+2`` (rid, s, o), then
    ``n_waiting``, then the state variables (an integer one in ``R``, a real one
    in ``R`` or ``F`` as its tag says).  ``outputs`` lists the registers of
    admit (Q), preempt (K), grants (K+Q, if ``has_grants``) and next state (if
    ``has_state``); ``okinds`` where each lives (:data:`STORE`)."""

    K: int
    Q: int
    code: np.ndarray  # (rows, 6) int64: op, dst, a, b, c, operand storage (float constants as bits in a)
    outputs: np.ndarray  # int64 register numbers
    okinds: np.ndarray  # int64 storage of each output (0: R, 1: F, 2: tagged)
    n_regs: int
    has_grants: bool
    has_state: bool


def _entry_maker(cls: type) -> Any:
    """A constructor of ``cls`` entries (frozen slots dataclasses) that sets the slots directly:
    the plug-in path builds thousands of views, and a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) is most of their cost.  The same objects, equal to what
    ``cls(...)`` builds (``present=True``, ``prior=0``); the class's own ``__init__`` where it
    validates anything (a ``__post_init__``)."""
    if hasattr(cls, "__post_init__"):
        return cls
    names = [f.name for f in dataclasses.fields(cls)]
    sets = [getattr(cls, name).__set__ for name in names]
    new = object.__new__
    if names == ["rid", "s", "o", "progress", "present", "prior"]:
        set_rid, set_s, set_o, set_p, set_present, set_prior = sets

        def active(rid: Any, s: Any, o: Any, progress: Any) -> Any:
            e: Any = new(cls)
            set_rid(e, rid)
            set_s(e, s)
            set_o(e, o)
            set_p(e, progress)
            set_present(e, True)
            set_prior(e, 0)
            return e

        return active
    if names == ["rid", "s", "o", "present", "prior"]:
        set_rid, set_s, set_o, set_present, set_prior = sets

        def waiting(rid: Any, s: Any, o: Any) -> Any:
            e: Any = new(cls)
            set_rid(e, rid)
            set_s(e, s)
            set_o(e, o)
            set_present(e, True)
            set_prior(e, 0)
            return e

        return waiting
    return cls


#: ``ActiveEntry(rid, s, o, progress)`` and ``WaitingEntry(rid, s, o)``, built faster (see :func:`_entry_maker`)
active_entry = _entry_maker(ActiveEntry)
waiting_entry = _entry_maker(WaitingEntry)

#: what tracing needs to know of a rule, by rule (``traits_of`` checks every attribute's name, which
#: costs more than tracing a small view): id -> (the rule, its traits, its state variables)
_RULES: dict[int, tuple[Any, Any, tuple[Any, ...]]] = {}


def _rule_info(scheduler: Scheduler) -> tuple[Any, tuple[Any, ...]]:
    hit = _RULES.get(id(scheduler))
    if hit is None or hit[0] is not scheduler:
        if len(_RULES) > 256:
            _RULES.clear()
        hit = _RULES[id(scheduler)] = (scheduler, traits_of(scheduler), state_vars_of(scheduler))
    return hit[1], hit[2]


def trace_tape(
    scheduler: Scheduler, params: ModelParams, K: int, Q: int, ask: bool | None = None, native_walk: bool = True
) -> Tape:
    """The rule's decision for views of ``K`` active and ``Q`` shown waiting entries
    as a :class:`Tape`; raises :class:`Untraceable` (or :class:`InvalidScheduler`
    for a decision of the wrong shape, as the reference engine would).

    Which guarded rows are left to the rule (``ASK`` rows, :mod:`kvstab.engine._guards`):
    ``ask=None`` the runs of at least ``_guards.ASK_MIN`` rows (none by default), ``True``
    also every run of a guard that covers most of the tape (``_guards.ASK_SHARE``: the
    plug-in path's first tape of a shape), ``False`` none.  ``native_walk=False`` unrolls
    :func:`~kvstab.contract.fcfs_admit_projected` row by row even over lookahead's projection
    (the tests compare both; see "The projection walk" at :class:`_TapeQueue`)."""
    traits, svars = _rule_info(scheduler)
    who = getattr(scheduler, "name", type(scheduler).__name__)
    for v in svars:
        if v.real:
            # the kernel compares a real value with its bounds in float64: exact only for bounds that are
            # floats or integers float64 holds exactly
            if any(isinstance(x, int) and abs(x) > EXACT for x in (v.lo, v.hi)):
                raise Untraceable(f"real state variable {v.name!r} has an integer bound beyond 2**53")
        elif not (-LIMIT <= v.lo <= v.hi <= LIMIT):
            raise Untraceable(f"state variable {v.name!r} is not a 64-bit integer")
    base = 4 * K + 3 * Q
    tr = TapeOps(base + 1 + len(svars))
    tr.projected_native = native_walk
    lf = tr.leaf

    def out_len(rid: _V) -> Any:
        # a rule that is not clairvoyant sees a placeholder that raises on any use, as in the engines
        return lf(rid.reg + 2, INT, *_LEN) if traits.clairvoyant else hidden_output(who, rid)

    actives = []
    for k in range(K):
        rid = _V(4 * k, INT, 0, MAX_TOKENS, tr)
        actives.append(
            active_entry(rid, _V(4 * k + 1, INT, 1, MAX_TOKENS, tr), out_len(rid), _V(4 * k + 3, INT, *_PROGRESS, tr))
        )
    waiting = []
    for j in range(Q):
        rid = _V(4 * K + 3 * j, INT, 0, MAX_TOKENS, tr)
        waiting.append(waiting_entry(rid, _V(4 * K + 3 * j + 1, INT, 1, MAX_TOKENS, tr), out_len(rid)))
    view = View(
        active=tuple(actives),
        waiting=_TapeQueue(waiting),
        M=params.M,
        chunk=params.chunk,
        block=params.block,
        token_budget=params.token_budget,
        max_num_seqs=params.max_num_seqs,
        n_waiting=lf(base, INT, *_COUNT),
        # a real variable holds an int or a float (the engine keeps what the rule returned): tagged
        state=tuple(
            lf(base + 1 + m, NUM, -LIMIT, LIMIT) if v.real else lf(base + 1 + m, INT, int(v.lo), int(v.hi))
            for m, v in enumerate(svars)
        ),
    )
    try:
        decision = scheduler.decide(view, tr)  # type: ignore[arg-type]
    except (Untraceable, InvalidScheduler):
        raise
    except Exception as exc:  # the rule's own fault (or one only the values decide): let the reference say
        raise Untraceable(f"{type(exc).__name__}: {exc}") from None
    decision = check_decision_shape(decision, view, who)

    okinds: list[int] = []
    names = {BOOL: "bool", INT: "int", NUM: "an int or a float"}

    def outs(xs: Iterable[Any], kinds: Iterable[str], what: str) -> list[int]:
        regs = []
        for x, kind in zip(xs, kinds):
            if isinstance(x, np.generic):
                x = x.item()
            plain = type(x) is not _V
            if kind == BOOL and (isinstance(x, bool) or (not plain and x.kind == BOOL)):
                pass
            elif kind == INT and ((plain and isinstance(x, int) and not isinstance(x, bool)) or
                                  (not plain and x.kind == INT)):  # fmt: skip
                pass
            elif kind == NUM and ((plain and isinstance(x, (int, float)) and not isinstance(x, bool)) or
                                  (not plain and x.kind in (INT, FLOAT, NUM))):  # fmt: skip
                pass  # a real state variable: an int or a float, never a bool (check_next_state)
            else:
                raise Untraceable(f"decision.{what} holds {x!r}, not surely {names[kind]}")
            reg = tr.val(x)
            regs.append(reg.reg)
            okinds.append(STORE[reg.kind])
        return regs

    nw, na = len(decision.admit), len(decision.preempt)
    regs = outs(decision.admit, [BOOL] * nw, "admit") + outs(decision.preempt, [BOOL] * na, "preempt")
    if decision.grants is not None:
        regs += outs(decision.grants, [INT] * len(decision.grants), "grants")
    if decision.state is not None:
        if not isinstance(decision.state, tuple) or len(decision.state) != len(svars):
            raise Untraceable("decision.state does not hold one value per state variable")  # the reference says why
        regs += outs(decision.state, [NUM if v.real else INT for v in svars], "state")
    outputs = np.array(regs, dtype=np.int64)
    return Tape(
        K=K,
        Q=Q,
        code=with_guards(
            tr.code(),
            base + 1 + len(svars),
            outputs,
            1 << 62 if ask is False else _guards.ASK_MIN,
            _guards.ASK_SHARE if ask else None,
        ),
        outputs=outputs,
        okinds=np.array(okinds, dtype=np.int64),
        n_regs=tr.n_regs,
        has_grants=decision.grants is not None,
        has_state=decision.state is not None,
    )
