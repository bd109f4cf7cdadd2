"""The compiled engine of the built-in rules: event-driven, exact (numba; plain Python without numba).

One function, :func:`run_builtins`, runs the built-in rules from slot ``st[ST_T]``
to ``t_end`` and returns there, on a drain, or at a broken invariant; the
Python driver (:mod:`kvstab.engine.driver`) calls it batch by batch, so a
progress bar moves and statistics stream.

Every slot it runs is :meth:`kvstab.simulator.Engine.step` for the rule
selected by ``pol`` — the differential tests (``tests/test_engine_*.py``) and
``benchmarks/bench_engine.py`` hold the two to identical outputs — but its work
grows with *events* (arrivals, admissions, preemptions, completions, prefill
chunks), not with slots × running requests:

* **Decoding requests are lazy.**  A request that decodes one token a slot
  holds ``held(d + t)`` at the start of slot ``t`` (``d`` = its progress minus
  the slot it was last touched), so nothing is stored per slot: the loop keeps
  aggregates over the lazy set — their number, ``Σ d``, the memory they hold
  now, and (block size ``B > 1``) a histogram of ``d mod B``, which says how
  many of them open a new block in a given slot — and an indexed heap of
  their finish slots.  A lazy request is *touched* (its progress, attempt area
  and served area brought up to date in closed form) only when something
  happens to it: preemption, completion, the token budget stalling it, or
  when the driver reads the state.
* **Explicit requests** — prefilling ones, and decoders the token budget
  stalls in this slot — are stepped one by one, as before.
* **Recompute victims are a suffix** of the admission order, so they are
  found by walking back from the newest while the total post-slot memory
  exceeds ``M``: O(victims), not O(running).  The token budget's grants are
  found the same way (only requests past the budget get less than a unit).
* **Quiet stretches are skipped in one jump.**  With no explicit request, the
  loop computes the first slot in which anything could change — the next
  completion (heap top), the next arrival if the queue is empty, the first slot
  whose post-slot memory exceeds ``M`` (closed form), the slot a refused
  ``lookahead`` head can next pass its test — and fills the slots before it in
  closed form: per-slot rows when recording, the batch-means sums when
  streaming.

``docs/engine.md`` ("Why the shortcuts are exact") states, per rule, why a
skipped slot decides exactly what the reference would have.
"""

from __future__ import annotations

import numpy as np

from kvstab.engine import _finish_tree as FT_
from kvstab.engine import _layout as _L
from kvstab.engine import _skeleton as S_
from kvstab.engine._layout import (  # noqa: F401 - the driver and the tests read BP_SIZE … ST_SIZE here too
    BP_ON,
    BP_SIZE,
    C_B,
    C_BUDGET,
    C_CHECK,
    C_CHUNK,
    C_COMP,
    C_DRAIN,
    C_DRAIN_MIN,
    C_LIFE,
    C_M,
    C_MAXSEQ,
    C_POL,
    C_SIZE,
    C_T_BASE,
    C_T_END,
    COLUMNS,
    CURRENT_FIT,
    DRAINED,
    F_ATT,
    F_EPOS,
    F_FIN,
    F_FIRST,
    F_FSLOT,
    F_GRANT,
    F_HPOS,
    F_MODE,
    F_NPRE,
    F_NXT,
    F_O,
    F_PROG,
    F_PRV,
    F_RECOMP,
    F_S,
    F_SERVED,
    F_TA,
    F_TB,
    F_TF,
    F_WASTED,
    KVSTAB_LIFE,
    LOOKAHEAD,
    M_EXPL,
    M_LAZY,
    M_OUT,
    NCOLS,
    NF,
    NO_PREEMPT,
    NSIM,
    REACHED,
    RESERVE,
    ST_ADMIT,
    ST_AH,
    ST_BUDGET,
    ST_BUDREQ,
    ST_CL,
    ST_DONE,
    ST_EXPL,
    ST_FULL,
    ST_LAH,
    ST_LATEST,
    ST_LAW,
    ST_MEMSUM,
    ST_NA,
    ST_PREEMPT,
    ST_RESV,
    ST_RUNSUM,
    ST_SIZE,
    ST_T,
    VIOLATION,
    VLLM_LIFE,
    VLLM_V1,
)
from kvstab.engine._skeleton import HAVE_NUMBA, _njit  # noqa: F401 - the other kernels and the tests take them from here

#: the text of ``_finish_tree.py`` this file was last compiled with (a prefix of its sha256).
#: numba keys a cached function by the text of its own file only, so ``run_builtins`` would keep
#: an old copy of the finish tree's functions after they change; a test holds this to the
#: file's hash, and changing it here changes this file's text: the cache is rebuilt.
FINISH_TREE_SHA = "0e4bea723d7ccfbd"
#: the same for ``_layout.py``, whose indices numba compiles into the kernel as constants
LAYOUT_SHA = "14a0a08f1956fdd1"
#: the same for ``_skeleton.py``, whose helpers (the loop around the decision) the kernel inlines
SKELETON_SHA = "2d60ea0633aae12c"
#: every file whose text the kernels of this module depend on besides their own
GUARDS = (("_finish_tree.py", FINISH_TREE_SHA), ("_layout.py", LAYOUT_SHA), ("_skeleton.py", SKELETON_SHA))
_L.warn_if_stale(__name__, GUARDS)

#: the work counters a run reports (name, index into ``st``)
WORK = S_.WORK + (
    ("completions", ST_DONE),
    ("budget_slots", ST_BUDGET),
    ("budget_stalls", ST_BUDREQ),
    ("lookahead_tests", ST_LATEST),
    ("request_slots", ST_RUNSUM),
)

#: the largest block size with a lazy decode path (its phase histogram has B entries);
#: above it every running request is stepped explicitly, slot by slot
LAZY_BMAX = 1 << 16

_FAR = 1 << 62


@_njit(cache=True, inline="always")
def held(p: int, B: int) -> int:
    """KV tokens held at progress ``p``: :func:`kvstab.model.tokens_held` on ints
    (numba cannot call the ops-generic original; ``tests/test_engine_stream.py``
    checks the two agree)."""
    if B == 1:
        return p
    return (p + B - 1) // B * B


@_njit(cache=True, inline="always")
def _pad_sum(x: int, B: int) -> int:
    """``Σ_{y=0}^{x-1} ((-y) mod B)``: the block padding ``held(y) - y`` summed over ``y < x`` (``x ≥ 0``)."""
    q = x // B
    r = x - q * B
    part = 0 if r == 0 else (r - 1) * B - (r - 1) * r // 2
    return q * (B * (B - 1) // 2) + part


@_njit(cache=True, inline="always")
def _area(p0: int, k: int, B: int) -> int:
    """``Σ_{j=1}^{k} held(p0 + j)``: the area a request decoding from progress ``p0`` is
    served over ``k`` slots (one token a slot; memory is charged after each slot's work)."""
    a = k * p0 + k * (k + 1) // 2
    if B > 1:
        a += _pad_sum(p0 + k + 1, B) - _pad_sum(p0 + 1, B)
    return a


@_njit(cache=True, inline="always")
def _lazy_post(DL: int, nL: int, t: int, B: int, ph: np.ndarray) -> int:
    """Post-slot memory of the lazy decoders in slot ``t`` (``DL``: what they hold at its start).
    A decoder at progress ``p`` opens a new block in the slot iff ``p ≡ 0 (mod B)``, i.e. iff
    its ``d ≡ -t``."""
    if nL == 0:
        return DL
    if B == 1:
        return DL + nL
    return DL + B * ph[(-t) % B]


@_njit(cache=True)
def _dl_advance(DL: int, nL: int, t: int, L: int, B: int, ph: np.ndarray) -> int:
    """What the lazy decoders hold at the start of slot ``t + L`` (none joining or leaving)."""
    if nL == 0 or L <= 0:
        return DL
    if B == 1:
        return DL + nL * L
    q = L // B
    DL += q * B * nL  # every decoder opens one block per B slots
    for j in range(q * B, L):
        DL += B * ph[(-(t + j)) % B]
    return DL


@_njit(cache=True)
def _post_sum(DL: int, nL: int, t: int, L: int, B: int, ph: np.ndarray) -> int:
    """``Σ`` of the lazy decoders' post-slot memory over slots ``t … t + L − 1`` in closed form
    (O(min(L, B))): slot ``t + j`` adds the blocks opened in slots ``t … t + j``."""
    if L <= 0:
        return 0
    if nL == 0:
        return DL * L
    if B == 1:
        return L * DL + nL * (L * (L + 1) // 2)
    total = L * DL
    for i in range(min(B, L)):
        c = ph[(-(t + i)) % B]
        if c != 0:
            K = (L - i + B - 1) // B  # slots t + i, t + i + B, … before t + L: each counts L − (offset) times
            total += B * c * (K * (L - i) - B * K * (K - 1) // 2)
    return total


@_njit(cache=True)
def _overflow(DL: int, nL: int, t: int, limit: int, M: int, B: int, ph: np.ndarray) -> int:
    """The first slot in ``[t, limit)`` whose post-slot lazy memory exceeds ``M`` (``limit`` if
    none).  Memory only grows: by ``nL`` a slot (``B = 1``), or by ``B·nL`` every ``B`` slots."""
    post = _lazy_post(DL, nL, t, B, ph)
    if post > M:
        return t
    if nL == 0:
        return limit
    if B == 1:
        return min(t + (M - post) // nL + 1, limit)
    k = (M - post) // (B * nL)  # whole periods that stay within M
    tt = t + k * B
    if tt >= limit:
        return limit
    d = DL + k * B * nL
    while tt < limit:  # at most B slots: one more period exceeds M
        post = d + B * ph[(-tt) % B]
        if post > M:
            return tt
        d = post
        tt += 1
    return limit


# --- the indexed min-heap of lazy decoders' finish slots (positions in R[F_HPOS])
@_njit(cache=True, inline="always")
def _heap_put(hk: np.ndarray, hid: np.ndarray, R: np.ndarray, j: int, key: int, r: int) -> None:
    """Entry ``r`` with key ``key`` at heap position ``j`` (its position recorded in ``R[F_HPOS]``)."""
    hk[j] = key
    hid[j] = r
    R[F_HPOS, r] = j


@_njit(cache=True, inline="always")
def _sift(hk: np.ndarray, hid: np.ndarray, R: np.ndarray, j: int, size: int) -> None:
    """Move the entry at position ``j`` of a heap of ``size`` entries to its place: up while its
    parent's key is larger, else down while a child's key is smaller."""
    key = hk[j]
    r = hid[j]
    if j > 0 and key < hk[(j - 1) >> 1]:
        while j > 0:
            pj = (j - 1) >> 1
            if hk[pj] <= key:
                break
            _heap_put(hk, hid, R, j, hk[pj], hid[pj])
            j = pj
    else:
        while True:
            c = 2 * j + 1
            if c >= size:
                break
            if c + 1 < size and hk[c + 1] < hk[c]:
                c += 1
            if hk[c] >= key:
                break
            _heap_put(hk, hid, R, j, hk[c], hid[c])
            j = c
    _heap_put(hk, hid, R, j, key, r)


@_njit(cache=True, inline="always")
def _heap_push(hk: np.ndarray, hid: np.ndarray, R: np.ndarray, key: int, r: int, size: int) -> int:
    """Entry ``r`` with key ``key`` joins a heap of ``size`` entries; returns its new size."""
    hk[size] = key
    hid[size] = r
    _sift(hk, hid, R, size, size + 1)
    return size + 1


@_njit(cache=True, inline="always")
def _heap_remove(hk: np.ndarray, hid: np.ndarray, R: np.ndarray, r: int, size: int) -> int:
    """Entry ``r`` leaves a heap of ``size`` entries; returns its new size."""
    j = R[F_HPOS, r]
    last = size - 1
    if j != last:
        _heap_put(hk, hid, R, j, hk[last], hid[last])
        _sift(hk, hid, R, j, last)
    return last


@_njit(cache=True, inline="always")
def _touch(R: np.ndarray, r: int, t: int, B: int) -> int:
    """Bring lazy decoder ``r``'s progress and areas up to the start of slot ``t`` (its ``d`` is
    unchanged); returns its progress."""
    k = t - R[F_TB, r]
    a = _area(R[F_PROG, r], k, B)
    R[F_ATT, r] += a
    R[F_SERVED, r] += a
    R[F_PROG, r] += k
    R[F_TB, r] = t
    return R[F_PROG, r]


@_njit(cache=True, inline="always")
def _lazy_add(
    R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ph: np.ndarray, r: int, p: int, t: int, B: int,
    nL: int, CL: int, DL: int, hn: int,
) -> tuple[int, int, int, int]:  # fmt: skip
    """Request ``r`` (decoding, progress ``p`` at the start of slot ``t``) joins the lazy set."""
    R[F_MODE, r] = M_LAZY
    R[F_PROG, r] = p
    R[F_TB, r] = t
    d = p - t
    if B > 1:
        ph[d % B] += 1
    hn = _heap_push(hk, hid, R, t + R[F_S, r] + R[F_O, r] - p - 1, r, hn)  # the slot whose work brings it to s + o
    return nL + 1, CL + d, DL + held(p, B), hn


@_njit(cache=True, inline="always")
def _lazy_remove(
    R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ph: np.ndarray, r: int, t: int, B: int,
    nL: int, CL: int, DL: int, hn: int,
) -> tuple[int, int, int, int, int]:  # fmt: skip
    """Request ``r`` leaves the lazy set at the start of slot ``t``: its progress and areas are
    brought up to date (slots ``R[F_TB, r] … t − 1``).  Returns its progress and the aggregates."""
    d = R[F_PROG, r] - R[F_TB, r]
    p = _touch(R, r, t, B)
    if B > 1:
        ph[d % B] -= 1
    hn = _heap_remove(hk, hid, R, r, hn)
    return p, nL - 1, CL - d, DL - held(p, B), hn


@_njit(cache=True, inline="always")
def _unlink(R: np.ndarray, r: int, ah: int, at: int) -> tuple[int, int]:
    """Take ``r`` out of the admission-order list; returns its new head and tail."""
    prv = R[F_PRV, r]
    nxt = R[F_NXT, r]
    if prv >= 0:
        R[F_NXT, prv] = nxt
    else:
        ah = nxt
    if nxt >= 0:
        R[F_PRV, nxt] = prv
    else:
        at = prv
    return ah, at


@_njit(cache=True, inline="always")
def _finish(R: np.ndarray, r: int, t: int, ah: int, at: int) -> tuple[int, int]:
    """``r`` finished in slot ``t``: it leaves the running and the admission-order list; returns the
    list's new head and tail."""
    R[F_MODE, r] = M_OUT
    R[F_FIN, r] = t
    return _unlink(R, r, ah, at)


@_njit(cache=True, inline="always")
def _lose(R: np.ndarray, r: int) -> int:
    """Victim ``r`` loses its attempt: the attempt's area is wasted, its progress and memory gone,
    one more preemption counted, it leaves the running; returns the area wasted."""
    a = R[F_ATT, r]
    R[F_WASTED, r] += a
    R[F_ATT, r] = 0
    R[F_PROG, r] = 0
    R[F_NPRE, r] += 1
    R[F_MODE, r] = M_OUT
    return a


# the explicit requests (stepped one by one): ``elist[:ne]``, each one's position in ``R[EPOS]``
# (the row differs between the request tables)
@_njit(cache=True, inline="always")
def _explicit_add(R: np.ndarray, EPOS: int, elist: np.ndarray, r: int, ne: int) -> int:
    """``r`` joins the explicit requests, last; returns their number."""
    R[F_MODE, r] = M_EXPL
    elist[ne] = r
    R[EPOS, r] = ne
    return ne + 1


@_njit(cache=True, inline="always")
def _explicit_drop(R: np.ndarray, EPOS: int, elist: np.ndarray, k: int, ne: int) -> int:
    """The explicit request at position ``k`` leaves them (the last takes its place); returns their number."""
    ne -= 1
    last = elist[ne]
    elist[k] = last
    R[EPOS, last] = k
    return ne


@_njit(cache=True, inline="always")
def _link(R: np.ndarray, r: int, ah: int, at: int) -> tuple[int, int]:
    """Put ``r`` at the tail of the admission-order list; returns its new head and tail."""
    R[F_PRV, r] = at
    R[F_NXT, r] = -1
    if at >= 0:
        R[F_NXT, at] = r
    else:
        ah = r
    return ah, r


@_njit(cache=True)
def sync_lazy(R: np.ndarray, st: np.ndarray, B: int) -> None:
    """Bring every lazy decoder's progress and areas up to the start of slot ``st[ST_T]``
    (the aggregates do not change: ``d`` stays what it is)."""
    t = st[ST_T]
    r = st[ST_AH]
    while r >= 0:
        if R[F_MODE, r] == M_LAZY:
            _touch(R, r, t, B)
        r = R[F_NXT, r]


@_njit(cache=True)
def active_ids(R: np.ndarray, st: np.ndarray) -> np.ndarray:
    """The active requests, admission order."""
    ids = np.empty(st[ST_NA], dtype=np.int64)
    r = st[ST_AH]
    k = 0
    while r >= 0 and k < ids.shape[0]:
        ids[k] = r
        k += 1
        r = R[F_NXT, r]
    return ids[:k]


@_njit(cache=True, inline="always")
def _proj_held(s: int, o: int, ta: int, E: int, chunk: int, B: int) -> int:
    """Memory at the end of slot ``E`` of a request admitted (progress 0) in slot
    ``ta`` that runs one full unit per slot, 0 once finished — the rule's
    ``Projection.held_at`` in absolute time (exact while nothing is preempted)."""
    tau = E - ta + 1
    rp = (s + chunk - 1) // chunk
    if tau > rp + o:
        return 0
    if tau <= rp:
        prog = min(tau * chunk, s)
    else:
        prog = s + tau - rp
    return held(prog, B)


@_njit(cache=True, inline="always")
def _la_head(s: int, o: int, t: int, chunk: int, B: int) -> tuple[int, int, int, int]:
    """A head ``(s, o)`` admitted in slot ``t``, as every lookahead test starts from it: its prefill
    slots ``rp``, its life ``rp + o`` in slots, its finish slot ``fc`` and what it holds there."""
    rp = (s + chunk - 1) // chunk
    life = rp + o
    fc = t + life - 1
    return rp, life, fc, _proj_held(s, o, t, fc, chunk, B)


@_njit(cache=True)
def _lookahead_test(R: np.ndarray, ah: int, c: int, t: int, M: int, chunk: int, B: int) -> tuple[bool, int, int, int]:
    """``lookahead``'s admission test of queue head ``c`` in slot ``t`` against the finish-time
    table (``R[F_FSLOT]``: finish slot ``F_q``, ``R[F_TF]``: projected total at ``F_q``).

    Returns ``(ok, wake, fc, own)``: when refused, ``wake`` is a slot before which the test
    cannot pass while the head and the actives stay (completions change no projected total
    at a later slot; see ``docs/engine.md``): a failing finish-slot constraint of ``q`` keeps
    failing while the head, admitted later, still holds more than ``M − total(F_q)`` at
    ``F_q``; a failing total at the head's own finish keeps failing until that finish
    passes the next finish slot of an active request (the total only grows between them).
    """
    sc = R[F_S, c]
    oc = R[F_O, c]
    rp, life, fc, own = _la_head(sc, oc, t, chunk, B)
    ok = True
    wake = t + 1
    fnext = _FAR
    q = ah
    while q >= 0:
        fq = R[F_FSLOT, q]
        if fq >= fc:
            own += _proj_held(R[F_S, q], R[F_O, q], R[F_TA, q], fc, chunk, B)
            if fq < fnext:
                fnext = fq
        extra = _proj_held(sc, oc, t, fq, chunk, B) if fq <= fc else 0
        if R[F_TF, q] + extra > M:
            ok = False
            if fq <= fc:
                # the largest age tau at which the head holds at most M − total(F_q)
                m = (M - R[F_TF, q]) // B * B
                tau = m // chunk if m < sc else rp + min(oc, m - sc)
                w = fq + 1 - tau
            else:
                w = fq + 1  # (never: totals stay within M) fails while q runs
            if w > wake:
                wake = w
        q = R[F_NXT, q]
    if own > M:
        ok = False
        w = fnext - life + 2
        if w > wake:
            wake = w
    return ok, wake, fc, own


@_njit(cache=True, inline="always")
def _la_wake(m: int, E: int, s: int, o: int, rp: int, chunk: int) -> int:
    """The first slot in which the head, admitted then, can hold at most ``m`` at slot ``E``:
    ``E + 1 − τ*``, with ``τ*`` the largest age at which its projection is ``≤ m`` (0 when it is
    at no age: ``m < 0``, which the prefix-cache kernel meets testing against ``M`` less a hit)."""
    tau = max(m, 0) // chunk if m < s else rp + min(o, m - s)
    return E + 1 - tau


@_njit(cache=True)
def _la_profile(FT: np.ndarray, ta: int, s: int, o: int, chunk: int, B: int, sign: int) -> None:
    """Add (``sign = 1``) or remove (``−1``) the projection of a request admitted in slot ``ta``
    to the profile ``T``: its prefill chunks as point values, then from the slot it holds its
    whole prompt (age ``rp``) to its finish ``F`` its decode, ``held(E + x)`` with ``x = s + o − F``
    — one linear piece when ``B = 1``, a staircase of ``B``-steps otherwise."""
    rp = (s + chunk - 1) // chunk
    F = ta + rp + o - 1
    L = ta + rp - 1
    x = s + o - F
    for k in range(1, rp):
        FT_.profile_point(FT, ta + k - 1, sign * held(k * chunk, B))
    if B == 1:
        FT_.profile_add(FT, L, sign, sign * x)
        FT_.profile_add(FT, F + 1, -sign, -sign * x)
    else:
        FT_.profile_add(FT, L, 0, sign * held(s, B))
        y = held(s, B) + 1  # the progress at which it opens its next block
        while y <= s + o:
            FT_.profile_add(FT, y - x, 0, sign * B)
            y += B
        FT_.profile_add(FT, F + 1, 0, -sign * held(s + o, B))


@_njit(cache=True)
def _la_tree_add(FT: np.ndarray, t: int, s: int, o: int, chunk: int, B: int) -> None:
    """Add the projection of a head admitted in slot ``t`` to ``V`` at every present finish slot
    up to its own: its prefill chunks one slot each, then ``E + x`` in one heat (``B = 1``) or
    its blocks one constant range each."""
    W = FT.shape[0] >> 1
    rp = (s + chunk - 1) // chunk
    F = t + rp + o - 1
    L = t + rp - 1
    x = s + o - F
    for k in range(1, rp):
        E = t + k - 1
        if FT[E & (W - 1), FT_.CNT] > 0:
            FT_.tree_add(FT, E, E, 0, held(k * chunk, B))
    if B == 1:
        FT_.tree_add(FT, L, F, 1, x)
        return
    v = held(s, B)
    lo = L
    hi = min(F, L + v - s)
    while lo <= F:
        FT_.tree_add(FT, lo, hi, 0, v)
        lo = hi + 1
        hi = min(F, lo + B - 1)
        v += B


@_njit(cache=True)
def _la_test(FT: np.ndarray, t: int, s: int, o: int, chunk: int, B: int, M: int) -> tuple[bool, int, int, int]:
    """``lookahead``'s admission test of a head ``(s, o)`` in slot ``t`` on the finish tree, in
    O(log W) plus O(log W) per prefill chunk; the same answer as :func:`_lookahead_test`, and a
    wake slot that is a lower bound of the first slot it can pass (``docs/engine.md``).

    In the head's decode ages (finish slots ``E`` from ``t + rp − 1`` to its own ``F_c``) it holds
    ``held(E + x)``, so a constraint fails iff ``E + x > M_B − T(E)`` (``T`` is a multiple of
    ``B``), i.e. iff ``V(E) = T(E) + E > M_B − x``: one range maximum.  Its prefill ages are
    ``rp − 1`` slots, tested one by one; its own finish slot's total comes from the profile.
    The totals at later finish slots are within ``M`` (every admission kept them so)."""
    W = FT.shape[0] >> 1
    rp = (s + chunk - 1) // chunk
    life = rp + o
    fc = t + life - 1
    x = s + o - fc
    MB = M // B * B
    ok = True
    wake = t + 1
    v, e = FT_.tree_max(FT, t + rp - 1, fc)
    if v != FT_.NEG and v > MB - x:
        ok = False
        wake = max(wake, _la_wake(MB - (v - e), e, s, o, rp, chunk))
    for k in range(1, rp):
        E = t + k - 1
        if FT[E & (W - 1), FT_.CNT] > 0:
            total = FT_.tree_get(FT, E) - E
            if total + held(k * chunk, B) > M:
                ok = False
                wake = max(wake, _la_wake((M - total) // B * B, E, s, o, rp, chunk))
    own = FT_.profile_at(FT, t, fc) + held(s + o, B)
    if own > M:
        ok = False
        fnext = FT_.tree_first(FT, fc, t + (W >> 1) - 1)
        wake = max(wake, (_FAR if fnext < 0 else fnext) - life + 2)
    return ok, wake, fc, own


@_njit(cache=True)
def _la_enter(FT: np.ndarray, ta: int, s: int, o: int, F: int, total: int, chunk: int, B: int) -> None:
    """Enter an active request (admitted in slot ``ta``, finish slot ``F``, projected total
    ``total`` there) into the profile and the tree (a finish slot first met is set)."""
    W = FT.shape[0] >> 1
    _la_profile(FT, ta, s, o, chunk, B, 1)
    pos = F & (W - 1)
    if FT[pos, FT_.CNT] == 0:
        FT_.tree_set(FT, F, F + total)
    FT[pos, FT_.CNT] += 1


@_njit(cache=True)
def _la_admit(FT: np.ndarray, t: int, s: int, o: int, chunk: int, B: int, fc: int, own: int) -> None:
    """Enter a head admitted in slot ``t`` (finish slot ``fc``, projected total ``own`` there)."""
    _la_tree_add(FT, t, s, o, chunk, B)
    _la_enter(FT, t, s, o, fc, own, chunk, B)


@_njit(cache=True)
def _la_release(FT: np.ndarray, F: int, ta: int, s: int, o: int, chunk: int, B: int) -> None:
    """Take out a request admitted in slot ``ta`` that finished in slot ``F``.  The totals it
    added to are all at slots ``≤ F``, which are past: only its profile entries (which a later
    lap of the ring would meet) and its finish slot go."""
    W = FT.shape[0] >> 1
    _la_profile(FT, ta, s, o, chunk, B, -1)
    pos = F & (W - 1)
    FT[pos, FT_.CNT] -= 1
    if FT[pos, FT_.CNT] == 0:
        FT_.tree_clear(FT, F)


@_njit(cache=True)
def _la_to_tree(FT: np.ndarray, R: np.ndarray, ah: int, chunk: int, B: int) -> None:
    """Move the finish-time table (``R[F_TF]``) of the actives into the (empty) tree."""
    q = ah
    while q >= 0:
        _la_enter(FT, R[F_TA, q], R[F_S, q], R[F_O, q], R[F_FSLOT, q], R[F_TF, q], chunk, B)
        q = R[F_NXT, q]


@_njit(cache=True)
def _la_to_table(FT: np.ndarray, R: np.ndarray, ah: int, chunk: int, B: int) -> None:
    """Move the tree's totals back into ``R[F_TF]``; the tree is left empty (every entry and
    finish slot of a request leaves with it)."""
    q = ah
    while q >= 0:
        F = R[F_FSLOT, q]
        R[F_TF, q] = FT_.tree_get(FT, F) - F
        _la_release(FT, F, R[F_TA, q], R[F_S, q], R[F_O, q], chunk, B)
        q = R[F_NXT, q]


@_njit(cache=True, inline="always")
def _quiet_until(
    pol: int, M: int, chunk: int, B: int, budget: int, maxseq: int, check: bool, preempts: bool, t: int, t_end: int,
    drain: bool, drain_min: int, i: int, pslot: np.ndarray, R: np.ndarray, qbuf: np.ndarray, qh: int, ql: int,
    hk: np.ndarray, hn: int, ph: np.ndarray, na: int, nL: int, DL: int, resv: int, lah: int, law: int,
) -> int:  # fmt: skip
    """The end of a quiet stretch from slot ``t`` (every running request a lazy decoder): the
    first slot before which something could change a decision (``t``: none, the slot is full)."""
    n = pslot.shape[0]
    te = t_end
    if ql == 0 and i < n and pslot[i] < te:
        te = pslot[i]  # an arrival into an empty queue may be admitted at once
    if drain and i >= n and t < drain_min < te:
        te = drain_min
    if hn > 0 and hk[0] < te:
        te = hk[0]  # a completion frees memory at the end of its slot
    if te > t and ql > 0:
        # the head must be refused now and in every slot before te
        h = qbuf[qh]
        full = maxseq >= 0 and na >= maxseq  # until a completion
        if not full:
            if pol == CURRENT_FIT or pol == NO_PREEMPT:
                # post-slot memory only grows, so a refused first chunk stays refused
                if _lazy_post(DL, nL, t, B, ph) + held(min(R[F_S, h], chunk), B) <= M:
                    te = t
            elif pol == VLLM_V1:
                # memory only grows and the budget left (budget − running) stays
                if (budget < 0 or budget - nL > 0) and _lazy_post(DL, nL, t, B, ph) + held(R[F_S, h], B) <= M:
                    te = t
            elif pol == RESERVE:
                if resv + held(R[F_S, h] + R[F_O, h], B) <= M:
                    te = t
            elif h != lah or t >= law:  # LOOKAHEAD: not tested yet, or its wake slot came
                te = t
            elif law < te:
                te = law
    if te > t and (preempts or check):
        te = _overflow(DL, nL, t, te, M, B, ph)  # a preemption (or the violation) is an event
    if te > t and budget >= 0 and nL > budget and (pol == VLLM_V1 or check):
        te = t  # the budget binds (vllm-v1 stalls decoders) or is broken: per-slot work
    if te > t and check and maxseq >= 0 and na > maxseq:
        te = t
    return te


# A quiet stretch, in this kernel and sglang's alike: every running request is a lazy decoder,
# whose clock (``c`` at slot ``t``) moves on by one a slot — the slot itself here, sglang's count
# of decode steps there.
@_njit(cache=True, inline="always")
def _quiet_rows(
    t: int, te: int, c: int, t_base: int, comp: bool, ocut: int, B: int, i: int, pslot: np.ndarray, ps: np.ndarray,
    po: np.ndarray, R: np.ndarray, qbuf: np.ndarray, qh: int, ql: int, ph: np.ndarray, na: int, nL: int, CL: int,
    DL: int, out: np.ndarray,
) -> tuple[int, int, int]:  # fmt: skip
    """Slots ``t`` … ``te − 1`` of a quiet stretch, a row each (with ``comp``, the compute columns
    of the decode steps too): arrivals join the queue, the lazy set's memory grows.  Returns the
    plan's next request, the queue's length and ``DL`` at slot ``te``."""
    for tt in range(t, te):
        i, ql, arrived = S_.arrivals(tt, i, pslot, ps, po, ocut, R, qbuf, qh, ql)
        post = _lazy_post(DL, nL, c + tt - t, B, ph)
        col = tt - t_base
        S_.slot_row(out, col, arrived, 0, 0, 0, na, post, 0, nL, ql)  # nothing but decode steps
        if comp:
            kv = CL + nL * (c + tt - t + 1)
            out[9, col] = nL
            out[11, col] = nL
            out[12, col] = kv
            out[16, col] = kv
        DL = post
    return i, ql, DL


@_njit(cache=True, inline="always")
def _quiet_skip(
    t: int, te: int, c: int, ocut: int, B: int, i: int, pslot: np.ndarray, ps: np.ndarray, po: np.ndarray,
    R: np.ndarray, qbuf: np.ndarray, qh: int, ql: int, ph: np.ndarray, nL: int, DL: int, binned: bool, sums: bool,
    b2f: int, b2s: int, b2n: int, bins2: np.ndarray, mstart: int, memsum: int,
) -> tuple[int, int, int]:  # fmt: skip
    """Skip slots ``t`` … ``te − 1`` of a quiet stretch without rows: arrivals join the queue (and,
    ``binned``, the queue slope's bins), the memory sum gains the stretch (``sums``).  Returns the
    plan's next request, the queue's length and the memory sum."""
    i, ql = S_.arrivals_until(te, i, pslot, ps, po, ocut, R, qbuf, qh, ql, binned, b2f, b2s, b2n, bins2)
    if sums:
        lo = max(t, mstart)
        if lo < te:
            memsum += _post_sum(_dl_advance(DL, nL, c, lo - t, B, ph), nL, lo - t + c, te - lo, B, ph)
    return i, ql, memsum


@_njit(cache=True, inline="always")
def _budget_walk(
    t: int, B: int, budget: int, R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ph: np.ndarray, elist: np.ndarray,
    st: np.ndarray, at: int, ne: int, nL: int, CL: int, DL: int, hn: int, pexp: int, gexp: int,
) -> tuple[int, int, int, int, int, int, int]:  # fmt: skip
    """vLLM's running-first walk when the budget binds: a prefix of the admission order gets its
    whole ask, one request the budget's rest, the newer ones nothing.  Walks back from the newest
    while the asks before a request already spend the budget; a decoder it stalls is stepped
    explicitly in this slot.  Returns ``ne``, ``nL``, ``CL``, ``DL``, ``hn``, ``pexp``, ``gexp``."""
    total = nL + gexp
    sfx = 0
    stalled = 0
    r = at
    while r >= 0:
        lazy = R[F_MODE, r] == M_LAZY
        if lazy:
            ask = 1
        else:
            ask = R[F_GRANT, r]
        if total - sfx <= budget:
            break
        g = budget - (total - sfx - ask)
        if g < 0:
            g = 0
        prv = R[F_PRV, r]
        if lazy:
            p, nL, CL, DL, hn = _lazy_remove(R, hk, hid, ph, r, t, B, nL, CL, DL, hn)
            ne = _explicit_add(R, F_EPOS, elist, r, ne)
            pexp += held(p + g, B)
            gexp += g
            stalled += 1
        else:
            p = R[F_PROG, r]
            pexp += held(p + g, B) - held(p + ask, B)
            gexp += g - ask
        R[F_GRANT, r] = g
        sfx += ask
        r = prv
    if stalled > 0:
        st[ST_BUDGET] += 1
        st[ST_BUDREQ] += stalled
    return ne, nL, CL, DL, hn, pexp, gexp


@_njit(cache=True, inline="always")
def _preempt(
    life: int, t: int, B: int, M: int, R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ph: np.ndarray,
    elist: np.ndarray, qbuf: np.ndarray, P: int, gexp: int, ne: int, ah: int, at: int, na: int, nL: int, CL: int,
    DL: int, hn: int, qh: int, ql: int,
) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int]:  # fmt: skip
    """Preempt the newest while post-slot memory ``P`` exceeds ``M`` (the victims are a suffix of
    the admission order): memory and progress lost, the attempt's area wasted, back to the queue
    head (popped newest first, so the oldest ends up first).  Returns the victims, the area
    wasted, the progress to recompute (vLLM's lifecycle), then ``P``, ``gexp``, ``ne``, ``ah``,
    ``at``, ``na``, ``nL``, ``CL``, ``DL``, ``hn``, ``qh``, ``ql``."""
    cap = qbuf.shape[0]
    npreempt = 0
    step_wasted = 0
    step_recomp = 0
    while P > M:
        r = at
        if R[F_MODE, r] == M_LAZY:
            p, nL, CL, DL, hn = _lazy_remove(R, hk, hid, ph, r, t, B, nL, CL, DL, hn)
            P -= held(p + 1, B)
        else:
            p = R[F_PROG, r]
            g = R[F_GRANT, r]
            P -= held(p + g, B)
            gexp -= g
            ne = _explicit_drop(R, F_EPOS, elist, R[F_EPOS, r], ne)
        at = R[F_PRV, r]
        if at >= 0:
            R[F_NXT, at] = -1
        else:
            ah = -1
        na -= 1
        if life == VLLM_LIFE:
            R[F_RECOMP, r] += p
            step_recomp += p
            if p >= R[F_S, r]:  # vLLM keeps the outputs: they are recomputed as prompt
                R[F_O, r] = R[F_S, r] + R[F_O, r] - p - 1
                R[F_S, r] = p + 1
        step_wasted += _lose(R, r)
        qh = (qh - 1) % cap
        qbuf[qh] = r
        ql += 1
        npreempt += 1
    return npreempt, step_wasted, step_recomp, P, gexp, ne, ah, at, na, nL, CL, DL, hn, qh, ql


@_njit(cache=True, inline="always")
def _admit(
    pol: int, M: int, chunk: int, B: int, budget: int, maxseq: int, t: int, R: np.ndarray, qbuf: np.ndarray,
    elist: np.ndarray, st: np.ndarray, FT: np.ndarray, ring: bool, tree: bool, P: int, gexp: int, qh: int, ql: int,
    ah: int, at: int, na: int, ne: int, nL: int, resv: int, lah: int, law: int,
) -> tuple[int, int, int, int, int, int, int, int, int, int, bool]:  # fmt: skip
    """Admission at the queue head, FCFS, by the rule's test (``P``: post-slot memory of the
    actives); an admitted request becomes the newest active, stepped explicitly (it prefills).
    Returns the admitted, then ``qh``, ``ql``, ``ah``, ``at``, ``na``, ``ne``, ``resv``, ``lah``,
    ``law`` and whether lookahead's table is in the tree."""
    cap = qbuf.shape[0]
    nadmit = 0
    running = na
    acc = P
    left = budget - (nL + gexp)
    while ql > 0:
        r = qbuf[qh]
        if maxseq >= 0 and running >= maxseq:
            break
        sr = R[F_S, r]
        if pol == CURRENT_FIT or pol == NO_PREEMPT:
            g = min(sr, chunk)
            after = acc + held(g, B)
            if after > M:
                break
            acc = after
        elif pol == RESERVE:
            after = resv + held(sr + R[F_O, r], B)
            if after > M:
                break
            resv = after
            g = min(sr, chunk)
        elif pol == VLLM_V1:
            if acc + held(sr, B) > M or (budget >= 0 and left <= 0):
                break
            g = min(sr, chunk) if budget < 0 else min(sr, chunk, left)
            acc += held(g, B)
            if budget >= 0:
                left -= g
        else:  # LOOKAHEAD: projected totals at every included finish slot stay within M
            if r == lah and t < law:
                break
            st[ST_LATEST] += 1
            if ring:  # the table moves into the tree when many run, and back when few do
                if not tree and na >= FT[0, FT_.TREE_AT_]:
                    _la_to_tree(FT, R, ah, chunk, B)
                    tree = True
                elif tree and na <= FT[0, FT_.TABLE_AT_]:
                    _la_to_table(FT, R, ah, chunk, B)
                    tree = False
            if tree:
                ok, wake, fc, own = _la_test(FT, t, sr, R[F_O, r], chunk, B, M)
            else:
                ok, wake, fc, own = _lookahead_test(R, ah, r, t, M, chunk, B)
            if not ok:
                lah = r
                law = wake
                break
            if tree:
                _la_admit(FT, t, sr, R[F_O, r], chunk, B, fc, own)
            else:
                q = ah
                while q >= 0:
                    fq = R[F_FSLOT, q]
                    if fq <= fc:
                        R[F_TF, q] += _proj_held(sr, R[F_O, r], t, fq, chunk, B)
                    q = R[F_NXT, q]
                R[F_TF, r] = own
            R[F_FSLOT, r] = fc
            R[F_TA, r] = t
            g = min(sr, chunk)
        qh = (qh + 1) % cap
        ql -= 1
        ah, at = _link(R, r, ah, at)
        na += 1
        R[F_GRANT, r] = g
        ne = _explicit_add(R, F_EPOS, elist, r, ne)
        if R[F_FIRST, r] < 0:
            R[F_FIRST, r] = t
        running += 1
        nadmit += 1
    st[ST_ADMIT] += nadmit
    return nadmit, qh, ql, ah, at, na, ne, resv, lah, law, tree


@_njit(cache=True, inline="always")
def _work(
    t: int, B: int, comp: bool, R: np.ndarray, elist: np.ndarray, ne: int, nL: int, CL: int, LP: int
) -> tuple[int, int, int, int, int, int, int, int, int, int]:  # fmt: skip
    """The slot's work: lazy decoders in aggregate (``LP``: their post-slot memory), explicit
    requests one by one by their grants.  Returns the tokens, the memory, and (with ``comp``)
    the compute figures: scheduled, prefill and decode tokens, KV attended, prefill requests,
    prefill context, Σ grant², decode context."""
    tokens = nL
    memory = LP
    scheduled = nL
    pf_tok = 0
    dc_tok = nL
    kv_att = CL + nL * (t + 1)
    pf_reqs = 0
    pf_ctx = 0
    pf_sq = 0
    dc_ctx = kv_att
    for k in range(ne):
        r = elist[k]
        p0 = R[F_PROG, r]
        g = R[F_GRANT, r]
        p1 = p0 + g
        R[F_PROG, r] = p1
        h = held(p1, B)
        R[F_ATT, r] += h
        R[F_SERVED, r] += h
        tokens += g
        memory += h
        if comp and g > 0:
            scheduled += 1
            kv_att += p1
            if p0 < R[F_S, r]:
                pf_tok += g
                pf_reqs += 1
                pf_ctx += g * p0
                pf_sq += g * g
            else:
                dc_tok += g
                dc_ctx += p1
    return tokens, memory, scheduled, pf_tok, dc_tok, kv_att, pf_reqs, pf_ctx, pf_sq, dc_ctx


@_njit(cache=True, inline="always")
def _release(
    pol: int, t: int, chunk: int, B: int, lazy_ok: bool, tree: bool, R: np.ndarray, hk: np.ndarray,
    hid: np.ndarray, ph: np.ndarray, elist: np.ndarray, FT: np.ndarray, ne: int, ah: int, at: int, na: int, nL: int,
    CL: int, DL: int, hn: int, resv: int,
) -> tuple[int, int, int, int, int, int, int, int, int, int]:  # fmt: skip
    """Release the finished at the end of slot ``t`` (the lazy set's whose last slot it was, then
    the explicit ones); explicit decoders become lazy (``lazy_ok``).  ``DL`` is the lazy set's
    post-slot memory.  Returns the finished, then ``ne``, ``ah``, ``at``, ``na``, ``nL``, ``CL``,
    ``DL``, ``hn``, ``resv``."""
    done = 0
    while hn > 0 and hk[0] == t:
        r = hid[0]
        # its last slot's work is done: leaving the lazy set at slot t + 1 settles its areas
        _, nL, CL, DL, hn = _lazy_remove(R, hk, hid, ph, r, t + 1, B, nL, CL, DL, hn)
        if pol == RESERVE:
            resv -= held(R[F_S, r] + R[F_O, r], B)
        elif tree:
            _la_release(FT, R[F_FSLOT, r], R[F_TA, r], R[F_S, r], R[F_O, r], chunk, B)
        ah, at = _finish(R, r, t, ah, at)
        na -= 1
        done += 1
    for k in range(ne - 1, -1, -1):
        r = elist[k]
        p = R[F_PROG, r]
        sr = R[F_S, r]
        finished = p >= sr + R[F_O, r]
        if finished or (p >= sr and lazy_ok):
            ne = _explicit_drop(R, F_EPOS, elist, k, ne)
            if finished:
                if pol == RESERVE:
                    resv -= held(sr + R[F_O, r], B)
                elif tree:
                    _la_release(FT, R[F_FSLOT, r], R[F_TA, r], sr, R[F_O, r], chunk, B)
                ah, at = _finish(R, r, t, ah, at)
                na -= 1
                done += 1
            else:
                nL, CL, DL, hn = _lazy_add(R, hk, hid, ph, r, p, t + 1, B, nL, CL, DL, hn)
    return done, ne, ah, at, na, nL, CL, DL, hn, resv


# Without numba's reference counting (``_nrt=False``; the loop allocates nothing, every array is
# its caller's): each inlined phase binds the arrays it takes to names of its own, and counting
# those references in every slot (atomic increments the optimiser cannot pair off across the
# phases' loops) made the loop 1.5x slower than the same code written in one piece.
@_njit(cache=True, _nrt=False)
def run_builtins(
    cfg: np.ndarray,
    plan: S_.Plan,
    R: np.ndarray,
    qbuf: np.ndarray,
    elist: np.ndarray,
    hk: np.ndarray,
    hid: np.ndarray,
    ph: np.ndarray,
    st: np.ndarray,
    out: np.ndarray,
    bins: S_.Bins,
    FT: np.ndarray,
) -> int:
    """Run slots ``st[ST_T]`` … ``t_end − 1`` (fewer on a drain or a violation); returns a status
    code.  ``cfg`` is the run's settings record (``C_*`` of :mod:`~kvstab.engine._layout`, made by
    :func:`kvstab.engine._skeleton.config`: the rule ``C_POL``, the lifecycle ``C_LIFE``, the
    compute rows ``C_COMP`` and the settings every kernel reads); ``plan`` the requests' arrival
    slots, prompts and outputs.  With ``out`` of positive width, slot ``t``'s row is written at
    ``out[:, t − t_base]``; with ``bins``' ``bp[BP_ON]``, the batch-means sums of a streamed fixed
    horizon are added to its ``bins1`` (completions), ``bins2`` (arrivals − completions) and
    ``st[ST_MEMSUM]``.  ``lookahead`` keeps its finish-time table in ``R`` (O(n)
    a test and an admission), and when ``FT`` has :data:`~kvstab.engine._finish_tree.COLS` columns
    moves it into the finish tree (:mod:`kvstab.engine._finish_tree`, O(log W)) while many
    requests run."""
    M, chunk, B, budget, maxseq, check, t_end, drain, drain_min, t_base = S_.settings(cfg)
    pslot, ps, po = plan
    bins1, bins2, bp = bins
    pol = cfg[C_POL]
    life = cfg[C_LIFE]
    comp = cfg[C_COMP] != 0
    ocut = 1 if life == VLLM_LIFE else 0  # vLLM's lifecycle: o − 1 decode units
    n = pslot.shape[0]
    rows = out.shape[1] > 0
    lazy_ok = B <= LAZY_BMAX
    preempts = pol == CURRENT_FIT or pol == VLLM_V1
    ring = pol == LOOKAHEAD and FT.shape[1] == FT_.COLS  # lookahead may keep its table in the tree
    tree = ring and FT[0, FT_.MODE] == 1  # it does now
    binned, b1f, b1s, b1n, b2f, b2s, b2n, mstart = S_.bin_params(bp)
    t, i, qh, ql, na, ah, at, nL, DL, ne, hn, memsum = S_.load_state(st)
    resv = st[ST_RESV]
    CL = st[ST_CL]
    lah = st[ST_LAH]
    law = st[ST_LAW]
    status = REACHED
    while t < t_end:
        if S_.drained(drain, drain_min, t, i, n, na, ql):
            status = DRAINED
            break

        # ================= a quiet stretch: every running request is a lazy decoder, and
        # nothing can change a decision before slot te
        if ne == 0:
            te = _quiet_until(
                pol, M, chunk, B, budget, maxseq, check, preempts, t, t_end, drain, drain_min, i, pslot, R, qbuf, qh,
                ql, hk, hn, ph, na, nL, DL, resv, lah, law,
            )  # fmt: skip
            if te > t:
                S_.count_stretch(st, te - t, na)
                if rows:
                    i, ql, DL = _quiet_rows(
                        t, te, t, t_base, comp, ocut, B, i, pslot, ps, po, R, qbuf, qh, ql, ph, na, nL, CL, DL, out
                    )  # fmt: skip
                else:
                    i, ql, memsum = _quiet_skip(
                        t, te, t, ocut, B, i, pslot, ps, po, R, qbuf, qh, ql, ph, nL, DL, binned, binned, b2f, b2s, b2n,
                        bins2, mstart, memsum,
                    )  # fmt: skip
                    DL = _dl_advance(DL, nL, t, te - t, B, ph)
                t = te
                continue

        # ================= a full slot
        st[ST_FULL] += 1
        i, ql, arrived = S_.arrivals(t, i, pslot, ps, po, ocut, R, qbuf, qh, ql)

        # --- the decision: grants (one unit each unless the budget binds), then victims
        pexp = 0  # post-slot memory of the explicit requests
        gexp = 0  # their grants
        for k in range(ne):
            r = elist[k]
            p = R[F_PROG, r]
            sr = R[F_S, r]
            u = min(chunk, sr - p) if p < sr else 1
            R[F_GRANT, r] = u
            gexp += u
            pexp += held(p + u, B)
        if pol == VLLM_V1 and budget >= 0 and nL + gexp > budget:
            ne, nL, CL, DL, hn, pexp, gexp = _budget_walk(
                t, B, budget, R, hk, hid, ph, elist, st, at, ne, nL, CL, DL, hn, pexp, gexp
            )  # fmt: skip
        P = _lazy_post(DL, nL, t, B, ph) + pexp

        # --- preemption: the newest while post-slot memory exceeds M (victims are a suffix)
        npreempt = 0
        step_wasted = 0
        step_recomp = 0
        if preempts and P > M:
            npreempt, step_wasted, step_recomp, P, gexp, ne, ah, at, na, nL, CL, DL, hn, qh, ql = _preempt(
                life, t, B, M, R, hk, hid, ph, elist, qbuf, P, gexp, ne, ah, at, na, nL, CL, DL, hn, qh, ql
            )  # fmt: skip
            st[ST_PREEMPT] += npreempt

        # --- admission: head of line, FCFS; none in a slot that preempted
        nadmit = 0
        if npreempt == 0 and ql > 0:
            nadmit, qh, ql, ah, at, na, ne, resv, lah, law, tree = _admit(
                pol, M, chunk, B, budget, maxseq, t, R, qbuf, elist, st, FT, ring, tree, P, gexp, qh, ql, ah, at, na,
                ne, nL, resv, lah, law,
            )  # fmt: skip

        # --- work: lazy decoders in aggregate, explicit requests one by one
        LP = _lazy_post(DL, nL, t, B, ph)
        tokens, memory, scheduled, pf_tok, dc_tok, kv_att, pf_reqs, pf_ctx, pf_sq, dc_ctx = _work(
            t, B, comp, R, elist, ne, nL, CL, LP
        )  # fmt: skip
        st[ST_EXPL] += ne

        if check and S_.violated(st, t, memory, M, na, maxseq, tokens, budget):
            status = VIOLATION
            break

        # --- release the finished at the end of the slot; explicit decoders become lazy
        running_n = na
        DL = LP  # the lazy set's post-slot memory is what it holds at the start of slot t + 1
        done, ne, ah, at, na, nL, CL, DL, hn, resv = _release(
            pol, t, chunk, B, lazy_ok, tree, R, hk, hid, ph, elist, FT, ne, ah, at, na, nL, CL, DL, hn, resv
        )  # fmt: skip

        if rows:
            col = t - t_base
            S_.slot_row(out, col, arrived, nadmit, npreempt, done, running_n, memory, step_wasted, tokens, ql)
            if comp:  # the compute columns, after the SimResult's
                S_.put_column(out, col, NSIM, (scheduled, pf_tok, dc_tok, kv_att, pf_reqs, pf_ctx, pf_sq, dc_ctx, step_recomp))
        if binned:
            memsum = S_.bin_slot(t, b1f, b1s, b1n, b2f, b2s, b2n, mstart, bins1, bins2, memsum, arrived, done, memory)
        S_.count_slot(st, done, running_n)
        t += 1

    S_.store_state(st, t, i, qh, ql, na, ah, at, nL, DL, ne, hn, memsum)
    st[ST_RESV] = resv
    st[ST_CL] = CL
    st[ST_LAH] = lah
    st[ST_LAW] = law
    if ring:
        FT[0, FT_.MODE] = 1 if tree else 0
    return status
