"""The compiled engine of the built-in ``sglang`` rule (numba; plain Python without numba).

:func:`run_sglang` is :meth:`kvstab.simulator.Engine.step` for
:class:`kvstab.schedulers.sglang.Sglang` (its decision, and the engine around it)
under three request lifecycles — kvstab's (a victim restarts at the queue head),
vLLM's (it resumes as ``(p + 1, s + o − p − 1)`` at the head) and SGLang's
(it resumes so at the queue *tail*, in retraction order, the kept batch re-sorted;
:mod:`kvstab.lifecycles.sglang`) — and writes what the reference engine
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
from kvstab.engine import _skeleton as S_
from kvstab.engine._kernel import (
    _FAR,
    _dl_advance,
    _explicit_add,
    _explicit_drop,
    _finish,
    _heap_push,
    _heap_remove,
    _lazy_post,
    _link,
    _lose,
    _njit,
    _overflow,
    _quiet_rows,
    _quiet_skip,
    _unlink,
    active_ids,
    held,
)
from kvstab.engine._layout import (  # noqa: F401 - sglang.py and the tests read the layout here too
    BP_ON,
    C_CLIP,
    C_LIFE,
    C_MPT,
    C_RDS,
    C_SHIFT,
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
    G_PS,
    G_RANK,
    G_RECOMP,
    G_S,
    G_SERVED,
    G_TB,
    G_W2S,
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
    M_LAZY,
    M_OUT,
    NG,
    NLOG,
    REACHED,
    SGLANG_LIFE,
    ST_ADMIT,
    ST_AH,
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
    ST_NC,
    ST_NL,
    ST_NU,
    ST_PREEMPT,
    ST_RANKC,
    ST_RETRACT,
    ST_RU,
    ST_RUNSUM,
    ST_SIZE,
    ST_T,
    ST_TAU,
    ST_W2,
    VIOLATION,
    VLLM_LIFE,
)

#: the text of ``_kernel.py`` this file was last compiled with (a prefix of its sha256).
#: numba keys a cached function by the text of its own file only, and this kernel inlines
#: ``_kernel``'s helpers (the lazy decoders, the heap): after they change, a cached
#: ``run_sglang`` would keep the old copies.  A test holds this to ``_kernel.py``'s hash
#: (``sha256sum kvstab/engine/_kernel.py | cut -c1-16``), and changing it here changes this
#: file's text, so the cache is rebuilt.
KERNEL_SHA = "63df08f27204389a"
#: the same for ``_layout.py``, whose indices numba compiles into the kernel as constants
LAYOUT_SHA = "14a0a08f1956fdd1"
#: the same for ``_skeleton.py`` (the loop around the decision, inlined)
SKELETON_SHA = "2d60ea0633aae12c"
GUARDS = (("_kernel.py", KERNEL_SHA), ("_layout.py", LAYOUT_SHA), ("_skeleton.py", SKELETON_SHA))
_L.warn_if_stale(__name__, GUARDS)

#: the work counters a run reports (name, index into ``st``)
WORK = S_.WORK + (
    ("retraction_steps", ST_RETRACT),
    ("completions", ST_DONE),
    ("exact_sums", ST_EXACT),
    ("request_slots", ST_RUNSUM),
)

#: the fields of ``st`` this kernel alone keeps, as :func:`run_sglang` stores them
OWN = (ST_CN, ST_NU, ST_RU, ST_NC, ST_TAU, ST_W2, ST_CALL, ST_BATCH_FULL, ST_RANKC, ST_EVP, ST_BVER, ST_DUMPV, ST_DUMPO,
       ST_DUMPL)  # fmt: skip

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
    hn = _heap_push(hk, hid, R, key, r, hn)
    if key - tau > clip:
        R[G_CLIP, r] = 1
        cn = _heap_push(ck, cid, Rc, key, r, cn)
        nc += 1
    else:
        R[G_CLIP, r] = 0
        nu += 1
        ru += key
    return nL + 1, DL + held(p, B), hn, cn, nu, ru, nc


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


@_njit(cache=True, inline="always")
def _offset_lt(
    A: int, mode: int, free: int, summ: int, tof: float, rsx: float, nL: int, k: int, R: np.ndarray, ah: int,
    tau: int, clip: int, ratio: float, chain: np.ndarray, st: np.ndarray,
) -> tuple[bool, int, float]:  # fmt: skip
    """Whether ``A < free − total_offset``, by the offset's mode: exact integers (0), the
    aggregate with its rounding bound (1: a test within the bound switches to 2), Python's float
    sum ``tof`` (2).  Returns the answer, the mode and ``tof``."""
    while True:
        if mode == 0:
            return A < free - summ, mode, tof
        if mode == 2:
            return A < float(free) - tof, mode, tof
        Z = float(free - summ) - rsx
        E = _U2 * (nL + k + 8) * (abs(free) + rsx + summ + 1.0)
        if A < Z - E:
            return True, mode, tof
        if A > Z + E:
            return False, mode, tof
        tof = _exact_offset(R, ah, tau, clip, ratio, chain, k)
        mode = 2
        st[ST_EXACT] += 1


@_njit(cache=True, inline="always")
def _quiet_until(
    M: int, B: int, budget: int, maxseq: int, check: bool, t: int, t_end: int, drain: bool, drain_min: int, i: int,
    pslot: np.ndarray, ql: int, na: int, full: int, hk: np.ndarray, hn: int, ph: np.ndarray, tau: int, nL: int, DL: int,
) -> int:  # fmt: skip
    """The end of a quiet stretch from slot ``t`` (``t``: none, the slot is full)."""
    n = pslot.shape[0]
    te = t_end
    idle = na == 0
    if ql == 0 and i < n and pslot[i] < te and (idle or full == 0):
        te = pslot[i]  # an arrival into an empty queue is walked in its slot
    if drain and i >= n and t < drain_min < te:
        te = drain_min
    if not idle:
        # decode steps, each moving τ on by one: slot t + j ends with τ + j + 1
        if hn > 0 and hk[0] - tau - 1 < te - t:
            te = t + hk[0] - tau - 1  # a completion clears the flag (the queue is walked next)
        if te > t:
            te = t + _overflow(DL, nL, tau, tau + te - t, M, B, ph) - tau  # a retraction
        if check and ((budget >= 0 and nL > budget) or (maxseq >= 0 and na > maxseq)):
            te = t
    return te


@_njit(cache=True, inline="always")
def _quiet_steps(
    L: int, idle: bool, B: int, r_init: float, r_min: float, r_decay: float, ratio: float, full: int, w2: int,
    call: int, tau: int, nL: int, DL: int, ph: np.ndarray, cnt: np.ndarray,
) -> tuple[float, int, int, int, int, int]:  # fmt: skip
    """The ``L`` steps of a quiet stretch: idle (the first resets the ratio, the rest change
    nothing) or decode steps (τ moves on, the ratio decays).  Returns ``ratio``, ``full``,
    ``w2``, ``call``, ``tau`` and ``DL``."""
    if idle:
        ratio = r_init
        full = 0
        w2 += L * tau
        cnt[tau % B] += L
    else:
        DL = _dl_advance(DL, nL, tau, L, B, ph)
        w2 += L * tau + L * (L + 1) // 2
        q = L // B
        call += q
        for j in range(q * B + 1, L + 1):
            cnt[(tau + j) % B] += 1
        tau += L
        for _ in range(L):  # the decay, one float operation a step, until its floor holds
            x = ratio - r_decay
            nxt = r_min if r_min > x else x
            if nxt == ratio:
                break
            ratio = nxt
    return ratio, full, w2, call, tau, DL


@_njit(cache=True, inline="always")
def _batch_used(B: int, ne: int, elist: np.ndarray, R: np.ndarray, DL: int) -> int:
    """Sort the explicit requests (prefilling) into batch order; returns the memory in use."""
    for a in range(1, ne):
        r = elist[a]
        b = a - 1
        while b >= 0 and R[G_RANK, elist[b]] > R[G_RANK, r]:
            elist[b + 1] = elist[b]
            b -= 1
        elist[b + 1] = r
    used = DL
    for a in range(ne):
        r = elist[a]
        R[G_EPOS, r] = a
        used += held(R[G_PROG, r], B)
    return used


@_njit(cache=True, inline="always")
def _extend(
    B: int, ext: int, mnr: int, chain: np.ndarray, k: int, summ: int, tof: float, cur_off: int, rem_chunk: int,
    rem_input: int,
) -> tuple[int, int, float, int, int, int]:  # fmt: skip
    """An extension of ``ext`` tokens joins the step (a chunk continued or a request admitted):
    ``ext + B + mnr`` is added to total_offset (``chain[k]``, its integer sum ``summ``, Python's
    float sum ``tof``) and to the current offset, ``ext`` is spent from the chunk and input budgets.
    Returns ``k``, ``summ``, ``tof``, ``cur_off``, ``rem_chunk`` and ``rem_input``."""
    m = ext + B + mnr
    chain[k] = m
    return k + 1, summ + m, tof + float(m), cur_off + ext + B, rem_chunk - ext, rem_input - ext


@_njit(cache=True, inline="always")
def _chunked_walk(
    B: int, clip: int, pchunk: int, mpt: int, free: int, mode: int, rsx: float, nL: int, ne: int, ah: int, tau: int,
    ratio: float, elist: np.ndarray, R: np.ndarray, chain: np.ndarray, st: np.ndarray,
) -> tuple[int, float, int, int, int, int, int, int, bool, int, bool]:  # fmt: skip
    """The chunked requests' grants (batch order), each adding to total_offset.  Returns the
    offset's mode, ``tof``, its integer sum, the additions, the current offset, the chunk and
    input budgets left, the memory reserved, whether a chunk continues, the batch's size, and
    whether a prefill finishes."""
    tof = 0.0
    summ = 0  # Σ of this step's integer additions to total_offset
    k = 0
    cur_off = 0
    rem_chunk = pchunk
    rem_input = mpt
    reserved = 0
    continuing = False
    in_batch = 0
    fin_pf = False
    for a in range(ne):
        r = elist[a]
        p = R[G_PROG, r]
        cand = R[G_S, r] - p
        # limited = min(rem_chunk, floor(free − total_offset))
        while True:
            if mode == 0:
                limited = min(rem_chunk, free - summ)
                break
            if mode == 2:
                limited = min(rem_chunk, int(math.floor(float(free) - tof)))
                break
            Z = float(free - summ) - rsx
            E = _U2 * (nL + k + 8) * (abs(free) + rsx + summ + 1.0)
            if Z - E >= rem_chunk:
                limited = rem_chunk
                break
            f1 = int(math.floor(Z - E))
            if f1 == int(math.floor(Z + E)):
                limited = min(rem_chunk, f1)
                break
            tof = _exact_offset(R, ah, tau, clip, ratio, chain, k)
            mode = 2
            st[ST_EXACT] += 1
        allow = rem_chunk if limited <= 0 else limited
        room = held(p, B) - p + max(free - reserved, 0) // B * B
        allow = max(0, min(allow, room))
        new_len = min(cand, allow)
        truncated = new_len < cand
        mnr = 0 if truncated else min(R[G_O, r] + 1 + R[G_PRIOR, r], clip)
        R[G_GRANT, r] = new_len
        ext = held(new_len, B)
        k, summ, tof, cur_off, rem_chunk, rem_input = _extend(B, ext, mnr, chain, k, summ, tof, cur_off, rem_chunk,
                                                              rem_input)  # fmt: skip
        reserved += held(p + new_len, B) - held(p, B)
        in_batch += 1
        continuing = continuing or truncated
        fin_pf = fin_pf or (not truncated and R[G_O, r] == 0)
    return mode, tof, summ, k, cur_off, rem_chunk, rem_input, reserved, continuing, in_batch, fin_pf


@_njit(cache=True, inline="always")
def _queue_walk(
    B: int, clip: int, maxseq: int, free: int, rsx: float, nL: int, na: int, ah: int, tau: int, ratio: float,
    qh: int, ql: int, qbuf: np.ndarray, R: np.ndarray, chain: np.ndarray, st: np.ndarray, mode: int, tof: float,
    summ: int, k: int, cur_off: int, rem_chunk: int, rem_input: int, reserved: int, continuing: bool, in_batch: int,
    fin_pf: bool,
) -> tuple[int, bool, bool, int, bool]:  # fmt: skip
    """The walk over the queue (while a chunk is in flight, or the flag is clear): the head is
    admitted while it fits.  Returns the admitted, whether the flag is set, whether a chunk
    continues, the batch's size and whether a prefill finishes."""
    cap = qbuf.shape[0]
    set_full = False
    nadm = 0
    empty = na == 0
    while nadm < ql:
        w = qbuf[(qh + nadm) % cap]
        sw = R[G_S, w]
        ow = R[G_O, w]
        if rem_input <= 0 or rem_chunk <= 0:
            # budget_state: no memory (V <= 0) comes before a spent budget
            pos, mode, tof = _offset_lt(0, mode, free, summ, tof, rsx, nL, k, R, ah, tau, clip, ratio, chain, st)
            if pos:
                break  # the budget is spent and memory is left: stop, the flag untouched
        if maxseq >= 0 and maxseq <= nL + in_batch:
            set_full = True
            break
        A = sw + min(ow + 1, clip) + B
        if empty and in_batch == 0:
            fits = True  # the empty system admits its head (the rule's one deviation)
        else:
            fits, mode, tof = _offset_lt(A, mode, free, summ, tof, rsx, nL, k, R, ah, tau, clip, ratio, chain, st)
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
        k, summ, tof, cur_off, rem_chunk, rem_input = _extend(B, ext, mnr, chain, k, summ, tof, cur_off, rem_chunk,
                                                              rem_input)  # fmt: skip
        reserved += ext
        in_batch += 1
        continuing = continuing or not whole
        fin_pf = fin_pf or (whole and ow == 0)
        R[G_GRANT, w] = ext_raw
        nadm += 1
        # after an admission: no memory left stops the walk (and sets the flag)
        pos, mode, tof = _offset_lt(0, mode, free, summ, tof, rsx, nL, k, R, ah, tau, clip, ratio, chain, st)
        if not pos or free - cur_off <= 0:
            set_full = True
            break
        if rem_input <= 0 or rem_chunk <= 0:
            break
    return nadm, set_full, continuing, in_batch, fin_pf


@_njit(cache=True, inline="always")
def _decide(
    M: int, B: int, clip: int, maxseq: int, pchunk: int, mpt: int, full: int, ratio: float, tau: int, nL: int,
    na: int, ne: int, ah: int, qh: int, ql: int, nc: int, nu: int, ru: int, DL: int, elist: np.ndarray, qbuf: np.ndarray,
    R: np.ndarray, chain: np.ndarray, st: np.ndarray,
) -> tuple[int, bool, bool, int, bool]:  # fmt: skip
    """The decision, as the rule computes it from the step's view: the chunked requests' grants,
    then the walk over the queue (while a chunk is in flight, or the flag is clear).  Returns the
    admitted, whether the flag is set, whether a chunk continues, the batch's size and whether a
    prefill finishes."""
    free = M - _batch_used(B, ne, elist, R, DL)  # explicit requests (prefilling) in batch order
    # total_offset: int 0 with nothing decoding (mode 0), else the aggregate (mode 1) or
    # Python's float sum (mode 2, once a test fell within the rounding bound)
    mode = 0 if nL == 0 else 1
    rsx = ratio * float(ru - nu * tau + clip * nc) if nL > 0 else 0.0
    mode, tof, summ, k, cur_off, rem_chunk, rem_input, reserved, continuing, in_batch, fin_pf = _chunked_walk(
        B, clip, pchunk, mpt, free, mode, rsx, nL, ne, ah, tau, ratio, elist, R, chain, st
    )  # fmt: skip
    if ne > 0 or full == 0:
        return _queue_walk(
            B, clip, maxseq, free, rsx, nL, na, ah, tau, ratio, qh, ql, qbuf, R, chain, st, mode, tof, summ, k,
            cur_off, rem_chunk, rem_input, reserved, continuing, in_batch, fin_pf,
        )  # fmt: skip
    return 0, False, continuing, in_batch, fin_pf


@_njit(cache=True, inline="always")
def _prefill(
    t: int, chunk: int, B: int, logging: bool, nadm: int, qh: int, ql: int, ah: int, at: int, na: int, ne: int,
    rankc: int, evp: int, qbuf: np.ndarray, elist: np.ndarray, R: np.ndarray, ev: np.ndarray, st: np.ndarray,
) -> tuple[int, int, int, int, int, int, int, int, int]:  # fmt: skip
    """A prefill step's work: the chunked requests (batch order), then the ``nadm`` admitted,
    popped from the queue head.  Returns the tokens, then ``qh``, ``ql``, ``ah``, ``at``, ``na``,
    ``ne``, ``rankc`` and ``evp``."""
    cap = qbuf.shape[0]
    tokens = 0
    for a in range(ne):
        r = elist[a]
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
        ah, at = _link(R, r, ah, at)
        R[G_RANK, r] = rankc
        rankc += 1
        na += 1
        ne = _explicit_add(R, G_EPOS, elist, r, ne)
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
    return tokens, qh, ql, ah, at, na, ne, rankc, evp


@_njit(cache=True, inline="always")
def _prefill_memory(B: int, ne: int, elist: np.ndarray, R: np.ndarray, DL: int, st: np.ndarray) -> int:
    """The memory held after a prefill step (the explicit requests' areas grow by it)."""
    st[ST_EXPL] += ne
    memory = DL
    for a in range(ne):
        r = elist[a]
        h = held(R[G_PROG, r], B)
        R[G_ATT, r] += h
        R[G_SERVED, r] += h
        memory += h
    return memory


# ``_nrt=True`` said outright: a callee takes its caller's setting unless it sets its own, and
# this one allocates, called from a loop compiled without reference counting.
@_njit(cache=True, _nrt=True)
def _retract(
    life: int, M: int, B: int, rds: int, logging: bool, t: int, tau: int, w2: int, call: int, R: np.ndarray,
    hk: np.ndarray, hid: np.ndarray, ck: np.ndarray, cid: np.ndarray, Rc: np.ndarray, ph: np.ndarray,
    cnt: np.ndarray, qbuf: np.ndarray, chain: np.ndarray, ev: np.ndarray, st: np.ndarray, qh: int, ql: int, ah: int,
    at: int, na: int, nL: int, DL: int, hn: int, cn: int, nu: int, ru: int, nc: int, evp: int,
) -> tuple[float, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int]:  # fmt: skip
    """A retraction (schedule_batch.py retract_decode): a pass over the batch.  A function of its
    own (not inlined): it is rare, and it allocates, which the loop (compiled without reference
    counting) may not.  Returns the new ratio, the victims, the area wasted, the kept batch's
    size in ``chain`` (SGLang's lifecycle: re-sorted), then ``qh``, ``ql``, ``ah``, ``at``,
    ``na``, ``nL``, ``DL``, ``hn``, ``cn``, ``nu``, ``ru``, ``nc`` and ``evp``."""
    cap = qbuf.shape[0]
    resume = life != KVSTAB_LIFE
    npreempt = 0
    step_wasted = 0
    nres = 0
    st[ST_RETRACT] += 1
    cntb = na
    ids = np.empty(cntb, dtype=np.int64)
    r = ah
    for a in range(cntb):
        ids[a] = r
        r = R[G_NXT, r]
    outs = np.empty(cntb, dtype=np.int64)
    prompts = np.empty(cntb, dtype=np.int64)
    weight = np.empty(cntb, dtype=np.int64)
    total = 0
    for a in range(cntb):
        r = ids[a]
        p = R[G_D, r] + tau
        outs[a] = p - R[G_S, r] + 1 + R[G_PRIOR, r]
        prompts[a] = R[G_S, r] - R[G_PRIOR, r]
        weight[a] = held(p + 1, B)  # what it holds after a decode step: held + need
        total += weight[a]
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
    for a in range(cntb):
        if not popped[a]:
            r = ids[a]
            n_kept += 1
            sum_out += outs[a]
            sum_max += R[G_O, r] + 1 + R[G_PRIOR, r]
    est = float(sum_out + rds * n_kept) / float(sum_max + 1)
    ratio = est if est < 1.0 else 1.0
    # the victims, batch order: they lose their memory (and progress, or resume later)
    for a in range(cntb):
        if not popped[a]:
            continue
        r = ids[a]
        p, nL, DL, hn, cn, nu, ru, nc = _lazy_leave(
            R, hk, hid, ck, cid, Rc, ph, cnt, r, t, tau, w2, call, B, nL, DL, hn, cn, nu, ru, nc
        )
        ah, at = _unlink(R, r, ah, at)
        na -= 1
        if resume:
            R[G_RECOMP, r] += p
            R[G_PRIOR, r] += p - R[G_S, r] + 1
            R[G_O, r] = R[G_S, r] + R[G_O, r] - p - 1
            R[G_S, r] = p + 1
        step_wasted += _lose(R, r)
        npreempt += 1
    if life == SGLANG_LIFE:
        # to the queue's tail in retraction order
        for a in range(cntb):
            b = order[a]
            if popped[b]:
                qbuf[(qh + ql) % cap] = ids[b]
                ql += 1
                if logging:
                    ev[evp] = ids[b]
                    evp += 1
        # the kept batch is re-sorted (most outputs first, then the shorter original prompt,
        # then batch order: the retraction order reversed) once the finished have left
        for a in range(cntb - 1, -1, -1):
            b = order[a]
            if not popped[b]:
                chain[nres] = ids[b]
                nres += 1
    else:
        # to the queue's head, the oldest first
        for a in range(cntb - 1, -1, -1):
            if popped[a]:
                qh = (qh - 1) % cap
                qbuf[qh] = ids[a]
                ql += 1
    st[ST_PREEMPT] += npreempt
    return ratio, npreempt, step_wasted, nres, qh, ql, ah, at, na, nL, DL, hn, cn, nu, ru, nc, evp


@_njit(cache=True, inline="always")
def _slot_end(
    t: int, tau: int, w2: int, call: int, B: int, clip: int, logging: bool, decode: bool, R: np.ndarray,
    hk: np.ndarray, hid: np.ndarray, ck: np.ndarray, cid: np.ndarray, Rc: np.ndarray, ph: np.ndarray,
    cnt: np.ndarray, elist: np.ndarray, ev: np.ndarray, ne: int, ah: int, at: int, na: int, nL: int, DL: int, hn: int,
    cn: int, nu: int, ru: int, nc: int, evp: int,
) -> tuple[int, bool, int, int, int, int, int, int, int, int, int, int, int, int]:  # fmt: skip
    """The finished leave at the end of the slot (the lazy set's after a decode step, then the
    explicit ones), finished prefills join the lazy set; with ``logging`` the finished are
    logged in batch order.  Returns the finished, whether a decoder finished, then ``ne``,
    ``ah``, ``at``, ``na``, ``nL``, ``DL``, ``hn``, ``cn``, ``nu``, ``ru``, ``nc`` and ``evp``."""
    fin0 = evp
    done = 0
    left = False
    while hn > 0 and hk[0] == tau and decode:
        r = hid[0]
        _, nL, DL, hn, cn, nu, ru, nc = _lazy_leave(
            R, hk, hid, ck, cid, Rc, ph, cnt, r, t + 1, tau, w2, call, B, nL, DL, hn, cn, nu, ru, nc
        )
        ah, at = _finish(R, r, t, ah, at)
        na -= 1
        done += 1
        left = True
        if logging:
            ev[evp] = r
            evp += 1
    for a in range(ne - 1, -1, -1):
        r = elist[a]
        p = R[G_PROG, r]
        sr = R[G_S, r]
        finished = p >= sr + R[G_O, r]
        if finished or p >= sr:
            ne = _explicit_drop(R, G_EPOS, elist, a, ne)
            if finished:
                ah, at = _finish(R, r, t, ah, at)
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
        for a in range(fin0 + 1, evp):
            r = ev[a]
            b = a - 1
            while b >= fin0 and R[G_RANK, ev[b]] > R[G_RANK, r]:
                ev[b + 1] = ev[b]
                b -= 1
            ev[b + 1] = r
    return done, left, ne, ah, at, na, nL, DL, hn, cn, nu, ru, nc, evp


@_njit(cache=True, inline="always")
def _resort(nres: int, chain: np.ndarray, R: np.ndarray) -> tuple[int, int, int]:
    """Relink the kept batch of a retraction in its new order (``chain``), skipping the
    finished.  Returns the new head, tail and rank counter."""
    ah = -1
    at = -1
    rankc = 0
    for a in range(nres):
        r = chain[a]
        if R[G_MODE, r] == M_OUT:
            continue  # finished in this step
        ah, at = _link(R, r, ah, at)
        R[G_RANK, r] = rankc
        rankc += 1
    return ah, at, rankc


@_njit(cache=True, inline="always")
def _clip_expire(
    tau: int, clip: int, ck: np.ndarray, cid: np.ndarray, Rc: np.ndarray, R: np.ndarray, cn: int, nc: int, nu: int,
    ru: int,
) -> tuple[int, int, int, int]:  # fmt: skip
    """Decoders whose remaining outputs fell to ``clip`` leave the clip heap for the unclipped
    sums.  Returns ``cn``, ``nc``, ``nu``, ``ru``."""
    while cn > 0 and ck[0] - tau <= clip:
        r = cid[0]
        cn = _heap_remove(ck, cid, Rc, r, cn)
        R[G_CLIP, r] = 0
        nc -= 1
        nu += 1
        ru += R[G_S, r] + R[G_O, r] - R[G_D, r]
    return cn, nc, nu, ru


@_njit(cache=True, inline="always")
def _dump_batch(
    resort: bool, nres: int, ah: int, chain: np.ndarray, R: np.ndarray, ev: np.ndarray, evp: int
) -> tuple[int, int, int]:
    """Log the batch that decodes (after a retraction, in its new order): one token each.
    Returns where the dump starts, its length, and ``evp``."""
    dumpo = evp
    if resort:
        for a in range(nres):
            ev[evp] = chain[a]
            evp += 1
    else:
        r = ah
        while r >= 0:
            ev[evp] = r
            evp += 1
            r = R[G_NXT, r]
    return dumpo, evp - dumpo, evp


@_njit(cache=True, inline="always")
def _log_room(t: int, i: int, pslot: np.ndarray, na: int, ql: int, evp: int, ev: np.ndarray) -> bool:
    """Whether the log buffer has room for slot ``t``'s events."""
    n = pslot.shape[0]
    coming = 0
    while i + coming < n and pslot[i + coming] <= t:
        coming += 1
    return evp + 4 * (na + ql + coming) + 8 <= ev.shape[0]


@_njit(cache=True, inline="always")
def _log_step(
    lg: np.ndarray, lr: np.ndarray, lcol: int, B: int, ne: int, elist: np.ndarray, R: np.ndarray, DL: int,
    kind: int, tokens: int, nadm: int, npreempt: int, done: int, dumpl: int, dumpo: int, tok_end: int, evs: int,
    ret0: int, fin0: int, pf_tok: int, dc_tok: int, full: int, ql: int, ratio: float,
) -> None:  # fmt: skip
    """The step log's row for the slot at column ``lcol``."""
    kv = DL
    for a in range(ne):
        kv += held(R[G_PROG, elist[a]], B)
    lg[L_KIND, lcol] = kind if tokens > 0 else K_IDLE
    lg[L_NADM, lcol] = nadm
    lg[L_NRET, lcol] = npreempt
    lg[L_NFIN, lcol] = done
    if kind == K_DECODE:
        lg[L_NTOK, lcol] = -dumpl - 1  # a batch dump at L_TOKOFF, one token each
        lg[L_TOKOFF, lcol] = dumpo
    else:
        lg[L_NTOK, lcol] = (tok_end - evs) // 2  # (request, tokens) pairs; the admitted last
        lg[L_TOKOFF, lcol] = evs
    lg[L_RET, lcol] = ret0
    lg[L_FIN, lcol] = fin0
    lg[L_PF, lcol] = pf_tok
    lg[L_DC, lcol] = dc_tok
    lg[L_KV, lcol] = kv
    lg[L_FULL, lcol] = full
    lg[L_QUEUE, lcol] = ql
    lr[lcol] = ratio


@_njit(cache=True, inline="always")
def _knobs(cfg: np.ndarray, fcfg: np.ndarray) -> tuple[int, int, int, int, float, float, float]:
    """What this kernel reads of the settings besides every kernel's: the lifecycle, SGLang's
    ``max_prefill_tokens``, ``clip_max_new_tokens`` and ``retract_decode_steps``, then its
    ratio's initial value, floor and decay."""
    return cfg[C_LIFE], cfg[C_MPT], cfg[C_CLIP], cfg[C_RDS], fcfg[FC_INIT], fcfg[FC_MIN], fcfg[FC_DECAY]


# Without numba's reference counting (``_nrt=False``; the loop allocates nothing, a retraction's
# arrays live in :func:`_retract`): each inlined phase binds the arrays it takes to names of its
# own, and counting those references in every slot made the loop slower than one piece.
@_njit(cache=True, _nrt=False)
def run_sglang(
    cfg: np.ndarray,
    fcfg: np.ndarray,
    plan: S_.Plan,
    R: np.ndarray,
    qbuf: np.ndarray,
    elist: np.ndarray,
    hk: np.ndarray,
    hid: np.ndarray,
    ck: np.ndarray,
    cid: np.ndarray,
    ph: np.ndarray,
    cnt: np.ndarray,
    chain: np.ndarray,
    st: np.ndarray,
    fs: np.ndarray,
    out: np.ndarray,
    bins: S_.Bins,
    log: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> int:
    """Run slots ``st[ST_T]`` … ``t_end − 1`` of the ``sglang`` rule (fewer on a drain, a violation,
    or a full log buffer); returns a status code.  ``cfg`` is the run's settings record (``C_*``:
    the lifecycle ``C_LIFE``, SGLang's ``C_MPT``, ``C_CLIP``, ``C_RDS`` and the settings every
    kernel reads), ``fcfg`` its ratio knobs (``FC_*``), ``plan`` the requests' arrival slots,
    prompts and outputs.  ``out`` of positive width receives the ``SimResult`` rows at column
    ``t − t_base``; ``bins`` (with ``bp[BP_ON]``) the streamed batch-means sums; ``log``'s ``lg``
    of positive width the step log (its ratios ``lr``, its events ``ev``; every slot is then run
    one by one)."""
    M, chunk, B, budget, maxseq, check, t_end, drain, drain_min, t_base = S_.settings(cfg)
    pslot, ps, po = plan
    bins1, bins2, bp = bins
    lg, lr, ev = log
    life, mpt, clip, rds, r_init, r_min, r_decay = _knobs(cfg, fcfg)
    n = pslot.shape[0]
    rows = out.shape[1] > 0
    logging = lg.shape[1] > 0
    binned, b1f, b1s, b1n, b2f, b2s, b2n, mstart = S_.bin_params(bp)
    Rc = R[C_SHIFT:]  # the clip heap's positions (row G_CPOS) at the heap functions' F_HPOS
    pchunk = held(chunk, B)  # SGLang's chunk budget is whole pages
    t, i, qh, ql, na, ah, at, nL, DL, ne, hn, memsum = S_.load_state(st)
    cn = st[ST_CN]
    nu = st[ST_NU]
    ru = st[ST_RU]
    nc = st[ST_NC]
    tau = st[ST_TAU]
    w2 = st[ST_W2]
    call = st[ST_CALL]
    full = st[ST_BATCH_FULL]
    rankc = st[ST_RANKC]
    evp = st[ST_EVP]
    bver = st[ST_BVER]
    dumpv = st[ST_DUMPV]
    dumpo = st[ST_DUMPO]
    dumpl = st[ST_DUMPL]
    ratio = fs[FS_RATIO]
    status = REACHED
    while t < t_end:
        if S_.drained(drain, drain_min, t, i, n, na, ql):
            status = DRAINED
            break
        if logging and not _log_room(t, i, pslot, na, ql, evp, ev):
            break  # the driver empties the log buffer and calls again

        # ================= a quiet stretch (not while logging: the log has a row per step)
        if ne == 0 and not logging and (ql == 0 or (nL > 0 and full == 1)):
            te = _quiet_until(
                M, B, budget, maxseq, check, t, t_end, drain, drain_min, i, pslot, ql, na, full, hk, hn, ph, tau, nL, DL
            )  # fmt: skip
            if te > t:
                L = te - t
                idle = na == 0
                S_.count_stretch(st, L, na)
                if rows:  # the lazy set's memory is moved on by the steps below
                    i, ql, _ = _quiet_rows(
                        t, te, tau, t_base, False, 0, B, i, pslot, ps, po, R, qbuf, qh, ql, ph, na, nL, 0, DL, out
                    )  # fmt: skip
                else:
                    i, ql, memsum = _quiet_skip(
                        t, te, tau, 0, B, i, pslot, ps, po, R, qbuf, qh, ql, ph, nL, DL, binned, binned and not idle,
                        b2f, b2s, b2n, bins2, mstart, memsum,
                    )  # fmt: skip
                ratio, full, w2, call, tau, DL = _quiet_steps(
                    L, idle, B, r_init, r_min, r_decay, ratio, full, w2, call, tau, nL, DL, ph, cnt
                )  # fmt: skip
                t = te
                continue

        # ================= a full slot
        st[ST_FULL] += 1
        i, ql, arrived = S_.arrivals(t, i, pslot, ps, po, 0, R, qbuf, qh, ql)
        evs = evp
        lcol = t - t_base

        # ---- the decision, as the rule computes it from the step's view
        if nL == 0:
            full = 0  # the flag is cleared when the running batch is empty
        cn, nc, nu, ru = _clip_expire(tau, clip, ck, cid, Rc, R, cn, nc, nu, ru)
        nadm, set_full, continuing, in_batch, fin_pf = _decide(
            M, B, clip, maxseq, pchunk, mpt, full, ratio, tau, nL, na, ne, ah, qh, ql, nc, nu, ru, DL, elist, qbuf, R,
            chain, st,
        )  # fmt: skip

        # ---- apply the decision: a prefill step, a decode step (with retraction), or idle
        npreempt = 0
        step_wasted = 0
        leaves = False
        tokens = 0
        memory = 0
        pf_tok = 0
        dc_tok = 0
        resort = False
        nres = 0
        ret0 = evp
        tok_end = evp
        if in_batch > 0:  # a prefill step
            kind = K_PREFILL
            leaves = continuing or fin_pf or nL == 0
            tokens, qh, ql, ah, at, na, ne, rankc, evp = _prefill(
                t, chunk, B, logging, nadm, qh, ql, ah, at, na, ne, rankc, evp, qbuf, elist, R, ev, st
            )  # fmt: skip
            tok_end = evp
            if nadm > 0:
                bver += 1
            pf_tok = tokens
            memory = _prefill_memory(B, ne, elist, R, DL, st)
            running_n = na
        elif nL > 0:
            kind = K_DECODE
            post = _lazy_post(DL, nL, tau, B, ph)
            if post > M:
                ratio, npreempt, step_wasted, nres, qh, ql, ah, at, na, nL, DL, hn, cn, nu, ru, nc, evp = _retract(
                    life, M, B, rds, logging, t, tau, w2, call, R, hk, hid, ck, cid, Rc, ph, cnt, qbuf, chain, ev, st,
                    qh, ql, ah, at, na, nL, DL, hn, cn, nu, ru, nc, evp,
                )  # fmt: skip
                resort = life == SGLANG_LIFE
                leaves = True
                bver += 1
                post = _lazy_post(DL, nL, tau, B, ph)
            else:
                x = ratio - r_decay
                ratio = r_min if r_min > x else x
            if logging and (resort or bver != dumpv):  # the batch that decodes: one token each
                dumpo, dumpl, evp = _dump_batch(resort, nres, ah, chain, R, ev, evp)
                dumpv = bver
            tokens = nL
            dc_tok = nL
            memory = post
            DL = post
            tau += 1
            running_n = na
        else:
            kind = K_IDLE
            running_n = 0
            if ql == 0:
                ratio = r_init  # an idle step resets the ratio (on_idle)

        if check and S_.violated(st, t, memory, M, na, maxseq, tokens, budget):
            status = VIOLATION
            break

        # ---- the slot ends: its τ is counted, the finished leave, finished prefills join the lazy set
        w2 += tau
        cnt[tau % B] += 1
        fin0 = evp
        done, left, ne, ah, at, na, nL, DL, hn, cn, nu, ru, nc, evp = _slot_end(
            t, tau, w2, call, B, clip, logging, kind == K_DECODE, R, hk, hid, ck, cid, Rc, ph, cnt, elist, ev, ne, ah,
            at, na, nL, DL, hn, cn, nu, ru, nc, evp,
        )  # fmt: skip
        leaves = leaves or left
        if done > 0:
            bver += 1
        if resort:
            ah, at, rankc = _resort(nres, chain, R)
        full = 0 if leaves else (1 if set_full else full)

        if rows:
            S_.slot_row(out, t - t_base, arrived, nadm, npreempt, done, running_n, memory, step_wasted, tokens, ql)
        if binned:
            memsum = S_.bin_slot(t, b1f, b1s, b1n, b2f, b2s, b2n, mstart, bins1, bins2, memsum, arrived, done, memory)
        if logging:
            _log_step(
                lg, lr, lcol, B, ne, elist, R, DL, kind, tokens, nadm, npreempt, done, dumpl, dumpo, tok_end, evs, ret0,
                fin0, pf_tok, dc_tok, full, ql, ratio,
            )  # fmt: skip
        S_.count_slot(st, done, running_n)
        t += 1

    S_.store_state(st, t, i, qh, ql, na, ah, at, nL, DL, ne, hn, memsum)
    S_.put(st, OWN, (cn, nu, ru, nc, tau, w2, call, full, rankc, evp, bver, dumpv, dumpo, dumpl))
    fs[FS_RATIO] = ratio
    return status


__all__ = ["run_sglang", "sync_lazy", "active_ids", "WORK", "NG", "ST_SIZE", "NLOG", "_FAR"]
