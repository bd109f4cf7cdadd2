"""The compiled engine of the built-in ``sglang`` rule (numba; plain Python without numba).

:func:`run_sglang` is :meth:`kvstab.simulator.Engine.step` for
:class:`kvstab.schedulers.sglang.Sglang` (its decision, and the engine around it)
under three request lifecycles — kvstab's (a victim restarts at the queue head),
vLLM's (it resumes as ``(p + 1, s + o − p − 1)`` at the head) and SGLang's
(it resumes so at the queue *tail*, in retraction order, the kept batch re-sorted;
:mod:`kvstab.empirical.sglang_semantics`) — and writes what the reference engine
records: the ``SimResult`` rows, the streamed batch-means sums, or SGLang's step
log.  ``tests/test_engine_sglang.py`` and ``tests/test_engine_differential.py``
hold it to identical outputs.

SGLang's step is a *prefill* step (running requests get nothing) or a *decode*
step (every running request one token), so a decoding request's progress is
``d + τ``, with ``τ`` the number of decode steps so far — the clock of the lazy
decoders here (``_kernel``'s closed forms ``_lazy_post``, ``_dl_advance``,
``_overflow`` and ``_post_sum`` are reused with ``τ`` for the slot).  What the
rule reads of the running requests is kept in aggregates:

* memory held ``D_L``, the number decoding, and (``B > 1``) the histogram of
  ``d mod B``, which gives the pages needed in a decode step (retraction iff
  ``D_L + need > M``);
* ``Σ min(s + o − p, clip)`` exactly, as ``Σ_unclipped (R − τ) + clip · n_clipped``
  with ``R = s + o − d`` (an indexed heap moves a request to the unclipped sum
  when ``R − τ ≤ clip``);
* the finish heap on ``R`` (a decoder finishes in the decode step that makes
  ``τ = R``);
* the areas: a decoder is charged ``held(d + τ)`` in every slot it runs,
  prefill slots included, so the engine keeps ``W₂ = Σ_slots τ`` and the
  count of slots per ``τ mod B``; a request's area over its lazy stretch is
  ``d·Δslots + ΔW₂ + Σ_ρ pad(d + ρ)·Δcount_ρ`` (O(B) per touch, not per slot).

**Floats bit for bit.**  The rule's ``total_offset`` is Python's ``sum`` over the
running list in batch order of ``min(s + o − p, clip) · ratio`` — one rounding
per product and per addition — then one addition per admission, and its tests
compare ``free − total_offset`` with integers.  The engine keeps the exact
integer ``Σ min(…)``: the real value is ``Z = free − Σm − ratio·Σx``, and
Python's float differs from it by at most ``u·(n + k + 3)·U`` (``n`` products and
additions, ``k`` admissions, one subtraction; ``U`` bounds every magnitude).
A test is decided from ``Z`` when its margin exceeds twice that bound; in the
rare slot where it does not, the float sum is recomputed in Python's order
(O(n)) and the rest of the slot runs on it (``ST_EXACT`` counts them).
"""

from __future__ import annotations

import math

import numpy as np

from kvstab.engine import _layout as _L
from kvstab.engine._kernel import (  # noqa: F401 - active_ids: the actives of either kernel's list
    _FAR,
    _arrivals,
    _bins_of,
    _dl_advance,
    _heap_remove,
    _lazy_post,
    _link_tail,
    _njit,
    _overflow,
    _post_sum,
    _record,
    _sift_up,
    _stretch_arrivals,
    _stretch_rows,
    _unlink,
    _violated,
    active_ids,
    held,
)
from kvstab.engine._layout import (  # noqa: F401 - sglang.py and the tests read the layout here too
    BP_F1,
    BP_F2,
    BP_MEM,
    BP_N1,
    BP_N2,
    BP_ON,
    BP_S1,
    BP_S2,
    C_B,
    C_BUDGET,
    C_CHECK,
    C_CHUNK,
    C_CLIP,
    C_DRAIN,
    C_DRAIN_MIN,
    C_LIFE,
    C_M,
    C_MAXSEQ,
    C_MPT,
    C_RDS,
    C_SHIFT,
    C_T_BASE,
    C_T_END,
    DRAINED,
    F_HPOS,
    FC_DECAY,
    FC_INIT,
    FC_MIN,
    FS_RATIO,
    FS_SIZE,
    G_ATT,
    G_CLIP,
    G_CPOS,
    G_D,
    G_EPOS,
    G_FIN,
    G_FIRST,
    G_GRANT,
    G_MODE,
    G_NPRE,
    G_NXT,
    G_O,
    G_PRIOR,
    G_PROG,
    G_PRV,
    G_PS,
    G_RANK,
    G_RECOMP,
    G_S,
    G_SERVED,
    G_TB,
    G_W2S,
    G_WASTED,
    K_DECODE,
    K_IDLE,
    K_PREFILL,
    KVSTAB_LIFE,
    L_DC,
    L_FIN,
    L_FULL,
    L_KIND,
    L_KV,
    L_NADM,
    L_NFIN,
    L_NRET,
    L_NTOK,
    L_PF,
    L_QUEUE,
    L_RET,
    L_TOKOFF,
    M_EXPL,
    M_LAZY,
    M_OUT,
    NG,
    NLOG,
    REACHED,
    SGLANG_LIFE,
    ST_ADMIT,
    ST_AH,
    ST_AT,
    ST_BATCH_FULL,
    ST_BVER,
    ST_CALL,
    ST_CN,
    ST_DL,
    ST_DONE,
    ST_DUMPL,
    ST_DUMPO,
    ST_DUMPV,
    ST_EVP,
    ST_EXACT,
    ST_EXPL,
    ST_FULL,
    ST_HN,
    ST_I,
    ST_MEMSUM,
    ST_NA,
    ST_NC,
    ST_NE,
    ST_NL,
    ST_NU,
    ST_PREEMPT,
    ST_QH,
    ST_QL,
    ST_RANKC,
    ST_RETRACT,
    ST_RU,
    ST_RUNSUM,
    ST_SIZE,
    ST_SKIP,
    ST_STRETCH,
    ST_T,
    ST_TAU,
    ST_VKIND,
    ST_VMEM,
    ST_VSLOT,
    ST_VVALUE,
    ST_W2,
    VIOLATION,
)

#: the text of ``_kernel.py`` this file was last compiled with (a prefix of its sha256).
#: numba keys a cached function by the text of its own file only, and this kernel inlines
#: ``_kernel``'s helpers (the lazy decoders, the heap): after they change, a cached
#: ``run_sglang`` would keep the old copies.  A test holds this to ``_kernel.py``'s hash
#: (``sha256sum kvstab/engine/_kernel.py | cut -c1-16``), and changing it here changes this
#: file's text, so the cache is rebuilt.
KERNEL_SHA = "4495bb0688222962"
#: the same for ``_layout.py``, whose indices numba compiles into the kernel as constants
LAYOUT_SHA = "c8be141dbecddcca"
GUARDS = (("_kernel.py", KERNEL_SHA), ("_layout.py", LAYOUT_SHA))
_L.warn_if_stale(__name__, GUARDS)

#: the work counters a run reports (name, index into ``st``)
WORK = (
    ("full_slots", ST_FULL),
    ("skipped_slots", ST_SKIP),
    ("stretches", ST_STRETCH),
    ("explicit_steps", ST_EXPL),
    ("admissions", ST_ADMIT),
    ("preemptions", ST_PREEMPT),
    ("retraction_steps", ST_RETRACT),
    ("completions", ST_DONE),
    ("exact_sums", ST_EXACT),
    ("request_slots", ST_RUNSUM),
)

#: the batch-full flag under its old name (tests read it)
S_FULL = ST_BATCH_FULL

_U2 = 2.0**-52  # twice the unit roundoff of a double


@_njit(cache=True)
def _pad_count(cnt: np.ndarray, call: int, phi: int, B: int) -> int:
    """``Σ_ρ ((−φ − ρ) mod B) · count_ρ``: the block padding a decoder with ``d ≡ φ`` was
    charged over the slots counted so far (``count_ρ`` = slots whose ``τ ≡ ρ``)."""
    if B == 1:
        return 0
    total = call * (B * (B - 1) // 2)
    for rho in range(B):
        c = cnt[rho]
        if c != 0:
            total += ((-phi - rho) % B) * c
    return total


@_njit(cache=True, inline="always")
def _touch(R: np.ndarray, r: int, t: int, tau: int, w2: int, cnt: np.ndarray, call: int, B: int) -> int:
    """Bring lazy decoder ``r``'s progress and areas up to the start of slot ``t``; returns its progress."""
    d = R[G_D, r]
    ps = _pad_count(cnt, call, d % B, B) if B > 1 else 0
    a = d * (t - R[G_TB, r]) + (w2 - R[G_W2S, r]) + (ps - R[G_PS, r])
    R[G_ATT, r] += a
    R[G_SERVED, r] += a
    R[G_TB, r] = t
    R[G_W2S, r] = w2
    R[G_PS, r] = ps
    p = d + tau
    R[G_PROG, r] = p
    return p


@_njit(cache=True, inline="always")
def _lazy_leave(
    R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ck: np.ndarray, cid: np.ndarray, Rc: np.ndarray,
    ph: np.ndarray, cnt: np.ndarray, r: int, t: int, tau: int, w2: int, call: int, B: int,
    nL: int, DL: int, hn: int, cn: int, nu: int, ru: int, nc: int,
) -> tuple[int, int, int, int, int, int, int, int]:  # fmt: skip
    """Lazy decoder ``r`` leaves the lazy set at the start of slot ``t`` (its areas settled);
    returns its progress and the updated aggregates."""
    d = R[G_D, r]
    p = _touch(R, r, t, tau, w2, cnt, call, B)
    if B > 1:
        ph[d % B] -= 1
    hn = _heap_remove(hk, hid, R, r, hn)
    if R[G_CLIP, r] == 1:  # still in the clip heap (crossings are moved only when Σx is read)
        cn = _heap_remove(ck, cid, Rc, r, cn)
        R[G_CLIP, r] = 0
        nc -= 1
    else:
        nu -= 1
        ru -= R[G_S, r] + R[G_O, r] - d
    return p, nL - 1, DL - held(p, B), hn, cn, nu, ru, nc


@_njit(cache=True, inline="always")
def _lazy_join(
    R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ck: np.ndarray, cid: np.ndarray, Rc: np.ndarray,
    ph: np.ndarray, cnt: np.ndarray, r: int, p: int, t: int, tau: int, w2: int, call: int, B: int, clip: int,
    nL: int, DL: int, hn: int, cn: int, nu: int, ru: int, nc: int,
) -> tuple[int, int, int, int, int, int, int]:  # fmt: skip
    """Request ``r`` (progress ``p ≥ s``) joins the lazy set at the start of slot ``t``: it
    decodes from the next decode step on, ``d = p − τ``; returns the updated aggregates."""
    d = p - tau
    R[G_MODE, r] = M_LAZY
    R[G_PROG, r] = p
    R[G_D, r] = d
    R[G_TB, r] = t
    R[G_W2S, r] = w2
    R[G_PS, r] = _pad_count(cnt, call, d % B, B) if B > 1 else 0
    if B > 1:
        ph[d % B] += 1
    key = R[G_S, r] + R[G_O, r] - d  # it finishes in the decode step that makes τ = key
    hk[hn] = key
    hid[hn] = r
    _sift_up(hk, hid, R, hn)
    if key - tau > clip:
        ck[cn] = key
        cid[cn] = r
        R[G_CLIP, r] = 1
        _sift_up(ck, cid, Rc, cn)
        cn += 1
        nc += 1
    else:
        R[G_CLIP, r] = 0
        nu += 1
        ru += key
    return nL + 1, DL + held(p, B), hn + 1, cn, nu, ru, nc


@_njit(cache=True)
def load_lazy(
    R: np.ndarray, hk: np.ndarray, hid: np.ndarray, ck: np.ndarray, cid: np.ndarray, ph: np.ndarray,
    cnt: np.ndarray, st: np.ndarray, r: int, p: int, B: int, clip: int,
) -> None:  # fmt: skip
    """Request ``r`` joins the lazy set at the current slot (a loaded state; tests)."""
    nL, DL, hn, cn, nu, ru, nc = _lazy_join(
        R, hk, hid, ck, cid, R[C_SHIFT:], ph, cnt, r, p, st[ST_T], st[ST_TAU], st[ST_W2], st[ST_CALL], B, clip,
        st[ST_NL], st[ST_DL], st[ST_HN], st[ST_CN], st[ST_NU], st[ST_RU], st[ST_NC],
    )  # fmt: skip
    st[ST_NL], st[ST_DL], st[ST_HN], st[ST_CN], st[ST_NU], st[ST_RU], st[ST_NC] = nL, DL, hn, cn, nu, ru, nc


@_njit(cache=True)
def sync_lazy(R: np.ndarray, st: np.ndarray, cnt: np.ndarray, B: int) -> None:
    """Bring every lazy decoder's progress and areas up to the start of slot ``st[ST_T]``."""
    r = st[ST_AH]
    while r >= 0:
        if R[G_MODE, r] == M_LAZY:
            _touch(R, r, st[ST_T], st[ST_TAU], st[ST_W2], cnt, st[ST_CALL], B)
        r = R[G_NXT, r]


@_njit(cache=True)
def _exact_offset(R: np.ndarray, ah: int, tau: int, clip: int, ratio: float, chain: np.ndarray, k: int) -> float:
    """``total_offset`` as Python computes it: ``sum`` over the running list in batch order of
    ``min(s + o − p, clip) · ratio`` (0 for a request in prefill), then the ``k`` admissions' additions."""
    s = 0.0
    r = ah
    while r >= 0:
        if R[G_MODE, r] == M_LAZY:
            x = min(R[G_S, r] + R[G_O, r] - (R[G_D, r] + tau), clip)
            s = s + float(x) * ratio
        r = R[G_NXT, r]
    for j in range(k):
        s = s + float(chain[j])
    return s


@_njit(cache=True)
def _pop_order(outs: np.ndarray, prompts: np.ndarray) -> np.ndarray:
    """SGLang's retraction order of the batch (indices into it): fewest outputs first, then the
    longest original prompt, then the latest in the batch (``_get_decode_retraction_order``)."""
    n = outs.shape[0]
    order = np.arange(n - 1, -1, -1)  # latest first
    order = order[np.argsort(-prompts[order], kind="mergesort")]
    return order[np.argsort(outs[order], kind="mergesort")]


# ---- the phases of a slot, each inlined into the loop
@_njit(cache=True, inline="always")
def _quiet_until(
    hk: np.ndarray, ph: np.ndarray, pslot: np.ndarray, k: tuple, t: int, t_end: int, q: tuple[int, int, int],
    na: int, lz: tuple[int, int, int, int, int, int, int], tau: int, full: int,
) -> int:  # fmt: skip
    """The first slot ``te ≥ t`` in which anything could change: decode steps (each moving ``τ``
    on by one) until a completion, a retraction, or an arrival walked in its slot (``t``: run
    slot ``t`` in full)."""
    life, M, chunk, B, budget, maxseq, mpt, clip, rds, check, drain, drain_min = k
    i, qh, ql = q
    nL, DL, hn, cn, nu, ru, nc = lz
    n = pslot.shape[0]
    te = t_end
    idle = na == 0
    if ql == 0 and i < n and pslot[i] < te and (idle or full == 0):
        te = pslot[i]  # an arrival into an empty queue is walked in its slot
    if drain and i >= n and t < drain_min < te:
        te = drain_min
    if not idle:
        # slot t + j ends with τ + j + 1
        if hn > 0 and hk[0] - tau - 1 < te - t:
            te = t + hk[0] - tau - 1  # a completion clears the flag (the queue is walked next)
        if te > t:
            te = t + _overflow(DL, nL, tau, tau + te - t, M, B, ph) - tau  # a retraction
        if check and ((budget >= 0 and nL > budget) or (maxseq >= 0 and na > maxseq)):
            te = t
    return te


@_njit(cache=True, inline="always")
def _skip(
    cnt: np.ndarray, ph: np.ndarray, fk: tuple[float, float, float], B: int, L: int, idle: bool, nL: int,
    DL: int, clk: tuple[int, int, int], ratio: float, full: int,
) -> tuple[int, tuple[int, int, int], float, int]:  # fmt: skip
    """The clock after ``L`` skipped slots: idle ones (the first resets the ratio, the rest change
    nothing) or decode steps (``τ`` moves on, the areas' sums grow, the ratio decays one float
    operation a step until its floor holds).  Returns ``D_L``, the clock, the ratio, the flag."""
    r_init, r_min, r_decay = fk
    tau, w2, call = clk
    if idle:
        ratio = r_init
        full = 0
        w2 += L * tau
        cnt[tau % B] += L
    else:
        DL = _dl_advance(DL, nL, tau, L, B, ph)
        w2 += L * tau + L * (L + 1) // 2
        qb = L // B
        call += qb
        for j in range(qb * B + 1, L + 1):
            cnt[(tau + j) % B] += 1
        tau += L
        for _ in range(L):
            x = ratio - r_decay
            nxt = r_min if r_min > x else x
            if nxt == ratio:
                break
            ratio = nxt
    return DL, (tau, w2, call), ratio, full


@_njit(cache=True, inline="always")
def _batch_order(R: np.ndarray, elist: np.ndarray, ne: int, DL: int, B: int) -> int:
    """Sort the explicit (prefilling) requests into batch order; returns the memory in use."""
    for x in range(1, ne):
        r = elist[x]
        b = x - 1
        while b >= 0 and R[G_RANK, elist[b]] > R[G_RANK, r]:
            elist[b + 1] = elist[b]
            b -= 1
        elist[b + 1] = r
    used = DL
    for x in range(ne):
        r = elist[x]
        R[G_EPOS, r] = x
        used += held(R[G_PROG, r], B)
    return used


@_njit(cache=True, inline="always")
def _unclip(
    R: np.ndarray, ck: np.ndarray, cid: np.ndarray, Rc: np.ndarray, tau: int, clip: int,
    lz: tuple[int, int, int, int, int, int, int],
) -> tuple[int, int, int, int, int, int, int]:  # fmt: skip
    """Decoders whose ``s + o − p`` fell to the clip move from the clip heap to the unclipped sum."""
    nL, DL, hn, cn, nu, ru, nc = lz
    while cn > 0 and ck[0] - tau <= clip:
        r = cid[0]
        cn = _heap_remove(ck, cid, Rc, r, cn)
        R[G_CLIP, r] = 0
        nc -= 1
        nu += 1
        ru += R[G_S, r] + R[G_O, r] - R[G_D, r]
    return nL, DL, hn, cn, nu, ru, nc


@_njit(cache=True, inline="always")
def _offset_lt(
    A: int, free: int, rsx: float, nL: int, off: tuple[int, float, int, int], R: np.ndarray, ah: int, tau: int,
    clip: int, ratio: float, chain: np.ndarray, st: np.ndarray,
) -> tuple[bool, tuple[int, float, int, int]]:  # fmt: skip
    """``A < free − total_offset`` as the rule's float decides it.  ``off`` is ``(mode, tof, Σm,
    k)``: ``total_offset`` is int 0 with nothing decoding (mode 0), else the exact aggregate
    (mode 1: ``ratio·Σx`` is ``rsx``) decided within its rounding bound, or Python's float sum
    ``tof`` (mode 2, once a test fell within the bound; ``st[ST_EXACT]`` counts them)."""
    mode, tof, summ, k = off
    while True:
        if mode == 0:
            res = A < free - summ
            break
        if mode == 2:
            res = A < float(free) - tof
            break
        Z = float(free - summ) - rsx
        E = _U2 * (nL + k + 8) * (abs(free) + rsx + summ + 1.0)
        if A < Z - E:
            res = True
            break
        if A > Z + E:
            res = False
            break
        tof = _exact_offset(R, ah, tau, clip, ratio, chain, k)
        mode = 2
        st[ST_EXACT] += 1
    return res, (mode, tof, summ, k)


@_njit(cache=True, inline="always")
def _limited(
    cap: int, free: int, rsx: float, nL: int, off: tuple[int, float, int, int], R: np.ndarray, ah: int, tau: int,
    clip: int, ratio: float, chain: np.ndarray, st: np.ndarray,
) -> tuple[int, tuple[int, float, int, int]]:  # fmt: skip
    """``min(cap, floor(free − total_offset))`` as the rule's float decides it (see :func:`_offset_lt`)."""
    mode, tof, summ, k = off
    while True:
        if mode == 0:
            limited = min(cap, free - summ)
            break
        if mode == 2:
            limited = min(cap, int(math.floor(float(free) - tof)))
            break
        Z = float(free - summ) - rsx
        E = _U2 * (nL + k + 8) * (abs(free) + rsx + summ + 1.0)
        if Z - E >= cap:
            limited = cap
            break
        f1 = int(math.floor(Z - E))
        if f1 == int(math.floor(Z + E)):
            limited = min(cap, f1)
            break
        tof = _exact_offset(R, ah, tau, clip, ratio, chain, k)
        mode = 2
        st[ST_EXACT] += 1
    return limited, (mode, tof, summ, k)


@_njit(cache=True, inline="always")
def _offset_add(chain: np.ndarray, off: tuple[int, float, int, int], m: int) -> tuple[int, float, int, int]:
    """One addition ``m`` to ``total_offset`` (kept for Python's order in ``chain``)."""
    mode, tof, summ, k = off
    chain[k] = m
    return mode, tof + float(m), summ + m, k + 1


@_njit(cache=True, inline="always")
def _chunked(
    R: np.ndarray, elist: np.ndarray, chain: np.ndarray, st: np.ndarray, ne: int, free: int, rsx: float, nL: int,
    off: tuple[int, float, int, int], bud: tuple[int, int, int, int, int, bool, bool], ah: int, tau: int,
    clip: int, ratio: float, B: int,
) -> tuple[tuple[int, float, int, int], tuple[int, int, int, int, int, bool, bool]]:  # fmt: skip
    """The chunked requests' next chunks, batch order (the rule's first loop): each gets what
    the chunk budget, ``free − total_offset`` and the free pages allow.  ``bud`` is the step's
    budget ``(cur_off, rem_chunk, rem_input, reserved, in_batch, continuing, fin_pf)``."""
    cur_off, rem_chunk, rem_input, reserved, in_batch, continuing, fin_pf = bud
    for x in range(ne):
        r = elist[x]
        p = R[G_PROG, r]
        cand = R[G_S, r] - p
        limited, off = _limited(rem_chunk, free, rsx, nL, off, R, ah, tau, clip, ratio, chain, st)
        allow = rem_chunk if limited <= 0 else limited
        room = held(p, B) - p + max(free - reserved, 0) // B * B
        allow = max(0, min(allow, room))
        new_len = min(cand, allow)
        truncated = new_len < cand
        mnr = 0 if truncated else min(R[G_O, r] + 1 + R[G_PRIOR, r], clip)
        R[G_GRANT, r] = new_len
        ext = held(new_len, B)
        off = _offset_add(chain, off, ext + B + mnr)
        cur_off += ext + B
        rem_chunk -= ext
        rem_input -= ext
        reserved += held(p + new_len, B) - held(p, B)
        in_batch += 1
        continuing = continuing or truncated
        fin_pf = fin_pf or (not truncated and R[G_O, r] == 0)
    return off, (cur_off, rem_chunk, rem_input, reserved, in_batch, continuing, fin_pf)


@_njit(cache=True, inline="always")
def _walk(
    R: np.ndarray, qbuf: np.ndarray, chain: np.ndarray, st: np.ndarray, q: tuple[int, int, int], na: int,
    free: int, rsx: float, nL: int, off: tuple[int, float, int, int],
    bud: tuple[int, int, int, int, int, bool, bool], ah: int, tau: int, clip: int, ratio: float, B: int,
    maxseq: int,
) -> tuple[tuple[int, float, int, int], tuple[int, int, int, int, int, bool, bool], int, bool]:  # fmt: skip
    """The walk over the queue (the rule's second loop): the head is admitted while its tests of
    ``free − total_offset`` pass and the budgets last.  Returns the offsets, the budget, how many
    were admitted and whether the batch is now full (the flag is set)."""
    i, qh, ql = q
    cap = qbuf.shape[0]
    cur_off, rem_chunk, rem_input, reserved, in_batch, continuing, fin_pf = bud
    set_full = False
    nadm = 0
    empty = na == 0
    while nadm < ql:
        w = qbuf[(qh + nadm) % cap]
        sw = R[G_S, w]
        ow = R[G_O, w]
        if rem_input <= 0 or rem_chunk <= 0:
            # budget_state: no memory (V <= 0) comes before a spent budget
            pos, off = _offset_lt(0, free, rsx, nL, off, R, ah, tau, clip, ratio, chain, st)
            if pos:
                break  # the budget is spent and memory is left: stop, the flag untouched
        if maxseq >= 0 and maxseq <= nL + in_batch:
            set_full = True
            break
        if empty and in_batch == 0:
            fits = True  # the empty system admits its head (the rule's one deviation)
        else:
            fits, off = _offset_lt(sw + min(ow + 1, clip) + B, free, rsx, nL, off, R, ah, tau, clip, ratio, chain, st)
        if not fits:
            if in_batch > 0 or nL > 0:
                set_full = True
            break
        whole = held(sw, B) <= rem_chunk
        chunk_len = max(rem_chunk, 0) // B * B
        if not whole and chunk_len <= 0:
            break
        ext_raw = sw if whole else chunk_len
        mnr = min(ow + 1 + R[G_PRIOR, w], clip) if whole else 0
        ext = held(ext_raw, B)
        off = _offset_add(chain, off, ext + B + mnr)
        cur_off += ext + B
        rem_chunk -= ext
        rem_input -= ext
        reserved += ext
        in_batch += 1
        continuing = continuing or not whole
        fin_pf = fin_pf or (whole and ow == 0)
        R[G_GRANT, w] = ext_raw
        nadm += 1
        # after an admission: no memory left stops the walk (and sets the flag)
        pos, off = _offset_lt(0, free, rsx, nL, off, R, ah, tau, clip, ratio, chain, st)
        if not pos or free - cur_off <= 0:
            set_full = True
            break
        if rem_input <= 0 or rem_chunk <= 0:
            break
    return off, (cur_off, rem_chunk, rem_input, reserved, in_batch, continuing, fin_pf), nadm, set_full


@_njit(cache=True, inline="always")
def _prefill(
    R: np.ndarray, qbuf: np.ndarray, elist: np.ndarray, ev: np.ndarray, st: np.ndarray, t: int, chunk: int, B: int,
    logging: bool, nadm: int, q: tuple[int, int, int], a: tuple[int, int, int, int], rankc: int, evp: int,
    DL: int,
) -> tuple[tuple[int, int, int], tuple[int, int, int, int], int, int, int, int]:  # fmt: skip
    """A prefill step: the chunked requests' work (batch order), then the admitted, popped from
    the queue head (the newest of the batch).  Returns the queue, the actives, the rank counter,
    the log cursor, the tokens processed and the memory."""
    i, qh, ql = q
    na, ah, at, ne = a
    cap = qbuf.shape[0]
    tokens = 0
    for x in range(ne):
        r = elist[x]
        p = R[G_PROG, r]
        g = max(0, min(R[G_GRANT, r], chunk, R[G_S, r] - p))
        R[G_PROG, r] = p + g
        tokens += g
        if logging and g > 0:
            ev[evp] = r
            ev[evp + 1] = g
            evp += 2
    for _ in range(nadm):
        r = qbuf[qh]
        qh = (qh + 1) % cap
        ql -= 1
        ah, at = _link_tail(R, r, ah, at)
        R[G_RANK, r] = rankc
        rankc += 1
        na += 1
        R[G_MODE, r] = M_EXPL
        elist[ne] = r
        R[G_EPOS, r] = ne
        ne += 1
        if R[G_FIRST, r] < 0:
            R[G_FIRST, r] = t
        g = max(0, min(R[G_GRANT, r], chunk, R[G_S, r]))
        R[G_PROG, r] = g
        tokens += g
        if logging:
            ev[evp] = r
            ev[evp + 1] = g
            evp += 2
    st[ST_ADMIT] += nadm
    memory = DL
    for x in range(ne):
        r = elist[x]
        h = held(R[G_PROG, r], B)
        R[G_ATT, r] += h
        R[G_SERVED, r] += h
        memory += h
    st[ST_EXPL] += ne
    return (i, qh, ql), (na, ah, at, ne), rankc, evp, tokens, memory


@_njit(cache=True, inline="always")
def _retract(
    tabs: tuple, st: np.ndarray, ev: np.ndarray, k: tuple, t: int, q: tuple[int, int, int],
    a: tuple[int, int, int, int], lz: tuple[int, int, int, int, int, int, int], clk: tuple[int, int, int],
    logging: bool, evp: int,
) -> tuple[tuple[int, int, int], tuple[int, int, int, int], tuple[int, int, int, int, int, int, int], float, int, int, int, int]:  # fmt: skip
    """A decode step that does not fit (``schedule_batch.py`` ``retract_decode``): one pass over
    the batch pops requests in SGLang's retraction order until the rest fit; the ratio is set
    from the kept requests' view values; the victims lose their memory (and their progress, or
    resume later: at the queue's head, oldest first, or under SGLang's lifecycle at its tail in
    retraction order, the kept batch then re-sorted into ``chain``).  Returns the queue, the
    actives, the lazy aggregates, the ratio, the victims, their wasted area, the log cursor and
    how many kept requests were re-sorted (``-1``: no re-sort)."""
    R, qbuf, elist, hk, hid, ck, cid, ph, cnt, chain = tabs
    life, M, chunk, B, budget, maxseq, mpt, clip, rds, check, drain, drain_min = k
    i, qh, ql = q
    na, ah, at, ne = a
    nL, DL, hn, cn, nu, ru, nc = lz
    tau, w2, call = clk
    Rc = R[C_SHIFT:]
    cap = qbuf.shape[0]
    st[ST_RETRACT] += 1
    cntb = na
    ids = np.empty(cntb, dtype=np.int64)
    r = ah
    for x in range(cntb):
        ids[x] = r
        r = R[G_NXT, r]
    outs = np.empty(cntb, dtype=np.int64)
    prompts = np.empty(cntb, dtype=np.int64)
    weight = np.empty(cntb, dtype=np.int64)
    total = 0
    for x in range(cntb):
        r = ids[x]
        p = R[G_D, r] + tau
        outs[x] = p - R[G_S, r] + 1 + R[G_PRIOR, r]
        prompts[x] = R[G_S, r] - R[G_PRIOR, r]
        weight[x] = held(p + 1, B)  # what it holds after a decode step: held + need
        total += weight[x]
    order = _pop_order(outs, prompts)
    popped = np.zeros(cntb, dtype=np.bool_)
    if cntb >= 2:
        popped[order[0]] = True
        rest = total - weight[order[0]]
        kk = 1
        while kk < cntb - 1 and rest > M:
            popped[order[kk]] = True
            rest -= weight[order[kk]]
            kk += 1
    # the ratio from the kept requests' view values
    sum_out = 0
    sum_max = 0
    n_kept = 0
    for x in range(cntb):
        if not popped[x]:
            r = ids[x]
            n_kept += 1
            sum_out += outs[x]
            sum_max += R[G_O, r] + 1 + R[G_PRIOR, r]
    est = float(sum_out + rds * n_kept) / float(sum_max + 1)
    ratio = est if est < 1.0 else 1.0
    # the victims, batch order: they lose their memory (and progress, or resume later)
    npreempt = 0
    wasted = 0
    for x in range(cntb):
        if not popped[x]:
            continue
        r = ids[x]
        p, nL, DL, hn, cn, nu, ru, nc = _lazy_leave(
            R, hk, hid, ck, cid, Rc, ph, cnt, r, t, tau, w2, call, B, nL, DL, hn, cn, nu, ru, nc
        )
        ah, at = _unlink(R, r, ah, at)
        na -= 1
        if life != KVSTAB_LIFE:
            R[G_RECOMP, r] += p
            R[G_PRIOR, r] += p - R[G_S, r] + 1
            R[G_O, r] = R[G_S, r] + R[G_O, r] - p - 1
            R[G_S, r] = p + 1
        wasted += R[G_ATT, r]
        R[G_WASTED, r] += R[G_ATT, r]
        R[G_ATT, r] = 0
        R[G_PROG, r] = 0
        R[G_NPRE, r] += 1
        R[G_MODE, r] = M_OUT
        npreempt += 1
    nres = -1
    if life == SGLANG_LIFE:
        # to the queue's tail in retraction order
        for x in range(cntb):
            b = order[x]
            if popped[b]:
                qbuf[(qh + ql) % cap] = ids[b]
                ql += 1
                if logging:
                    ev[evp] = ids[b]
                    evp += 1
        # the kept batch is re-sorted (most outputs first, then the shorter original prompt,
        # then batch order: the retraction order reversed) once the finished have left
        nres = 0
        for x in range(cntb - 1, -1, -1):
            b = order[x]
            if not popped[b]:
                chain[nres] = ids[b]
                nres += 1
    else:
        # to the queue's head, the oldest first
        for x in range(cntb - 1, -1, -1):
            if popped[x]:
                qh = (qh - 1) % cap
                qbuf[qh] = ids[x]
                ql += 1
    st[ST_PREEMPT] += npreempt
    return (i, qh, ql), (na, ah, at, ne), (nL, DL, hn, cn, nu, ru, nc), ratio, npreempt, wasted, evp, nres


@_njit(cache=True, inline="always")
def _batch_dump(R: np.ndarray, chain: np.ndarray, ev: np.ndarray, ah: int, nres: int, evp: int) -> int:
    """The batch that decodes, one token each, written to the log (after a retraction under
    SGLang's lifecycle: the re-sorted batch); returns the log cursor."""
    if nres >= 0:
        for x in range(nres):
            ev[evp] = chain[x]
            evp += 1
    else:
        r = ah
        while r >= 0:
            ev[evp] = r
            evp += 1
            r = R[G_NXT, r]
    return evp


@_njit(cache=True, inline="always")
def _release(
    tabs: tuple, ev: np.ndarray, t: int, B: int, clip: int, decode: bool, logging: bool,
    a: tuple[int, int, int, int], lz: tuple[int, int, int, int, int, int, int], clk: tuple[int, int, int],
    evp: int,
) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int, int, int, int], int, int, int]:  # fmt: skip
    """The end of slot ``t``: the decoders a decode step finished leave (heap top), then the
    finished prefills; the other prefills done with their prompt join the lazy set.  The
    finished are logged in batch order.  Returns the actives, the lazy aggregates, how many
    finished, how many of them were decoders (they clear the batch flag) and the log cursor."""
    R, qbuf, elist, hk, hid, ck, cid, ph, cnt, chain = tabs
    na, ah, at, ne = a
    nL, DL, hn, cn, nu, ru, nc = lz
    tau, w2, call = clk
    Rc = R[C_SHIFT:]
    fin0 = evp
    done = 0
    while hn > 0 and hk[0] == tau and decode:
        r = hid[0]
        _, nL, DL, hn, cn, nu, ru, nc = _lazy_leave(
            R, hk, hid, ck, cid, Rc, ph, cnt, r, t + 1, tau, w2, call, B, nL, DL, hn, cn, nu, ru, nc
        )
        R[G_MODE, r] = M_OUT
        R[G_FIN, r] = t
        ah, at = _unlink(R, r, ah, at)
        na -= 1
        done += 1
        if logging:
            ev[evp] = r
            evp += 1
    decoded = done
    for x in range(ne - 1, -1, -1):
        r = elist[x]
        p = R[G_PROG, r]
        sr = R[G_S, r]
        finished = p >= sr + R[G_O, r]
        if finished or p >= sr:
            ne -= 1
            last = elist[ne]
            elist[x] = last
            R[G_EPOS, last] = x
            if finished:
                R[G_MODE, r] = M_OUT
                R[G_FIN, r] = t
                ah, at = _unlink(R, r, ah, at)
                na -= 1
                done += 1
                if logging:
                    ev[evp] = r
                    evp += 1
            else:
                nL, DL, hn, cn, nu, ru, nc = _lazy_join(
                    R, hk, hid, ck, cid, Rc, ph, cnt, r, p, t + 1, tau, w2, call, B, clip, nL, DL, hn, cn, nu, ru, nc
                )  # fmt: skip
    if logging and done > 1:
        # finished in batch order (their ranks are still the step's)
        for x in range(fin0 + 1, evp):
            r = ev[x]
            b = x - 1
            while b >= fin0 and R[G_RANK, ev[b]] > R[G_RANK, r]:
                ev[b + 1] = ev[b]
                b -= 1
            ev[b + 1] = r
    return (na, ah, at, ne), (nL, DL, hn, cn, nu, ru, nc), done, decoded, evp


@_njit(cache=True, inline="always")
def _resort(R: np.ndarray, chain: np.ndarray, nres: int) -> tuple[int, int, int]:
    """Relink the kept batch in its re-sorted order (``chain``), the finished left out; returns the
    list's head and tail and the rank counter."""
    ah = -1
    at = -1
    rankc = 0
    for x in range(nres):
        r = chain[x]
        if R[G_MODE, r] == M_OUT:
            continue  # finished in this step
        ah, at = _link_tail(R, r, ah, at)
        R[G_RANK, r] = rankc
        rankc += 1
    return ah, at, rankc


@_njit(cache=True, inline="always")
def _log_row(
    R: np.ndarray, elist: np.ndarray, lg: np.ndarray, lr: np.ndarray, col: int, B: int, DL: int, ne: int,
    kind: int, nadm: int, npreempt: int, done: int, tokens: int, dump: tuple[int, int], evs: int, tok_end: int,
    ret0: int, fin0: int, pf_tok: int, dc_tok: int, full: int, ql: int, ratio: float,
) -> None:  # fmt: skip
    """The step's row of SGLang's step log."""
    kv = DL
    for x in range(ne):
        kv += held(R[G_PROG, elist[x]], B)
    lg[L_KIND, col] = kind if tokens > 0 else K_IDLE
    lg[L_NADM, col] = nadm
    lg[L_NRET, col] = npreempt
    lg[L_NFIN, col] = done
    if kind == K_DECODE:
        lg[L_NTOK, col] = -dump[1] - 1  # a batch dump at L_TOKOFF, one token each
        lg[L_TOKOFF, col] = dump[0]
    else:
        lg[L_NTOK, col] = (tok_end - evs) // 2  # (request, tokens) pairs; the admitted last
        lg[L_TOKOFF, col] = evs
    lg[L_RET, col] = ret0
    lg[L_FIN, col] = fin0
    lg[L_PF, col] = pf_tok
    lg[L_DC, col] = dc_tok
    lg[L_KV, col] = kv
    lg[L_FULL, col] = full
    lg[L_QUEUE, col] = ql
    lr[col] = ratio


@_njit(cache=True)
def run_sglang(
    cfg: np.ndarray, fcfg: np.ndarray, plan: tuple, tabs: tuple, st: np.ndarray, fs: np.ndarray, out: np.ndarray,
    bins: tuple, log: tuple,
) -> int:  # fmt: skip
    """Run slots ``st[ST_T]`` … ``cfg[C_T_END] − 1`` of the ``sglang`` rule (fewer on a drain, a
    violation, or a full log buffer); returns a status code.  ``cfg`` holds the run's settings
    (``C_*``), ``fcfg`` the ratio's knobs (``FC_*``), ``plan`` is ``(pslot, ps, po)``, ``tabs``
    the request table and its indices ``(R, qbuf, elist, hk, hid, ck, cid, ph, cnt, chain)``,
    ``fs`` the float state.  ``out`` of positive width receives the ``SimResult`` rows at column
    ``t − t_base``; ``bins`` = ``(bins1, bins2, bp)`` with ``bp[BP_ON]`` the streamed batch-means
    sums; ``log`` = ``(lg, lr, ev)`` with ``lg`` of positive width the step log (every slot is
    then run one by one).

    A slot reads: a quiet stretch skipped in closed form, or in full — arrivals, the decision
    (batch order, the chunked requests' chunks, the walk over the queue), then a prefill step, a
    decode step (retracting if it does not fit) or an idle one, the limits, release, the record."""
    life, M, chunk, B = cfg[C_LIFE], cfg[C_M], cfg[C_CHUNK], cfg[C_B]
    budget, maxseq, mpt, clip, rds = cfg[C_BUDGET], cfg[C_MAXSEQ], cfg[C_MPT], cfg[C_CLIP], cfg[C_RDS]
    check, t_end, drain, drain_min, t_base = (
        cfg[C_CHECK] != 0,
        cfg[C_T_END],
        cfg[C_DRAIN] != 0,
        cfg[C_DRAIN_MIN],
        cfg[C_T_BASE],
    )
    k = (life, M, chunk, B, budget, maxseq, mpt, clip, rds, check, drain, drain_min)
    fk = (fcfg[FC_INIT], fcfg[FC_MIN], fcfg[FC_DECAY])
    r_init, r_min, r_decay = fk
    pslot, ps, po = plan
    R, qbuf, elist, hk, hid, ck, cid, ph, cnt, chain = tabs
    bins1, bins2, bp = bins
    lg, lr, ev = log
    n = pslot.shape[0]
    rows = out.shape[1] > 0
    logging = lg.shape[1] > 0
    binned = bp[BP_ON] != 0
    bq = _bins_of(bp)
    Rc = R[C_SHIFT:]  # the clip heap's positions (row G_CPOS) at the heap functions' F_HPOS
    pchunk = held(chunk, B)  # SGLang's chunk budget is whole pages
    t = st[ST_T]
    q = (st[ST_I], st[ST_QH], st[ST_QL])
    a = (st[ST_NA], st[ST_AH], st[ST_AT], st[ST_NE])
    lz = (st[ST_NL], st[ST_DL], st[ST_HN], st[ST_CN], st[ST_NU], st[ST_RU], st[ST_NC])
    clk = (st[ST_TAU], st[ST_W2], st[ST_CALL])
    full = st[ST_BATCH_FULL]
    rankc = st[ST_RANKC]
    memsum = st[ST_MEMSUM]
    evp = st[ST_EVP]
    bver = st[ST_BVER]
    dumpv = st[ST_DUMPV]
    dump = (st[ST_DUMPO], st[ST_DUMPL])
    ratio = fs[FS_RATIO]
    status = REACHED
    while t < t_end:
        i, qh, ql = q
        na, ah, at, ne = a
        nL = lz[0]
        tau = clk[0]
        if drain and i >= n and na == 0 and ql == 0 and t >= drain_min:
            status = DRAINED
            break
        if logging:
            coming = 0
            while i + coming < n and pslot[i + coming] <= t:
                coming += 1
            if evp + 4 * (na + ql + coming) + 8 > ev.shape[0]:
                break  # the driver empties the log buffer and calls again

        # ================= a quiet stretch (not while logging: the log has a row per step)
        if ne == 0 and not logging and (ql == 0 or (nL > 0 and full == 1)):
            te = _quiet_until(hk, ph, pslot, k, t, t_end, q, na, lz, tau, full)
            if te > t:
                L = te - t
                idle = na == 0
                DL = lz[1]
                st[ST_STRETCH] += 1
                st[ST_SKIP] += L
                st[ST_RUNSUM] += na * L
                if rows:
                    q, _ = _stretch_rows(R, qbuf, pslot, ps, po, out, q, t, te, t_base, KVSTAB_LIFE, tau, na, nL,
                                         DL, 0, False, B, ph)  # fmt: skip
                else:
                    q = _stretch_arrivals(R, qbuf, pslot, ps, po, q, te, KVSTAB_LIFE, binned, bq, bins2)
                    if binned and not idle:
                        lo = max(t, bq[6])
                        if lo < te:
                            memsum += _post_sum(
                                _dl_advance(DL, nL, tau, lo - t, B, ph), nL, lo - t + tau, te - lo, B, ph
                            )
                DL, clk, ratio, full = _skip(cnt, ph, fk, B, L, idle, nL, DL, clk, ratio, full)
                lz = (nL, DL, lz[2], lz[3], lz[4], lz[5], lz[6])
                t = te
                continue

        # ================= a full slot
        st[ST_FULL] += 1
        q, arrived = _arrivals(R, qbuf, pslot, ps, po, q, t, KVSTAB_LIFE)
        evs = evp

        # ---- the decision, as the rule computes it from the step's view
        if nL == 0:
            full = 0  # the flag is cleared when the running batch is empty
        free = M - _batch_order(R, elist, ne, lz[1], B)
        lz = _unclip(R, ck, cid, Rc, tau, clip, lz)
        nL, DL, hn, cn, nu, ru, nc = lz
        off = (0 if nL == 0 else 1, 0.0, 0, 0)  # total_offset: see _offset_lt
        rsx = ratio * float(ru - nu * tau + clip * nc) if nL > 0 else 0.0
        bud = (0, pchunk, mpt, 0, 0, False, False)
        off, bud = _chunked(R, elist, chain, st, ne, free, rsx, nL, off, bud, ah, tau, clip, ratio, B)
        set_full = False
        nadm = 0
        if ne > 0 or full == 0:  # the walk over the queue: while a chunk is in flight, or the flag is clear
            off, bud, nadm, set_full = _walk(R, qbuf, chain, st, q, na, free, rsx, nL, off, bud, ah, tau, clip,
                                             ratio, B, maxseq)  # fmt: skip
        continuing, fin_pf = bud[5], bud[6]

        # ---- apply the decision: a prefill step, a decode step (with retraction), or idle
        npreempt = 0
        step_wasted = 0
        leaves = False
        tokens = 0
        memory = 0
        pf_tok = 0
        dc_tok = 0
        nres = -1
        ret0 = evp
        tok_end = evp
        if bud[4] > 0:
            kind = K_PREFILL
            leaves = continuing or fin_pf or nL == 0
            q, a, rankc, evp, tokens, memory = _prefill(R, qbuf, elist, ev, st, t, chunk, B, logging, nadm, q, a,
                                                        rankc, evp, DL)  # fmt: skip
            tok_end = evp
            if nadm > 0:
                bver += 1
            pf_tok = tokens
            running = a[0]
        elif nL > 0:
            kind = K_DECODE
            post = _lazy_post(DL, nL, tau, B, ph)
            if post > M:
                q, a, lz, ratio, npreempt, step_wasted, evp, nres = _retract(tabs, st, ev, k, t, q, a, lz, clk,
                                                                            logging, evp)  # fmt: skip
                leaves = True
                bver += 1
                nL, DL = lz[0], lz[1]
                post = _lazy_post(DL, nL, tau, B, ph)
            else:
                x = ratio - r_decay
                ratio = r_min if r_min > x else x
            if logging and (nres >= 0 or bver != dumpv):
                dumpo = evp
                evp = _batch_dump(R, chain, ev, a[1], nres, evp)
                dump = (dumpo, evp - dumpo)
                dumpv = bver
            tokens = nL
            dc_tok = nL
            memory = post
            lz = (nL, post, lz[2], lz[3], lz[4], lz[5], lz[6])
            clk = (tau + 1, clk[1], clk[2])
            running = a[0]
        else:
            kind = K_IDLE
            running = 0
            if q[2] == 0:
                ratio = r_init  # an idle step resets the ratio (on_idle)

        if check and _violated(st, t, memory, M, a[0], maxseq, tokens, budget):
            status = VIOLATION
            break

        # ---- the slot ends: its τ is counted, the finished leave, finished prefills join the lazy set
        tau = clk[0]
        clk = (tau, clk[1] + tau, clk[2])
        cnt[tau % B] += 1
        fin0 = evp
        a, lz, done, decoded, evp = _release(tabs, ev, t, B, clip, kind == K_DECODE, logging, a, lz, clk, evp)
        leaves = leaves or decoded > 0
        if done > 0:
            bver += 1
        if nres >= 0:
            ah, at, rankc = _resort(R, chain, nres)
            a = (a[0], ah, at, a[3])
        full = 0 if leaves else (1 if set_full else full)

        memsum = _record(out, rows, t, t_base, arrived, nadm, npreempt, done, running, memory, step_wasted, tokens,
                         q[2], binned, bq, bins1, bins2, memsum)  # fmt: skip
        if logging:
            _log_row(R, elist, lg, lr, t - t_base, B, lz[1], a[3], kind, nadm, npreempt, done, tokens, dump, evs,
                     tok_end, ret0, fin0, pf_tok, dc_tok, full, q[2], ratio)  # fmt: skip
        st[ST_DONE] += done
        st[ST_RUNSUM] += running
        t += 1

    st[ST_T] = t
    st[ST_I], st[ST_QH], st[ST_QL] = q
    st[ST_NA], st[ST_AH], st[ST_AT], st[ST_NE] = a
    st[ST_NL], st[ST_DL], st[ST_HN], st[ST_CN], st[ST_NU], st[ST_RU], st[ST_NC] = lz
    st[ST_TAU], st[ST_W2], st[ST_CALL] = clk
    st[ST_BATCH_FULL] = full
    st[ST_RANKC] = rankc
    st[ST_MEMSUM] = memsum
    st[ST_EVP] = evp
    st[ST_BVER] = bver
    st[ST_DUMPV] = dumpv
    st[ST_DUMPO], st[ST_DUMPL] = dump
    fs[FS_RATIO] = ratio
    return status


__all__ = ["run_sglang", "sync_lazy", "active_ids", "WORK", "NG", "ST_SIZE", "NLOG", "_FAR"]
