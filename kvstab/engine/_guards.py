"""Skipping the parts of a tape that a false condition makes irrelevant (lazy evaluation of a tape).

A rule written against ``ops`` may not branch, so it computes everything for
every view — e.g. ``sglang``'s retraction order, O(K²) rows, which only a
retracting step needs: every row of it ends in ``and_(retracting, …)``.  Python
skips that work (the concrete rule tests ``retracting is False``); the tape
would evaluate all of it every slot.  :func:`guard_rows` finds, for each row,
a register ``g`` such that the row's value cannot matter when ``g == 0``, and
:func:`with_guards` puts ``JZ g, n`` before each run of rows with the same
guard, so the kernel skips them.

A row ``x`` is guarded by ``g`` when every (live) consumer of ``x`` either is
itself guarded by ``g``, or is dominated: an ``AND`` whose other operand ``o``
is 0 whenever ``g`` is 0 (``g`` on ``o``'s chain of first operands of
``AND``/``TRUTH`` rows, each 0 when the next is), or an ``ITE`` that takes
``x`` only as its *then* branch and whose condition is 0 whenever ``g`` is.
Soundness rests on the guards and the dominating chains being computed
exactly: every register used as a guard or on a dominating chain is *pinned*
(never guarded itself), and a chain is not used past a guarded register.  A
skipped register keeps a stale value, read only by rows that are skipped too
or by dominated ``AND``/``ITE`` rows whose result does not depend on it.  Rows
no output depends on are dropped, except divisions.  Outputs are never guarded, nor
is a division by a register that may be 0: Python evaluates every operation the
tape recorded (the tape skips only what it proves irrelevant to the *value*), so
a ``ZeroDivisionError`` must still stop the run where the reference raises it.

``ASK g`` instead of ``JZ g, n`` drops the run from the tape: where ``g`` is 0 the
rows were irrelevant anyway, and where it holds the kernel stops at the ``ASK``
row (before any row that could read a dropped register) and the plug-in path
asks the rule itself for the slot.  It is used for a guard that covers most of a
tape (:data:`ASK_SHARE`): sglang's retraction order, whose rows are most of its
tapes' memory and matter in a handful of slots.
"""

from __future__ import annotations

import numpy as np

from kvstab.engine import _layout as _L
from kvstab.engine._opcodes import OP
from kvstab.engine._skeleton import _njit

#: the opcodes' text this module's compiled functions were built with (numba compiles them in as
#: constants; see :func:`kvstab.engine._layout.stale`)
OPCODES_SHA = "1db0e6da623db5dc"
GUARDS = (("_opcodes.py", OPCODES_SHA),)
_L.warn_if_stale(__name__, GUARDS)

#: how many registers of a register operand each opcode reads (columns a, b, c); CONST/FCONST
#: carry a value in a, and JZ is emitted only here
NARGS = np.zeros(len(OP), dtype=np.int64)
for _name, _n in OP.items():
    if _name in ("CONST", "FCONST", "JZ", "ASK"):
        NARGS[_n] = 0
    elif _name in ("NEG", "NOT", "TRUTH", "XNEG", "XTRUTH", "XFLOOR", "PJO"):  # PJO's b is a bit number
        NARGS[_n] = 1
    elif _name in ("ITE", "XITE", "PROJ"):
        NARGS[_n] = 3
    else:
        NARGS[_n] = 2

_AND, _TRUTH, _ITE, _XITE, _JZ, _ASK = OP["AND"], OP["TRUTH"], OP["ITE"], OP["XITE"], OP["JZ"], OP["ASK"]
#: a guarded run of at least this many rows is not kept at all: ``ASK g`` makes the kernel ask the
#: rule itself in a slot where ``g`` is true — exact, as the skipped rows are irrelevant whenever
#: ``g`` is 0.  Off for runs by their length: it pays only for a guard that is rarely true
#: (sglang's ``retracting``), and a run's length says nothing of that — at 64 rows sglang's
#: prefill-walk runs, true in most slots, were asked too and the taped run went from 3.6 to 26 CPU s
ASK_MIN = 1 << 62
#: a guard that alone covers at least this share of a tape's rows (and ASK_ROWS rows) has its runs
#: left to the rule (``ASK``): such a tape is mostly rows that a false guard makes irrelevant —
#: sglang's O(K²) retraction order behind ``retracting`` — and keeping them costs memory in every
#: tape (5.7 MB a shape at K = 100) for what the rule computes itself in the few slots that need
#: it.  The plug-in path tapes the shape again without ``ASK`` rows if they fire often.
ASK_SHARE, ASK_ROWS = 0.5, 4096
_CONST, _FCONST = OP["CONST"], OP["FCONST"]
_FDIV, _MOD, _XFDIV, _XMOD, _XTDIV = OP["FDIV"], OP["MOD"], OP["XFDIV"], OP["XMOD"], OP["XTDIV"]
_NEGZERO = -(1 << 63)  # the bits of the float constant -0.0 (+0.0's are 0)
_DEPTH = 8  # how far a dominating chain is followed (sglang's are 2–4 long)


@_njit(cache=True)
def guard_rows(code: np.ndarray, n_in: int, outs: np.ndarray, nargs: np.ndarray) -> np.ndarray:
    """Per row: its guard register (``>= 0``), ``-1`` (always evaluated) or ``-2`` (dead: dropped).
    Row ``x`` writes register ``n_in + x``; registers below ``n_in`` are inputs (always there)."""
    n = code.shape[0]
    cnt = np.zeros(n + 1, dtype=np.int64)
    for x in range(n):
        for j in range(nargs[code[x, 0]]):
            r = code[x, 2 + j]
            if r >= n_in:
                cnt[r - n_in + 1] += 1
    for x in range(n):
        cnt[x + 1] += cnt[x]
    cons = np.zeros(cnt[n], dtype=np.int64)
    fill = cnt[:n].copy()
    for x in range(n):
        for j in range(nargs[code[x, 0]]):
            r = code[x, 2 + j]
            if r >= n_in and (j == 0 or code[x, 2 + j] != code[x, 2 + j - 1]):  # a row consumes once
                if j == 2 and code[x, 4] == code[x, 2]:
                    continue
                cons[fill[r - n_in]] = x
                fill[r - n_in] += 1
    isout = np.zeros(n, dtype=np.bool_)
    for r in outs:
        if r >= n_in:
            isout[r - n_in] = True
    par = np.full(n, -1, dtype=np.int64)  # the first operand of an AND/TRUTH row: 0 whenever it is
    for x in range(n):
        op = code[x, 0]
        if op == _AND or op == _TRUTH:
            par[x] = code[x, 2]
    guard = np.full(n, -1, dtype=np.int64)
    pinned = np.zeros(n, dtype=np.bool_)
    # a division Python evaluates raises on a zero divisor whether or not its value matters, so a
    # division is never skipped (and what it reads is then computed too), unless its divisor is a
    # nonzero constant
    for x in range(n):
        op = code[x, 0]
        if op == _FDIV or op == _MOD or op == _XFDIV or op == _XMOD or op == _XTDIV:
            b = code[x, 3]
            const = b >= n_in and (code[b - n_in, 0] == _CONST or code[b - n_in, 0] == _FCONST)
            if not (const and code[b - n_in, 2] != 0 and code[b - n_in, 2] != _NEGZERO):
                pinned[x] = True
    cand = np.zeros(2 * _DEPTH + 2, dtype=np.int64)
    sc = np.zeros(_DEPTH + 2, dtype=np.int64)
    for x in range(n - 1, -1, -1):
        if isout[x] or pinned[x]:
            continue
        reg = n_in + x
        ncand = 0
        alive = 0
        for e in range(cnt[x], fill[x]):
            c = cons[e]
            if guard[c] == -2:
                continue
            alive += 1
            # the set of guards under which consumer c does not need x
            ns = 0
            if guard[c] >= 0:
                sc[ns] = guard[c]
                ns += 1
            op = code[c, 0]
            o = -1
            if op == _AND:
                # only the second operand is dominated by the first (and_'s order: the guard first); letting
                # the first be dominated by the second too would pin the second, the larger part
                if code[c, 3] == reg and code[c, 2] != reg:
                    o = code[c, 2]
            elif (op == _ITE or (op == _XITE and code[c, 5] & 3 == 0)) and code[c, 3] == reg:
                if code[c, 2] != reg and code[c, 4] != reg:
                    o = code[c, 2]
            m = o
            depth = 0
            while m >= 0 and depth < _DEPTH:
                if m >= n_in and guard[m - n_in] >= 0:
                    break  # past a guarded register the chain is not computed exactly
                sc[ns] = m
                ns += 1
                depth += 1
                m = par[m - n_in] if m >= n_in else -1
            if alive == 1:
                for q in range(ns):
                    if sc[q] < reg:
                        cand[ncand] = sc[q]
                        ncand += 1
            else:
                k = 0
                for p in range(ncand):
                    hit = False
                    for q in range(ns):
                        if sc[q] == cand[p]:
                            hit = True
                    if hit:
                        cand[k] = cand[p]
                        k += 1
                ncand = k
            if ncand == 0:
                break
        if alive == 0:
            guard[x] = -2  # no output depends on it
            continue
        if ncand == 0:
            continue
        # prefer a guard already pinned (or an input): pinning another register keeps it, and what it
        # needs, out of every skipped run; among equals the latest (an AND of more conditions)
        g = -1
        for p in range(ncand):
            m = cand[p]
            if (m < n_in or pinned[m - n_in]) and m > g:
                g = m
        if g < 0:
            for p in range(ncand):
                if cand[p] > g:
                    g = cand[p]
        guard[x] = g
        # pin g and every dominating chain down to g: they must be computed exactly
        if g >= n_in:
            pinned[g - n_in] = True
        for e in range(cnt[x], fill[x]):
            c = cons[e]
            if guard[c] == -2 or guard[c] == g:
                continue
            m = code[c, 2]  # the dominating operand: an AND's first, an ITE's condition
            while m >= n_in and m != g:
                pinned[m - n_in] = True
                m = par[m - n_in]
    return guard


@_njit(cache=True)
def _emit(code: np.ndarray, guard: np.ndarray, jz: int, ask: int, ask_min: int, heavy: np.ndarray) -> np.ndarray:
    """The rows without the dead ones, with ``JZ g, n`` before each run of ``n`` rows guarded by ``g``,
    or (``n >= ask_min`` or ``heavy[g]``) ``ASK g`` instead of the run."""
    n = code.shape[0]
    out = np.zeros((2 * n + 1, code.shape[1]), dtype=np.int64)
    w = 0
    x = 0
    while x < n:
        g = guard[x]
        if g == -2:
            x += 1
            continue
        if g == -1:
            out[w] = code[x]
            w += 1
            x += 1
            continue
        head = w
        w += 1
        run = 0
        while x < n and (guard[x] == g or guard[x] == -2):
            if guard[x] == g:
                out[w] = code[x]
                w += 1
                run += 1
            x += 1
        out[head, 2] = g
        if run >= ask_min or heavy[g]:
            out[head, 0] = ask
            w = head + 1  # the run is dropped
        else:
            out[head, 0] = jz
            out[head, 3] = run
    return out[:w].copy()


def with_guards(
    code: np.ndarray, n_in: int, outputs: np.ndarray, ask_min: int = ASK_MIN, ask_share: float | None = None
) -> np.ndarray:
    """``code`` with its dead rows dropped, its guarded runs behind ``JZ`` rows, and replaced by
    ``ASK`` rows (same registers): runs of at least ``ask_min`` rows, and (``ask_share``) every run
    of a guard that covers that share of the live rows and at least :data:`ASK_ROWS`."""
    if code.shape[0] == 0:
        return code
    guard = guard_rows(code, n_in, outputs, NARGS)
    heavy = np.zeros(n_in + code.shape[0], dtype=np.bool_)
    if ask_share is not None:
        covered = np.bincount(guard[guard >= 0], minlength=heavy.shape[0])
        live = int(np.count_nonzero(guard != -2))
        heavy = covered >= max(ASK_ROWS, ask_share * live)
    return _emit(code, guard, _JZ, _ASK, ask_min, heavy)
