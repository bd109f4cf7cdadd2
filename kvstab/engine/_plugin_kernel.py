"""The compiled slot loop of the plug-in path: :meth:`kvstab.simulator.Engine.step`
with the decision read off a tape (:mod:`kvstab.engine.tape`) instead of a Python call.

:func:`run_plugin_slots` runs slots until ``t_end``, a drain, or a slot it cannot
finish by itself, and returns a status:

* ``NEED_TAPE`` — the slot needs a view shape ``(K, Q)`` with no tape yet (or
  its tape's ``ASK`` row left this slot to the rule, ``st[ST_ASK]``); the driver
  tapes it, or asks the rule itself and passes the answer for this slot only
  (``once_*`` and ``ans*``: the decision's values, dropped when the slot ends),
  and calls again (the slot's arrivals are kept in ``st``, and nothing else of
  the slot has happened yet, so the call resumes it);
* ``BAIL`` — something only the reference engine can report exactly happened:
  an invariant broke (with ``check``), a grant was negative, a next state left
  its bounds, a division by zero, a value beyond ±2⁶¹.  The driver then runs
  the reference engine, which raises (or computes) exactly what it always does.

Everything else mirrors ``Engine.step`` line by line: the window-widening
loop, preemption (victims to the queue head, oldest admission first),
admission from the window, work by grants clamped to one unit, the memory,
``max_num_seqs`` and token-budget checks, release at the end of the slot, and
the scheduler's state applied with the slot.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvstab.engine import _layout as _L
from kvstab.engine import _skeleton as S_
from kvstab.engine._kernel import held
from kvstab.engine._layout import (
    BAIL,
    C_WINDOW,
    DRAINED,
    NEED_TAPE,
    REACHED,
    ST_ASK,
    ST_HID,
    ST_NEEDK,
    ST_NEEDQ,
    ST_NONCE,
    ST_PEND,
)
from kvstab.engine._opcodes import EXACT, LIMIT, OP
from kvstab.engine._skeleton import _njit

#: the texts this loop inlines or compiles in besides its own (``held``, the layout's indices, the
#: opcodes): see :func:`kvstab.engine._layout.stale`
SKELETON_SHA = "2d60ea0633aae12c"
KERNEL_SHA = "63df08f27204389a"
LAYOUT_SHA = "14a0a08f1956fdd1"
OPCODES_SHA = "1db0e6da623db5dc"
GUARDS = (
    ("_kernel.py", KERNEL_SHA), ("_layout.py", LAYOUT_SHA), ("_opcodes.py", OPCODES_SHA), ("_skeleton.py", SKELETON_SHA)
)
_L.warn_if_stale(__name__, GUARDS)

# The loop's arrays travel as a few records (tuples of arrays, unpacked where they are read):
#: the request table: ``ps``, ``po``, ``prog``, ``att``, ``served``, ``wasted``, ``npre``, ``first``, ``fin``
RequestTable = tuple[np.ndarray, ...]
#: the scheduler's state: ``sv``, ``svf``, ``svtag`` (the values) and ``svreal``, ``svlo``, ``svhi``,
#: ``svflo``, ``svfhi`` (each variable's kind and bounds)
StateVars = tuple[np.ndarray, ...]
#: the tape bank: ``code``, ``codef`` (its float view), ``tstart``, ``tlen``, ``ostart``, ``outs``,
#: ``okind``, ``tflags``, ``tid`` (shape → tape), ``tused``, ``tcount``
Tapes = tuple[np.ndarray, ...]
#: this slot's answers of the rule itself: ``once_k``, ``once_q``, ``once_off``, ``once_flags``,
#: ``ans``, ``ansf``, ``anst``
Answers = tuple[np.ndarray, ...]
#: a tape's registers: ``R`` (ints), ``F`` (floats), ``T`` (which of the two holds the value)
Registers = tuple[np.ndarray, np.ndarray, np.ndarray]
#: a decision: ``dec`` (admit, preempt, grants, the integer next state), ``decf``, ``dect``
Decision = tuple[np.ndarray, np.ndarray, np.ndarray]
#: scratch: ``tmp`` (grants by request), ``scr`` (the refused of the window), ``prev`` (the actives as seen)
Scratch = tuple[np.ndarray, np.ndarray, np.ndarray]

_CONST, _ADD, _SUB, _MUL, _FDIV, _MOD, _NEG = (
    OP["CONST"],
    OP["ADD"],
    OP["SUB"],
    OP["MUL"],
    OP["FDIV"],
    OP["MOD"],
    OP["NEG"],
)
_LT, _LE, _GT, _GE, _EQ, _NE = OP["LT"], OP["LE"], OP["GT"], OP["GE"], OP["EQ"], OP["NE"]
_ITE, _MIN, _MAX, _AND, _OR, _NOT, _TRUTH = OP["ITE"], OP["MIN"], OP["MAX"], OP["AND"], OP["OR"], OP["NOT"], OP["TRUTH"]
_ADDC, _SUBC, _MULC = OP["ADDC"], OP["SUBC"], OP["MULC"]
_LIMIT = LIMIT
_EXACT = EXACT
_FCONST, _JZ, _ASK = OP["FCONST"], OP["JZ"], OP["ASK"]
_XFLOOR = OP["XFLOOR"]
_XADD, _XSUB, _XMUL, _XFDIV, _XMOD, _XTDIV, _XNEG = (
    OP["XADD"],
    OP["XSUB"],
    OP["XMUL"],
    OP["XFDIV"],
    OP["XMOD"],
    OP["XTDIV"],
    OP["XNEG"],
)
_XLT, _XLE, _XGT, _XGE, _XEQ, _XNE = OP["XLT"], OP["XLE"], OP["XGT"], OP["XGE"], OP["XEQ"], OP["XNE"]
_XITE, _XMIN, _XMAX, _XTRUTH = OP["XITE"], OP["XMIN"], OP["XMAX"], OP["XTRUTH"]
_PJV, _PROJ, _PJO = OP["PJV"], OP["PROJ"], OP["PJO"]


@_njit(cache=True)
def _load(R: np.ndarray, F: np.ndarray, T: np.ndarray, reg: int, kind: int) -> tuple[bool, int, float]:
    """A register's Python value as (is it a float, its int, its float); ``kind`` is where
    it lives (0: ``R``, 1: ``F``, 2: as the tag ``T[reg]`` says)."""
    if kind == 1 or (kind == 2 and T[reg] == 1):
        return True, 0, F[reg]
    return False, R[reg], 0.0


@_njit(cache=True)
def _put(R: np.ndarray, F: np.ndarray, T: np.ndarray, d: int, kind: int, isf: bool, iv: int, fv: float) -> bool:
    """Store a value where the tape says register ``d`` lives; ``False`` if its type is not the one
    the tape recorded (never, when the tracer's types are right)."""
    if kind == 0:
        if isf:
            return False
        R[d] = iv
    elif kind == 1:
        if not isf:
            return False
        F[d] = fv
    else:
        T[d] = 1 if isf else 0
        if isf:
            F[d] = fv
        else:
            R[d] = iv
    return True


@_njit(cache=True, inline="always")
def _relation(op: int, x: Any, y: Any) -> int:
    """``x op y`` (``op`` one of the ``X`` comparisons; ``XNE`` the last) as 1/0, on two ints or
    two floats (IEEE: every comparison with a NaN is false, except !=, as in Python)."""
    if op == _XLT:
        return 1 if x < y else 0
    if op == _XLE:
        return 1 if x <= y else 0
    if op == _XGT:
        return 1 if x > y else 0
    if op == _XGE:
        return 1 if x >= y else 0
    if op == _XEQ:
        return 1 if x == y else 0
    return 1 if x != y else 0


@_njit(cache=True)
def _cmp(op: int, xf: bool, xi: int, xv: float, yf: bool, yi: int, yv: float) -> int:
    """Python's ``x op y`` on ints and floats: 1/0, or -1 where it cannot be decided exactly here
    (an int beyond 2⁵³ against a float: Python compares it exactly, float64 would round it)."""
    if not xf and not yf:
        return _relation(op, xi, yi)
    if (not xf and abs(xi) > _EXACT) or (not yf and abs(yi) > _EXACT):
        return -1
    return _relation(op, xv if xf else float(xi), yv if yf else float(yi))


@_njit(cache=True)
def _float_divmod(x: float, y: float) -> tuple[float, float]:
    """CPython's ``float.__divmod__`` (``_float_div_mod`` in ``floatobject.c``), step for step:
    ``x // y`` and ``x % y`` for ``y != 0``."""
    mod = np.fmod(x, y)  # C fmod (exact); numba has no math.fmod
    div = (x - mod) / y
    if mod != 0.0:
        if (y < 0.0) != (mod < 0.0):  # the remainder takes the divisor's sign
            mod += y
            div -= 1.0
    else:
        mod = math.copysign(0.0, y)
    if div != 0.0:
        floordiv = np.floor(div)  # a float (numba's math.floor returns an int64)
        if div - floordiv > 0.5:
            floordiv += 1.0
    else:
        floordiv = math.copysign(0.0, x / y)
    return floordiv, mod


@_njit(cache=True)
def eval_x(op: int, d: int, a: int, b: int, c: int, k: int, R: np.ndarray, F: np.ndarray, T: np.ndarray) -> bool:
    """One float or mixed row (``k``: where each operand and the result live, 2 bits each) with
    Python's semantics; ``False`` where Python would raise (a zero divisor) or where float64
    cannot follow Python exactly (an int beyond 2⁵³ meeting a float, an int result beyond ±2⁶¹)."""
    ka = k & 3
    kb = (k >> 2) & 3
    kc = (k >> 4) & 3
    kd = (k >> 6) & 3
    af, ai, av = _load(R, F, T, a, ka)
    if op == _XTRUTH:
        R[d] = 1 if (av != 0.0 if af else ai != 0) else 0  # NaN is true, as bool(nan)
        return True
    if op == _XITE:
        if av != 0.0 if af else ai != 0:
            sf, si, sv = _load(R, F, T, b, kb)
        else:
            sf, si, sv = _load(R, F, T, c, kc)
        return _put(R, F, T, d, kd, sf, si, sv)
    if op == _XNEG:
        return _put(R, F, T, d, kd, af, -ai, -av)  # |ai| <= 2⁶¹: no overflow
    if op == _XFLOOR:  # math.floor: an int (a float beyond 2⁵³ is one already: the conversion is exact)
        if not af:
            return _put(R, F, T, d, kd, False, ai, 0.0)
        if not (abs(av) <= _LIMIT):  # beyond ±2⁶¹, inf and NaN: Python's ints (or its error) take over
            return False
        return _put(R, F, T, d, kd, False, int(np.floor(av)), 0.0)
    bf, bi, bv = _load(R, F, T, b, kb)
    if op == _XMIN or op == _XMAX:
        # Python's min/max keep the first of equals: b replaces a only if b < a (b > a)
        w = _cmp(_XLT if op == _XMIN else _XGT, bf, bi, bv, af, ai, av)
        if w < 0:
            return False
        if w == 1:
            return _put(R, F, T, d, kd, bf, bi, bv)
        return _put(R, F, T, d, kd, af, ai, av)
    if op >= _XLT and op <= _XNE:
        w = _cmp(op, af, ai, av, bf, bi, bv)
        if w < 0:
            return False
        R[d] = w
        return True
    if not af and not bf:  # two ints: Python's integer arithmetic (true division excepted)
        if op == _XADD or op == _XSUB:
            v = ai + bi if op == _XADD else ai - bi
            if v > _LIMIT or v < -_LIMIT:
                return False
            return _put(R, F, T, d, kd, False, v, 0.0)
        if op == _XMUL:
            if ai != 0 and abs(bi) > _LIMIT // abs(ai):
                return False
            return _put(R, F, T, d, kd, False, ai * bi, 0.0)
        if bi == 0:
            return False
        if op == _XFDIV:
            return _put(R, F, T, d, kd, False, ai // bi, 0.0)
        if op == _XMOD:
            return _put(R, F, T, d, kd, False, ai % bi, 0.0)
        # int / int: Python rounds the exact quotient once; so does one IEEE division of exact operands
        if abs(ai) > _EXACT or abs(bi) > _EXACT:
            return False
        return _put(R, F, T, d, kd, True, 0, float(ai) / float(bi))
    # a float meets an int or a float: the int converts to float64 (exactly: at most 2⁵³)
    if (not af and abs(ai) > _EXACT) or (not bf and abs(bi) > _EXACT):
        return False
    x = av if af else float(ai)
    y = bv if bf else float(bi)
    if op == _XADD:
        return _put(R, F, T, d, kd, True, 0, x + y)
    if op == _XSUB:
        return _put(R, F, T, d, kd, True, 0, x - y)
    if op == _XMUL:
        return _put(R, F, T, d, kd, True, 0, x * y)
    if y == 0.0:  # ZeroDivisionError in Python
        return False
    if op == _XTDIV:
        return _put(R, F, T, d, kd, True, 0, x / y)
    q, m = _float_divmod(x, y)
    return _put(R, F, T, d, kd, True, 0, q if op == _XFDIV else m)


@_njit(cache=True, inline="always")
def _held_at(R: np.ndarray, e: int, i: int, tau: int, chunk: int, block: int) -> int:
    """``Projection.held_at(view, tau)`` of the walk's projection ``i`` (kvstab.schedulers.lookahead),
    its fields ``s, p, f, rp, present`` at ``R[e + 5i …]``: the same formula, in int64 (the tracer
    took the walk only where its bounds keep every value within ±2⁶¹)."""
    o = e + 5 * i
    if R[o + 4] == 0 or tau > R[o + 2]:
        return 0
    s = R[o]
    p = R[o + 1]
    rp = R[o + 3]
    if tau <= rp:
        prog = p + tau * chunk
        if s < prog:
            prog = s
    else:
        prog = (p if p >= s else s) + tau - rp
    return -((-prog) // block) * block


@_njit(cache=True)
def projected_walk(R: np.ndarray, last: int, M: int, running0: int, code: np.ndarray, x: int) -> int:
    """:func:`kvstab.contract.walk_projected` over lookahead's projections, natively: the admit
    flags as bits (flag ``j`` is bit ``j``).

    The arguments sit in registers ending at ``last`` (the ``PJV`` block): each projection's
    ``s, p, f, rp, present`` (the ``K`` active entries', then the ``Q`` waiting ones'), then
    ``chunk, block, cap`` (``-1``: none), ``K, Q``.  Every check the unrolled walk ANDs is a pure
    comparison, so the walk stops at the first that fails (in slots where the head waits, most
    of them, that is one total of ``K`` terms, not ``K²``): the active total at finish slot ``k``
    is computed only when a check needs it, and the check that failed last is tried first (its
    index kept in the ``PROJ`` row's 6th field ``code[x, 5]``: a hint, it changes no result)."""
    Q = R[last]
    K = R[last - 1]
    cap = R[last - 2]
    block = R[last - 3]
    chunk = R[last - 4]
    e = last - 4 - 5 * (K + Q)
    acc = np.empty(K, dtype=np.int64)  # the active total at finish slot k, plus the admitted candidates'
    have = np.zeros(K, dtype=np.bool_)
    own = np.empty(Q, dtype=np.int64)  # the active total at candidate i's finish slot
    incl = np.zeros(Q, dtype=np.bool_)
    hint = code[x, 5]
    bits = 0
    running = running0
    for j in range(Q):
        c = K + j
        if R[e + 5 * c + 4] == 0 or (cap >= 0 and running >= cap):
            break  # not admitted: everyone behind is blocked
        fc = R[e + 5 * c + 2]
        a = 0
        for q in range(K):
            a += _held_at(R, e, q, fc, chunk, block)
        own[j] = a
        for i in range(j):
            if incl[i]:
                a += _held_at(R, e, K + i, fc, chunk, block)
        ok = a + _held_at(R, e, c, fc, chunk, block) <= M
        for i in range(j):  # the totals at the admitted candidates' finish slots, with c added
            if not ok:
                break
            if incl[i]:
                fi = R[e + 5 * (K + i) + 2]
                v = own[i] + _held_at(R, e, c, fi, chunk, block)
                for i2 in range(j):
                    if incl[i2]:
                        v += _held_at(R, e, K + i2, fi, chunk, block)
                ok = v <= M
        lead = hint if 0 <= hint < K else -1
        for n in range(K + 1):  # the totals at the active finish slots, the hint's first
            if not ok:
                break
            k = lead if n == 0 else n - 1
            if k < 0 or (n > 0 and k == lead):
                continue
            fk = R[e + 5 * k + 2]
            if not have[k]:
                t = 0
                for q in range(K):
                    t += _held_at(R, e, q, fk, chunk, block)
                acc[k] = t
                have[k] = True
            if acc[k] + _held_at(R, e, c, fk, chunk, block) > M:
                ok = False
                hint = k
        if not ok:
            break
        bits |= 1 << j
        incl[j] = True
        running += 1
        for k in range(K):  # every total was needed to admit c, so all are known
            acc[k] += _held_at(R, e, c, R[e + 5 * k + 2], chunk, block)
    code[x, 5] = hint
    return bits


@_njit(cache=True)
def eval_tape(
    code: np.ndarray, codef: np.ndarray, start: int, nrows: int, R: np.ndarray, F: np.ndarray, T: np.ndarray
) -> int:
    """Run tape rows ``start`` … ``start + nrows - 1`` on registers ``R`` (ints),
    ``F`` (floats) and ``T`` (tags of int-or-float registers); ``codef`` is ``code``
    viewed as float64 (a float constant's bits); ``False`` if a division by zero, a
    value beyond ±2⁶¹ or an int float64 cannot hold exactly stopped it (0), 2 if an
    ``ASK`` row's condition holds (the rule is asked instead), else 1."""
    x = start - 1
    end = start + nrows
    while x + 1 < end:
        x += 1
        op = code[x, 0]
        d = code[x, 1]
        a = code[x, 2]
        b = code[x, 3]
        if op == _ADD:
            R[d] = R[a] + R[b]
        elif op == _ITE:
            R[d] = R[b] if R[a] != 0 else R[code[x, 4]]
        elif op == _LT:
            R[d] = 1 if R[a] < R[b] else 0
        elif op == _LE:
            R[d] = 1 if R[a] <= R[b] else 0
        elif op == _MIN:
            R[d] = R[b] if R[b] < R[a] else R[a]  # Python's min keeps the first of equals
        elif op == _SUB:
            R[d] = R[a] - R[b]
        elif op == _CONST:
            R[d] = a
        elif op == _AND:
            R[d] = 1 if (R[a] != 0 and R[b] != 0) else 0
        elif op == _OR:
            R[d] = 1 if (R[a] != 0 or R[b] != 0) else 0
        elif op == _NOT:
            R[d] = 1 if R[a] == 0 else 0
        elif op == _TRUTH:
            R[d] = 1 if R[a] != 0 else 0
        elif op == _MAX:
            R[d] = R[b] if R[b] > R[a] else R[a]
        elif op == _GT:
            R[d] = 1 if R[a] > R[b] else 0
        elif op == _GE:
            R[d] = 1 if R[a] >= R[b] else 0
        elif op == _EQ:
            R[d] = 1 if R[a] == R[b] else 0
        elif op == _NE:
            R[d] = 1 if R[a] != R[b] else 0
        elif op == _MUL:
            R[d] = R[a] * R[b]
        elif op == _FDIV or op == _MOD:
            y = R[b]
            if y == 0:
                return 0
            # numba's integer // and % round towards -inf, as Python's do
            R[d] = R[a] // y if op == _FDIV else R[a] % y
        elif op == _NEG:  # registers stay within ±2⁶¹, so a negation cannot overflow
            R[d] = -R[a]
        elif op == _ADDC or op == _SUBC:
            v = R[a] + R[b] if op == _ADDC else R[a] - R[b]
            if v > _LIMIT or v < -_LIMIT:
                return 0
            R[d] = v
        elif op == _MULC:
            xa = R[a]
            y = R[b]
            if xa != 0 and abs(y) > _LIMIT // abs(xa):
                return 0
            R[d] = xa * y
        elif op == _JZ:  # the next b rows matter only if register a is true (kvstab.engine._guards)
            if R[a] == 0:
                x += b
        elif op == _ASK:
            if R[a] != 0:
                return 2
        elif op == _PJV:
            R[d] = R[a]
        elif op == _PROJ:
            R[d] = projected_walk(R, a, R[b], R[code[x, 4]], code, x)
        elif op == _PJO:
            R[d] = (R[a] >> b) & 1
        elif op == _FCONST:
            F[d] = codef[x, 2]
        elif op > _FCONST and op < _JZ:
            if not eval_x(op, d, a, b, code[x, 4], code[x, 5], R, F, T):
                return 0
        else:
            return 0
    return 1


@_njit(cache=True)
def _decide(
    na: int, Q: int, nst: int, t: int, act: np.ndarray, qbuf: np.ndarray, qh: int, ql: int, reqs: RequestTable,
    svs: StateVars, tapes: Tapes, nonce: int, once: Answers, regs: Registers, decision: Decision,
) -> int:  # fmt: skip
    """The decision for a view of ``na`` active and ``Q`` shown waiting entries, written to
    ``dec`` (admit ``Q``, preempt ``na``, grants ``na + Q`` if any, then the integer next state)
    and ``decf``/``dect`` (a real next state, and whether it is a float): from this slot's answer
    of the rule itself (``once_*``) or from the shape's tape.  Returns the decision's flags
    (1: grants, 2: state), ``-1`` (no tape for the shape), ``-2`` (the tape stopped: the reference
    engine must run) or ``-3`` (an ``ASK`` row: ask the rule itself for this slot)."""
    ps, po, prog = reqs[0], reqs[1], reqs[2]
    sv, svf, svtag = svs[0], svs[1], svs[2]
    code, codef, tstart, tlen, ostart, outs, okind, tflags, tid, tused, tcount = tapes
    once_k, once_q, once_off, once_flags, ans, ansf, anst = once
    R, F, T = regs
    dec, decf, dect = decision
    cap = qbuf.shape[0]
    for x in range(nonce):
        if once_k[x] == na and once_q[x] == Q:
            flags = once_flags[x]
            off = once_off[x]
            nout = Q + na + ((na + Q) if flags & 1 else 0)
            for j in range(nout):
                dec[j] = ans[off + j]
            if flags & 2:
                for m in range(nst):
                    dec[nout + m] = ans[off + nout + m]
                    decf[m] = ansf[off + nout + m]
                    dect[m] = anst[off + nout + m]
            return flags
    if na >= tid.shape[0] or Q >= tid.shape[1] or tid[na, Q] < 0:
        return -1
    tape = tid[na, Q]
    tused[tape] = t
    tcount[2 * tape] += 1
    for k in range(na):
        r = act[k]
        R[4 * k] = r
        R[4 * k + 1] = ps[r]
        R[4 * k + 2] = po[r]
        R[4 * k + 3] = prog[r]
    base = 4 * na
    for j in range(Q):
        r = qbuf[(qh + j) % cap]
        R[base + 3 * j] = r
        R[base + 3 * j + 1] = ps[r]
        R[base + 3 * j + 2] = po[r]
    base += 3 * Q
    R[base] = ql
    for m in range(nst):
        g = base + 1 + m
        T[g] = svtag[m]
        if svtag[m] == 1:
            F[g] = svf[m]
        else:
            R[g] = sv[m]
    res = eval_tape(code, codef, tstart[tape], tlen[tape], R, F, T)
    if res == 0:
        return -2
    if res == 2:
        tcount[2 * tape + 1] += 1
        return -3
    o0 = ostart[tape]
    flags = tflags[tape]
    nout = Q + na + ((na + Q) if flags & 1 else 0)
    for j in range(nout):
        dec[j] = R[outs[o0 + j]]  # admit and preempt are bools, grants ints: all in R
    if flags & 2:
        for m in range(nst):
            reg = outs[o0 + nout + m]
            kind = okind[o0 + nout + m]
            if kind == 1 or (kind == 2 and T[reg] == 1):
                decf[m] = F[reg]
                dect[m] = 1
            else:
                dec[nout + m] = R[reg]
                dect[m] = 0
    return flags


@_njit(cache=True, inline="always")
def _answer_ok(Q: int, na: int, nst: int, flags: int, decision: Decision, svs: StateVars) -> bool:
    """Whether a decision passes the reference's checks of every answer: grants are integers
    >= 0, a next state within its bounds."""
    dec, decf, dect = decision
    svreal, svlo, svhi, svflo, svfhi = svs[3], svs[4], svs[5], svs[6], svs[7]
    ok = True
    og = Q + na
    if flags & 1:
        for x in range(na + Q):
            if dec[og + x] < 0:
                ok = False
        og += na + Q
    if flags & 2:
        for m in range(nst):
            if svreal[m] == 0:
                v = dec[og + m]
                if dect[m] == 1 or v < svlo[m] or v > svhi[m]:
                    ok = False
            elif dect[m] == 1:  # check_next_state: finite and within the bounds
                fv = decf[m]
                if not (math.isfinite(fv) and svflo[m] <= fv and fv <= svfhi[m]):
                    ok = False
            else:  # an int for a real variable: compared with float bounds, exactly up to 2⁵³
                v = dec[og + m]
                if abs(v) > _EXACT or not (svflo[m] <= float(v) and float(v) <= svfhi[m]):
                    ok = False
    return ok


@_njit(cache=True, inline="always")
def _preempt(
    Q: int, na: int, act: np.ndarray, dec: np.ndarray, att: np.ndarray, wasted: np.ndarray, prog: np.ndarray,
    npre: np.ndarray, prev: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """Preempt the actives the decision names: their memory and progress are lost, their attempt
    area wasted; ``prev`` keeps the active list as the rule saw it (the admission rewrites
    ``act``).  Returns the victims and the area wasted."""
    nv = 0
    step_wasted = 0
    for k in range(na):
        r = act[k]
        prev[k] = r
        if dec[Q + k] != 0:
            step_wasted += att[r]
            wasted[r] += att[r]
            att[r] = 0
            prog[r] = 0
            npre[r] += 1
            nv += 1
    return nv, step_wasted


@_njit(cache=True, inline="always")
def _admit(
    t: int, Q: int, na: int, nv: int, qh: int, ql: int, act: np.ndarray, qbuf: np.ndarray, dec: np.ndarray,
    first: np.ndarray, scr: np.ndarray, prev: np.ndarray,
) -> tuple[int, int, int, int]:  # fmt: skip
    """Admission from the window (the admitted leave it, the others keep their order at the
    head), the kept actives first; then the victims to the head of the queue, oldest admission
    first (``Engine.requeue``).  Returns the admitted, the running, and the queue's new head
    and length."""
    cap = qbuf.shape[0]
    nadmit = 0
    for j in range(Q):
        if dec[j] != 0:
            nadmit += 1
    kept = 0
    for k in range(na):
        if dec[Q + k] == 0:
            act[kept] = act[k]
            kept += 1
    if nadmit > 0:
        # running = kept + admitted (queue order); the window's refused go back to the head
        x = kept
        nrefused = 0
        for j in range(Q):
            r = qbuf[(qh + j) % cap]
            if dec[j] != 0:
                act[x] = r
                x += 1
                if first[r] < 0:
                    first[r] = t
            else:
                scr[nrefused] = r
                nrefused += 1
        qh = (qh + Q) % cap
        ql -= Q
        for y in range(nrefused - 1, -1, -1):
            qh = (qh - 1) % cap
            qbuf[qh] = scr[y]
            ql += 1
    if nv > 0:
        for k in range(na - 1, -1, -1):
            if dec[Q + k] != 0:
                qh = (qh - 1) % cap
                qbuf[qh] = prev[k]
                ql += 1
    return nadmit, kept + nadmit, qh, ql


@_njit(cache=True, inline="always")
def _work(
    chunk: int, B: int, na: int, grants: bool, act: np.ndarray, ps: np.ndarray, prog: np.ndarray,
    att: np.ndarray, served: np.ndarray, tmp: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """Every running request advances by its grant (``tmp``, if ``grants``), clamped to one
    unit.  Returns the tokens and the memory held."""
    tokens = 0
    memory = 0
    for k in range(na):
        r = act[k]
        p0 = prog[r]
        sr = ps[r]
        u = min(chunk, sr - p0) if p0 < sr else 1
        if grants:
            g = tmp[r]
            if g < u:
                u = g
            if u < 0:
                u = 0
        p1 = p0 + u
        prog[r] = p1
        tokens += u
        h = held(p1, B)
        att[r] += h
        served[r] += h
        memory += h
    return tokens, memory


@_njit(cache=True, inline="always")
def _release(
    t: int, na: int, act: np.ndarray, ps: np.ndarray, po: np.ndarray, prog: np.ndarray, fin: np.ndarray
) -> int:
    """Release the finished at the end of the slot, the admission order kept.  Returns how
    many remain active."""
    x = 0
    for k in range(na):
        r = act[k]
        if prog[r] >= ps[r] + po[r]:
            fin[r] = t
        else:
            act[x] = r
            x += 1
    return x


@_njit(cache=True)
def run_plugin_slots(
    cfg: np.ndarray, pslot: np.ndarray, reqs: RequestTable, qbuf: np.ndarray, act: np.ndarray, st: np.ndarray,
    svs: StateVars, tapes: Tapes, once: Answers, regs: Registers, decision: Decision, scratch: Scratch,
    out: np.ndarray,
) -> int:  # fmt: skip
    """Run slots ``st[ST_T]`` … ``t_end - 1`` (see the module docstring), writing slot ``t``'s row
    at ``out[:, t - t_base]``; returns a status code.  ``cfg`` is the run's settings record
    (:func:`kvstab.engine._skeleton.config`, with the window ``C_WINDOW``); the other records are
    tuples of arrays (:data:`RequestTable`, :data:`StateVars`, :data:`Tapes`, :data:`Answers`,
    :data:`Registers`, :data:`Decision`, :data:`Scratch`).  State variable ``m`` is ``sv[m]``
    (an int) or ``svf[m]`` (a float) as ``svtag[m]`` says; a real one (``svreal``) is checked
    against ``svflo``/``svfhi``, an integer one against ``svlo``/``svhi``.  ``tused[tape]`` is set
    to the slot in which a tape last ran, ``tcount[2 tape]`` counts its runs and
    ``tcount[2 tape + 1]`` the slots its ``ASK`` rows left to the rule."""
    M, chunk, B, budget, maxseq, check, t_end, drain, drain_min, t_base = S_.settings(cfg)
    window = cfg[C_WINDOW]
    ps, po, prog, att, served, wasted, npre, first, fin = reqs
    sv, svf, svtag = svs[0], svs[1], svs[2]
    dec, decf, dect = decision
    tmp, scr, prev = scratch
    n = pslot.shape[0]
    cap = qbuf.shape[0]
    nst = sv.shape[0]
    t, i, qh, ql, na = S_.load_queue(st)
    pend = st[ST_PEND]
    hid = st[ST_HID]
    nonce = st[ST_NONCE]
    status = REACHED
    while True:
        if pend < 0 and S_.drained(drain, drain_min, t, i, n, na, ql):
            status = DRAINED
            break
        if t >= t_end:
            break
        if pend < 0:  # this slot's arrivals join the tail of the queue
            pend = 0
            while i < n and pslot[i] == t:
                qbuf[(qh + ql) % cap] = i
                ql += 1
                i += 1
                pend += 1

        # --- the decision, widening the window while the rule admits all it sees
        w = window
        Q = 0
        flags = 0
        while True:
            Q = min(w, ql)
            flags = _decide(na, Q, nst, t, act, qbuf, qh, ql, reqs, svs, tapes, nonce, once, regs, decision)
            if flags == -1 or flags == -3:  # no tape for this shape, or its tape leaves the slot to the rule
                st[ST_NEEDK] = na
                st[ST_NEEDQ] = Q
                st[ST_ASK] = 1 if flags == -3 else 0
                status = NEED_TAPE
                break
            if flags == -2:
                status = BAIL
                break
            # the reference checks every answer: grants are integers >= 0, a next state within its bounds
            if not _answer_ok(Q, na, nst, flags, decision, svs):
                status = BAIL
            if status == BAIL:
                break
            all_admit = True
            for j in range(Q):
                if dec[j] == 0:
                    all_admit = False
            if Q < ql and Q > 0 and all_admit:
                w *= 2
                continue
            break
        if status != REACHED:
            break
        hidden = ql - Q
        row = t - t_base

        # --- preemption: memory and progress lost, attempt area wasted
        nv, step_wasted = _preempt(Q, na, act, dec, att, wasted, prog, npre, prev)
        # grants by position (actives, then the window), read before the active list changes
        if flags & 1:
            og = Q + na
            for k in range(na):
                tmp[act[k]] = dec[og + k]
            for j in range(Q):
                tmp[qbuf[(qh + j) % cap]] = dec[og + na + j]
        # --- admission from the window, then the victims to the head of the queue
        nadmit, running, qh, ql = _admit(t, Q, na, nv, qh, ql, act, qbuf, dec, first, scr, prev)
        na_before = na
        na = running

        # --- work: every running request advances by its grant (clamped to one unit)
        tokens, memory = _work(chunk, B, na, (flags & 1) != 0, act, ps, prog, att, served, tmp)
        if check and S_.breach(memory, M, na, maxseq, tokens, budget)[0] != 0:
            status = BAIL
            break

        # --- release the finished at the end of the slot (admission order kept)
        nleft = _release(t, na, act, ps, po, prog, fin)
        done = na - nleft
        na = nleft
        if flags & 2:
            og = Q + na_before + ((na_before + Q) if flags & 1 else 0)
            for m in range(nst):
                svtag[m] = dect[m]
                if dect[m] == 1:
                    svf[m] = decf[m]
                else:
                    sv[m] = dec[og + m]
        if hidden > 0:
            hid += 1

        S_.slot_row(out, row, pend, nadmit, nv, done, running, memory, step_wasted, tokens, ql)
        pend = -1
        nonce = 0  # the rule's answers expire with their slot
        t += 1

    S_.store_queue(st, t, i, qh, ql, na)
    st[ST_PEND] = pend
    st[ST_HID] = hid
    st[ST_NONCE] = nonce
    return status
