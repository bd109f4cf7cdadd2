"""The compiled slot loop of the fast engine (numba; plain Python if numba is absent).

One function, :func:`run_slots`, runs the built-in rules slot by slot on flat
int64 arrays and returns when it reaches ``t_end``, drains, or breaks an
invariant; the Python driver (:mod:`kvstab.engine.driver`) calls it batch by
batch, so per-slot series can be streamed and a progress bar updated.

Every step mirrors :meth:`kvstab.simulator.Engine.step` for the built-in rule
selected by ``pol`` — the differential tests (``tests/test_engine_*.py``) and
``benchmarks/bench_engine.py`` hold the two to identical outputs.  What makes
it fast is not a different model but the absence of per-slot objects: no
``View``, no ``Decision``, no dictionaries, and aggregates where the rule only
needs a sum (reserved peaks), a running finish-time table for ``lookahead``
(which makes its admission test O(n) instead of O(n²)), and whole idle
stretches skipped in one jump.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:  # numba is a declared dependency; the fallback keeps the engine correct (slow) without it
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba cannot be installed
    HAVE_NUMBA = False


def _njit(**kwargs: Any) -> Any:
    """``numba.njit(**kwargs)``, or no compilation at all without numba."""
    if HAVE_NUMBA:
        return numba.njit(**kwargs)
    return lambda f: f


# rule codes (``pol``)
CURRENT_FIT = 0
NO_PREEMPT = 1
RESERVE = 2
LOOKAHEAD = 3
VLLM_V1 = 4

# lifecycle codes (``life``)
KVSTAB_LIFE = 0
VLLM_LIFE = 1

# columns of the per-slot output block
COLUMNS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "scheduled prefill_tokens decode_tokens kv_attended prefill_reqs prefill_ctx prefill_sq decode_ctx recomputed"
).split()
NCOLS = len(COLUMNS)

# indices into the scalar state array ``st``
ST_T, ST_I, ST_QH, ST_QL, ST_NA, ST_RESV = 0, 1, 2, 3, 4, 5
ST_VKIND, ST_VSLOT, ST_VVALUE, ST_VMEM = 6, 7, 8, 9
ST_SIZE = 10

# return codes
REACHED, VIOLATION, DRAINED = 0, 1, 2
# violation kinds
V_MEMORY, V_SEQS, V_BUDGET = 1, 2, 3


@_njit(cache=True, inline="always")
def held(p: int, B: int) -> int:
    """KV tokens held at progress ``p``: :func:`kvstab.model.tokens_held` on ints
    (numba cannot call the ops-generic original; ``tests/test_engine_kernel.py``
    checks the two agree)."""
    if B == 1:
        return p
    return (p + B - 1) // B * B


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


@_njit(cache=True)
def run_slots(
    pol: int,
    life: int,
    M: int,
    chunk: int,
    B: int,
    budget: int,
    maxseq: int,
    check: bool,
    comp: bool,
    t_end: int,
    drain: bool,
    drain_min: int,
    t_base: int,
    pslot: np.ndarray,
    ps: np.ndarray,
    po: np.ndarray,
    s: np.ndarray,
    o: np.ndarray,
    prog: np.ndarray,
    att: np.ndarray,
    served: np.ndarray,
    wasted: np.ndarray,
    npre: np.ndarray,
    first: np.ndarray,
    fin: np.ndarray,
    recomp: np.ndarray,
    ta: np.ndarray,
    fslot: np.ndarray,
    tf: np.ndarray,
    grant: np.ndarray,
    qbuf: np.ndarray,
    act: np.ndarray,
    st: np.ndarray,
    out: np.ndarray,
) -> int:
    """Run slots ``st[ST_T]`` … ``t_end - 1`` (fewer on a drain or a violation),
    writing slot ``t``'s row at ``out[:, t - t_base]``; returns a status code."""
    n = pslot.shape[0]
    cap = qbuf.shape[0]
    t = st[ST_T]
    i = st[ST_I]
    qh = st[ST_QH]
    ql = st[ST_QL]
    na = st[ST_NA]
    resv = st[ST_RESV]
    status = REACHED
    while t < t_end:
        if drain and i >= n and na == 0 and ql == 0 and t >= drain_min:
            status = DRAINED
            break
        if na == 0 and ql == 0 and (i >= n or pslot[i] > t):
            # an idle stretch: nothing waits, runs or arrives, so every slot up to the
            # next arrival is an all-zero row (already zero in ``out``)
            if i < n:
                nt = pslot[i]
            elif drain:
                nt = drain_min  # t < drain_min here, or the run would have drained above
            else:
                nt = t_end
            t = min(nt, t_end)
            continue
        row = t - t_base
        arrived = 0
        while i < n and pslot[i] == t:
            r = i
            s[r] = ps[i]
            o[r] = po[i] - 1 if life == VLLM_LIFE else po[i]
            qbuf[(qh + ql) % cap] = r
            ql += 1
            i += 1
            arrived += 1

        # --- the decision: victims (a suffix of the admission order) and grants
        kcut = na
        kept = 0  # post-slot memory of the survivors
        left = budget
        if pol == CURRENT_FIT or pol == NO_PREEMPT:
            prefix = 0
            for k in range(na):
                r = act[k]
                p = prog[r]
                u = min(chunk, s[r] - p) if p < s[r] else 1
                prefix += held(p + u, B)
                if pol == CURRENT_FIT and prefix > M and kcut == na:
                    kcut = k
                if kcut == na:
                    kept = prefix
            if pol == NO_PREEMPT:
                kept = prefix
        elif pol == VLLM_V1:
            prefix = 0
            for k in range(na):
                r = act[k]
                p = prog[r]
                ask = min(s[r] - p, chunk) if p < s[r] else 1
                g = ask if budget < 0 else min(ask, left)
                prefix += held(p + g, B)
                if kcut == na and prefix > M:
                    kcut = k
                if kcut == na:
                    grant[r] = g
                    kept = prefix
                    if budget >= 0:
                        left -= g
                else:
                    grant[r] = 0

        # --- preemption: lose memory and progress, back to the queue head, oldest first
        npreempt = na - kcut
        step_wasted = 0
        step_recomp = 0
        for k in range(kcut, na):
            r = act[k]
            if life == VLLM_LIFE:
                recomp[r] += prog[r]
                step_recomp += prog[r]
                if prog[r] >= s[r]:
                    ns = prog[r] + 1
                    o[r] = s[r] + o[r] - prog[r] - 1
                    s[r] = ns
            step_wasted += att[r]
            wasted[r] += att[r]
            att[r] = 0
            prog[r] = 0
            npre[r] += 1
        for k in range(na - 1, kcut - 1, -1):
            qh = (qh - 1) % cap
            qbuf[qh] = act[k]
            ql += 1
        n_before = na
        na = kcut

        # --- admission: head of line, FCFS; none in a slot that preempted
        nadmit = 0
        if npreempt == 0:
            running = n_before
            if pol == CURRENT_FIT or pol == NO_PREEMPT:
                acc = kept
                while ql > 0:
                    r = qbuf[qh]
                    after = acc + held(min(s[r], chunk), B)
                    if after > M or (maxseq >= 0 and running >= maxseq):
                        break
                    acc = after
                    qh = (qh + 1) % cap
                    ql -= 1
                    act[na] = r
                    na += 1
                    running += 1
                    nadmit += 1
            elif pol == RESERVE:
                while ql > 0:
                    r = qbuf[qh]
                    after = resv + held(s[r] + o[r], B)
                    if after > M or (maxseq >= 0 and running >= maxseq):
                        break
                    resv = after
                    qh = (qh + 1) % cap
                    ql -= 1
                    act[na] = r
                    na += 1
                    running += 1
                    nadmit += 1
            elif pol == VLLM_V1:
                used = kept
                while ql > 0:
                    r = qbuf[qh]
                    ok = used + held(s[r], B) <= M
                    if budget >= 0 and left <= 0:
                        ok = False
                    if maxseq >= 0 and running >= maxseq:
                        ok = False
                    if not ok:
                        break
                    f1 = min(s[r], chunk) if budget < 0 else min(s[r], chunk, left)
                    used += held(f1, B)
                    if budget >= 0:
                        left -= f1
                    grant[r] = f1
                    qh = (qh + 1) % cap
                    ql -= 1
                    act[na] = r
                    na += 1
                    running += 1
                    nadmit += 1
            else:  # LOOKAHEAD: projected totals at every included finish slot stay within M
                while ql > 0:
                    r = qbuf[qh]
                    if maxseq >= 0 and running >= maxseq:
                        break
                    sc = s[r]
                    oc = o[r]
                    fc = t + (sc + chunk - 1) // chunk + oc - 1
                    ok = True
                    own = _proj_held(sc, oc, t, fc, chunk, B)
                    for k in range(na):
                        q = act[k]
                        fq = fslot[q]
                        if fq >= fc:
                            own += _proj_held(s[q], o[q], ta[q], fc, chunk, B)
                        extra = _proj_held(sc, oc, t, fq, chunk, B) if fq <= fc else 0
                        if tf[q] + extra > M:
                            ok = False
                            break
                    if not ok or own > M:
                        break
                    for k in range(na):
                        q = act[k]
                        if fslot[q] <= fc:
                            tf[q] += _proj_held(sc, oc, t, fslot[q], chunk, B)
                    tf[r] = own
                    fslot[r] = fc
                    ta[r] = t
                    qh = (qh + 1) % cap
                    ql -= 1
                    act[na] = r
                    na += 1
                    running += 1
                    nadmit += 1
            for k in range(na - nadmit, na):
                r = act[k]
                if first[r] < 0:
                    first[r] = t

        # --- work: every running request advances by its grant
        tokens = 0
        memory = 0
        scheduled = 0
        pf_tok = 0
        dc_tok = 0
        kv_att = 0
        pf_reqs = 0
        pf_ctx = 0
        pf_sq = 0
        dc_ctx = 0
        for k in range(na):
            r = act[k]
            p0 = prog[r]
            u = min(chunk, s[r] - p0) if p0 < s[r] else 1
            g = u
            if pol == VLLM_V1:
                g = max(0, min(grant[r], u))
            p1 = p0 + g
            prog[r] = p1
            tokens += g
            h = held(p1, B)
            att[r] += h
            served[r] += h
            memory += h
            if comp and g > 0:
                scheduled += 1
                kv_att += p1
                if p0 < s[r]:
                    pf_tok += g
                    pf_reqs += 1
                    pf_ctx += g * p0
                    pf_sq += g * g
                else:
                    dc_tok += g
                    dc_ctx += p1

        if check:
            vk = 0
            vv = 0
            if memory > M:
                vk = V_MEMORY
                vv = memory
            elif maxseq >= 0 and na > maxseq:
                vk = V_SEQS
                vv = na
            elif budget >= 0 and tokens > budget:
                vk = V_BUDGET
                vv = tokens
            if vk != 0:
                st[ST_VKIND] = vk
                st[ST_VSLOT] = t
                st[ST_VVALUE] = vv
                st[ST_VMEM] = memory
                status = VIOLATION
                break

        # --- release the finished at the end of the slot (admission order kept)
        running_n = na
        done = 0
        w = 0
        for k in range(na):
            r = act[k]
            if prog[r] >= s[r] + o[r]:
                fin[r] = t
                done += 1
                if pol == RESERVE:
                    resv -= held(s[r] + o[r], B)
            else:
                act[w] = r
                w += 1
        na = w

        out[0, row] = arrived
        out[1, row] = nadmit
        out[2, row] = npreempt
        out[3, row] = done
        out[4, row] = running_n
        out[5, row] = memory
        out[6, row] = step_wasted
        out[7, row] = tokens
        out[8, row] = ql
        if comp:
            out[9, row] = scheduled
            out[10, row] = pf_tok
            out[11, row] = dc_tok
            out[12, row] = kv_att
            out[13, row] = pf_reqs
            out[14, row] = pf_ctx
            out[15, row] = pf_sq
            out[16, row] = dc_ctx
            out[17, row] = step_recomp
        t += 1

    st[ST_T] = t
    st[ST_I] = i
    st[ST_QH] = qh
    st[ST_QL] = ql
    st[ST_NA] = na
    st[ST_RESV] = resv
    return status
