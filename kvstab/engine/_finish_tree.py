"""``lookahead``'s finish-time table in O(log W): a kinetic segment tree and a profile over a ring of slots.

The compiled engine (:mod:`kvstab.engine._kernel`) admits a ``lookahead`` head
``c`` in slot ``t`` iff the projected memory ``T(E)`` of the active requests,
plus the head's own projection, stays within ``M`` at every active finish slot
``E ≤ F_c`` and at ``F_c`` itself.  Both structures here are keyed by
**absolute** slot numbers (a slot's position is ``E mod W``; the live window
``[t − W/2, t + W/2)`` holds every finish slot and every entry, so no two live
slots share a position, and nothing is shifted when time advances):

* **The tree** (a kinetic segment tree, rows ``MV … LC``): one leaf per slot,
  *present* iff some active request finishes there; a present leaf ``E`` is the
  line ``V(E) = T(E) + E`` with slope ``E``.  It answers the largest ``V`` (and
  the slot holding it) over a range of slots, under range additions of
  ``h·E + c`` — what admitting a decoding request adds to ``T`` when ``B = 1``
  (its memory at ``E`` is ``E + x``) — and of constants.  A node keeps the
  largest line of its subtree and its *melt*: how much more heat (``h``) the
  subtree can take before another line could overtake it; heat within the melt
  is applied lazily, heat beyond it is pushed to the children (a kinetic
  segment tree: a range heat is amortised polylogarithmic — 30 to 90 node
  visits an admission at paper scale, measured — and a constant addition, a
  query or a point update O(log W)).
* **The profile** (columns ``PCOEF``, ``PCONST``, ``PPOINT``): ``T(E)`` at any
  slot, finish slot or not, as a piecewise-linear function given by
  difference entries in two Fenwick trees (``Σ coef·E + Σ const`` over the
  entries at slots ``≤ E`` in the live window) plus point values: O(log W) per
  entry and per evaluation.

``docs/engine.md`` ("Why the shortcuts are exact") says why the tree's answers
are the rule's; ``tests/test_engine_events.py`` checks both structures against
brute force on random states.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:  # numba is a declared dependency; without it the functions run as plain Python (slow, exact)
    from numba import njit as _numba_njit

    def _jit(**kwargs: Any) -> Any:
        return _numba_njit(**kwargs)

except ImportError:  # pragma: no cover - exercised only where numba cannot be installed

    def _jit(**kwargs: Any) -> Any:
        return lambda f: f


# columns of the structure's array (``FT``, shape (2W, COLS)): a row holds one tree node's fields
# together (nodes 1 … 2W − 1, leaves from W), and the profile's entries at one position
MV, MA, MELT, LH, LC = 0, 1, 2, 3, 4  # node: largest V, its slope (slot), melt, lazy heat, lazy constant
PCOEF, PCONST = 5, 6  # the profile's two Fenwick trees, side by side (1 … W)
PPOINT = 7  # the profile's point values (0 … W − 1)
CNT = 8  # actives finishing at each slot (0 … W − 1)
STACK = 9  # scratch: the explicit stack of the tree walks
COLS = 10
# row 0's tree columns (node 0 is no node) hold the structure's scalars
MODE, TREE_AT_, TABLE_AT_ = MV, MA, MELT  # 1 while the tree holds the table; the switching counts

NEG = -(1 << 62)  # an absent leaf or subtree
FAR = 1 << 62  # no melt

#: the smallest and largest ring (slots); a run whose requests live longer than ``MAX_W / 2 − 2``
#: slots keeps the O(n) table instead (the ring would take more memory than it saves)
MIN_W = 256
MAX_W = 1 << 18

#: the engine keeps the O(n) table while fewer than ``TREE_AT`` requests run (it is cheaper
#: there: ~3–5 ns an active an event, against ~0.6 µs an event for the tree with ``B = 1``,
#: measured in ``benchmarks/bench_engine.py --only events``), moves it into the tree when
#: ``TREE_AT`` run, and back when ``TABLE_AT`` or fewer do (O(n log W) a move; the gap makes
#: moves rare).  With ``B > 1`` the tree adds a head's decode one block at a time (``o/B``
#: ranges), so both counts grow by a quarter of the mean ``o/B`` (:func:`thresholds`).
TREE_AT = 128
TABLE_AT = 64

#: ``(tree_at, table_at)`` to force where runs started from now keep the table (tests and
#: benchmarks: ``(0, -1)`` is the tree from the first request); ``None``: :func:`thresholds`
FORCE: tuple[int, int] | None = None


def thresholds(B: int, mean_o: float) -> tuple[int, int]:
    """The numbers running at which the table moves into the tree and back, for block size ``B``
    and requests of mean decode length ``mean_o``."""
    if FORCE is not None:
        return FORCE
    scale = 1.0 if B == 1 else 1.0 + mean_o / B / 4
    return int(TREE_AT * scale), int(TABLE_AT * scale)


def ring_for(max_life: int) -> int:
    """The ring size for requests that live at most ``max_life`` slots (0 if too long for one)."""
    W = MIN_W
    while W // 2 < max_life + 2:
        W *= 2
    return W if W <= MAX_W else 0


def new(W: int, tree_at: int = 0, table_at: int = -1) -> np.ndarray:
    """An empty structure over a ring of ``W`` slots (a power of two, at least ``MIN_W``) that
    takes the table over when ``tree_at`` requests run and gives it back at ``table_at``."""
    FT = np.zeros((2 * W, COLS), dtype=np.int64)
    FT[:, MV] = NEG
    FT[:, MELT] = FAR
    FT[0, MODE] = 0
    FT[0, TREE_AT_] = tree_at
    FT[0, TABLE_AT_] = table_at
    return FT


# --- the tree
@_jit(cache=True, inline="always")
def _apply(FT: np.ndarray, node: int, W: int, h: int, c: int) -> None:
    """Add ``h·E + c`` to every leaf below ``node`` (the caller knows ``h`` is within its melt)."""
    if FT[node, MV] == NEG:
        return  # nothing present below: a leaf set later is set exactly (its path is pushed first)
    FT[node, MV] += FT[node, MA] * h + c
    if node < W:
        FT[node, MELT] -= h
        FT[node, LH] += h
        FT[node, LC] += c


@_jit(cache=True, inline="always")
def _push(FT: np.ndarray, node: int, W: int) -> None:
    h = FT[node, LH]
    c = FT[node, LC]
    if h != 0 or c != 0:
        # the heat taken lazily stayed within this node's melt, which is within its children's
        _apply(FT, 2 * node, W, h, c)
        _apply(FT, 2 * node + 1, W, h, c)
        FT[node, LH] = 0
        FT[node, LC] = 0


@_jit(cache=True, inline="always")
def _pull(FT: np.ndarray, node: int) -> None:
    """Recompute ``node`` from its children: the larger line (of equals, the steeper), and the
    melt: the children's, and the heat after which the other child's line overtakes it."""
    a = 2 * node
    b = a + 1
    va = FT[a, MV]
    vb = FT[b, MV]
    if va == NEG and vb == NEG:
        FT[node, MV] = NEG
        FT[node, MELT] = FAR
        return
    if vb == NEG or (va != NEG and (va > vb or (va == vb and FT[a, MA] >= FT[b, MA]))):
        w, lo = a, b
    else:
        w, lo = b, a
    melt = min(FT[a, MELT], FT[b, MELT])
    if FT[lo, MV] != NEG and FT[lo, MA] > FT[w, MA]:
        melt = min(melt, (FT[w, MV] - FT[lo, MV]) // (FT[lo, MA] - FT[w, MA]))
    FT[node, MV] = FT[w, MV]
    FT[node, MA] = FT[w, MA]
    FT[node, MELT] = melt


@_jit(cache=True)
def _heat(FT: np.ndarray, W: int, lo: int, hi: int, h: int, c: int) -> None:
    """Add ``h·E + c`` to the present leaves at positions ``lo … hi``."""
    stk = FT[:, STACK]
    sp = 0
    stk[0], stk[1], stk[2], stk[3] = 1, 0, W - 1, 0
    sp = 4
    while sp > 0:
        sp -= 4
        node, nl, nr, back = stk[sp], stk[sp + 1], stk[sp + 2], stk[sp + 3]
        if back:
            _pull(FT, node)
            continue
        if hi < nl or nr < lo or FT[node, MV] == NEG:
            continue
        if lo <= nl and nr <= hi and (node >= W or h <= FT[node, MELT]):
            _apply(FT, node, W, h, c)
            continue
        _push(FT, node, W)
        mid = (nl + nr) >> 1
        stk[sp], stk[sp + 1], stk[sp + 2], stk[sp + 3] = node, nl, nr, 1
        stk[sp + 4], stk[sp + 5], stk[sp + 6], stk[sp + 7] = 2 * node + 1, mid + 1, nr, 0
        stk[sp + 8], stk[sp + 9], stk[sp + 10], stk[sp + 11] = 2 * node, nl, mid, 0
        sp += 12


@_jit(cache=True)
def _max(FT: np.ndarray, W: int, lo: int, hi: int) -> tuple[int, int]:
    """The largest ``V`` over the present leaves at positions ``lo … hi`` and its slot (``NEG``, −1 if none)."""
    stk = FT[:, STACK]
    stk[0], stk[1], stk[2] = 1, 0, W - 1
    sp = 3
    best = NEG
    arg = -1
    while sp > 0:
        sp -= 3
        node, nl, nr = stk[sp], stk[sp + 1], stk[sp + 2]
        if hi < nl or nr < lo or FT[node, MV] == NEG or FT[node, MV] <= best:
            continue  # a node's largest line bounds everything below it
        if lo <= nl and nr <= hi:
            best = FT[node, MV]
            arg = FT[node, MA]
            continue
        _push(FT, node, W)
        mid = (nl + nr) >> 1
        stk[sp], stk[sp + 1], stk[sp + 2] = 2 * node + 1, mid + 1, nr
        stk[sp + 3], stk[sp + 4], stk[sp + 5] = 2 * node, nl, mid
        sp += 6
    return best, arg


@_jit(cache=True)
def _first(FT: np.ndarray, W: int, lo: int, hi: int) -> int:
    """The first position in ``lo … hi`` with a present leaf (−1 if none).  Presence does not
    depend on the lazy additions, so nothing is pushed."""
    stk = FT[:, STACK]
    stk[0], stk[1], stk[2] = 1, 0, W - 1
    sp = 3
    while sp > 0:
        sp -= 3
        node, nl, nr = stk[sp], stk[sp + 1], stk[sp + 2]
        if hi < nl or nr < lo or FT[node, MV] == NEG:
            continue
        if nl == nr:
            return nl
        mid = (nl + nr) >> 1
        stk[sp], stk[sp + 1], stk[sp + 2] = 2 * node + 1, mid + 1, nr
        stk[sp + 3], stk[sp + 4], stk[sp + 5] = 2 * node, nl, mid
        sp += 6
    return -1


@_jit(cache=True)
def _leaf(FT: np.ndarray, W: int, pos: int) -> int:
    """Push every lazy addition down to leaf ``pos``; returns its node."""
    leaf = W + pos
    shift = 0
    while (leaf >> shift) > 1:
        shift += 1
    while shift > 0:
        _push(FT, leaf >> shift, W)
        shift -= 1
    return leaf


@_jit(cache=True)
def _set(FT: np.ndarray, W: int, pos: int, v: int, slope: int) -> None:
    leaf = _leaf(FT, W, pos)
    FT[leaf, MV] = v
    FT[leaf, MA] = slope
    FT[leaf, MELT] = FAR
    node = leaf >> 1
    while node >= 1:
        _pull(FT, node)
        node >>= 1


# --- the tree on absolute slots (a range of fewer than W slots is one or two ranges of positions)
@_jit(cache=True)
def tree_add(FT: np.ndarray, lo: int, hi: int, h: int, c: int) -> None:
    """Add ``h·E + c`` at every present slot ``E`` in ``lo … hi`` (``h ≥ 0``)."""
    if hi < lo:
        return
    W = FT.shape[0] >> 1
    a = lo & (W - 1)
    b = hi & (W - 1)
    if a <= b:
        _heat(FT, W, a, b, h, c)
    else:
        _heat(FT, W, a, W - 1, h, c)
        _heat(FT, W, 0, b, h, c)


@_jit(cache=True)
def tree_max(FT: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """The largest ``V(E)`` over the present slots ``E`` in ``lo … hi`` and that ``E`` (``NEG``, −1 if none)."""
    if hi < lo:
        return NEG, -1
    W = FT.shape[0] >> 1
    a = lo & (W - 1)
    b = hi & (W - 1)
    if a <= b:
        return _max(FT, W, a, b)
    v1, e1 = _max(FT, W, a, W - 1)
    v2, e2 = _max(FT, W, 0, b)
    return (v1, e1) if v1 >= v2 else (v2, e2)


@_jit(cache=True)
def tree_first(FT: np.ndarray, lo: int, hi: int) -> int:
    """The first present slot in ``lo … hi`` (−1 if none)."""
    if hi < lo:
        return -1
    W = FT.shape[0] >> 1
    a = lo & (W - 1)
    b = hi & (W - 1)
    if a <= b:
        p = _first(FT, W, a, b)
        return -1 if p < 0 else lo + p - a
    p = _first(FT, W, a, W - 1)
    if p >= 0:
        return lo + p - a
    p = _first(FT, W, 0, b)
    return -1 if p < 0 else lo + (W - a) + p


@_jit(cache=True)
def tree_get(FT: np.ndarray, E: int) -> int:
    """``V(E)`` of present slot ``E``."""
    W = FT.shape[0] >> 1
    return FT[_leaf(FT, W, E & (W - 1)), MV]


@_jit(cache=True)
def tree_set(FT: np.ndarray, E: int, v: int) -> None:
    """Make slot ``E`` present with ``V(E) = v``."""
    W = FT.shape[0] >> 1
    _set(FT, W, E & (W - 1), v, E)


@_jit(cache=True)
def tree_clear(FT: np.ndarray, E: int) -> None:
    """Make slot ``E`` absent."""
    W = FT.shape[0] >> 1
    _set(FT, W, E & (W - 1), NEG, 0)


# --- the profile
@_jit(cache=True, inline="always")
def _fen_add(FT: np.ndarray, W: int, pos: int, coef: int, const: int) -> None:
    i = pos + 1
    while i <= W:
        FT[i, PCOEF] += coef
        FT[i, PCONST] += const
        i += i & -i


@_jit(cache=True, inline="always")
def _fen_pre(FT: np.ndarray, pos: int) -> tuple[int, int]:
    """Σ coef and Σ const of the entries at positions 0 … pos."""
    i = pos + 1
    a = 0
    b = 0
    while i > 0:
        a += FT[i, PCOEF]
        b += FT[i, PCONST]
        i -= i & -i
    return a, b


@_jit(cache=True)
def profile_add(FT: np.ndarray, E: int, coef: int, const: int) -> None:
    """From slot ``E`` on, the profile gains ``coef·E′ + const`` at every slot ``E′``."""
    W = FT.shape[0] >> 1
    _fen_add(FT, W, E & (W - 1), coef, const)


@_jit(cache=True, inline="always")
def profile_point(FT: np.ndarray, E: int, v: int) -> None:
    """The profile gains ``v`` at slot ``E`` alone."""
    W = FT.shape[0] >> 1
    FT[E & (W - 1), PPOINT] += v


@_jit(cache=True)
def profile_at(FT: np.ndarray, t: int, E: int) -> int:
    """The profile at slot ``E ≥ t`` in slot ``t``: the entries at slots ``t − W/2 … E`` (every
    live entry lies in ``[t − W/2, t + W/2)``, so these are the positions from ``t − W/2`` to
    ``E`` around the ring)."""
    W = FT.shape[0] >> 1
    a = (t - (W >> 1)) & (W - 1)
    b = E & (W - 1)
    cb, kb = _fen_pre(FT, b)
    if a > 0:
        ca, ka = _fen_pre(FT, a - 1)
        cb -= ca
        kb -= ka
    if a > b:  # wrapped: add the positions a … W − 1 back
        cw, kw = _fen_pre(FT, W - 1)
        cb += cw
        kb += kw
    return E * cb + kb + FT[b, PPOINT]
