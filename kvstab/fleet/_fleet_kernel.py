"""The fleet's event loop on compiled replicas: the routing and the stepping in one numba loop.

Each replica is the built-ins' compiled kernel (:func:`kvstab.engine._kernel.run_builtins`) with
its own state, request table and plan.  A replica's plan is filled as the router sends it
requests: an entry not yet routed holds the slot :data:`NOT_YET`, which the kernel never
reaches, so a replica stepped up to an arrival's slot stops there and takes the request at
that slot, before its decision — the reference event loop's ``arrive`` before ``step``.
Before each arrival every replica is stepped to the arrival's slot on its own clock (the
kernel skips quiet stretches in closed form), then the router picks one in the loop itself:
``JSQ`` (fewest in system: waiting, running and routed but not yet taken; ties by one
uniform of the run's stream, as :func:`kvstab.fleet.routers._argmin_random` breaks them) or
``FIXED`` (a state-independent router's assignment, the cross-check of the two paths).

The replicas' tables are stacked (row ``j`` of each array is replica ``j``'s), so the loop
takes plain arrays, and they grow (doubling) when a replica's plan is full: :func:`run_fleet` returns
:data:`GROW` with the arrival it stopped at, and the driver resumes after growing them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstab.engine import _kernel as K
from kvstab.engine import _layout as L

#: the files of kvstab/engine whose compiled text this module's kernels inline (see kvstab.engine._layout.stale)
KERNEL_SHA = "63df08f27204389a"
LAYOUT_SHA = "14a0a08f1956fdd1"
FINISH_TREE_SHA = "0e4bea723d7ccfbd"
SKELETON_SHA = "2d60ea0633aae12c"
GUARDS = (
    ("_kernel.py", KERNEL_SHA), ("_layout.py", LAYOUT_SHA), ("_finish_tree.py", FINISH_TREE_SHA),
    ("_skeleton.py", SKELETON_SHA),
)  # fmt: skip
L.warn_if_stale(__name__, GUARDS)

#: router codes
FIXED, JSQ = 0, 1
#: what run_fleet returns
DONE, GROW, VIOLATION = 0, 1, 2
#: the slot of a plan entry not routed yet (never reached)
NOT_YET = 1 << 62
#: the columns of a replica's row buffer (slots per call of the replica's kernel)
BUF = 4096


def _njit(**kwargs: Any) -> Any:
    return K._njit(**kwargs)


@_njit(cache=True)
def advance(
    j: int, target: int, cfg: np.ndarray, nslots: np.ndarray, pslots: np.ndarray, pss: np.ndarray, pos: np.ndarray,
    Rs: np.ndarray, qbufs: np.ndarray, elists: np.ndarray, hks: np.ndarray, hids: np.ndarray, phs: np.ndarray,
    sts: np.ndarray, outs: np.ndarray, mems: np.ndarray, queues: np.ndarray, FT: np.ndarray,
    b1: np.ndarray, b2: np.ndarray, bp: np.ndarray,
) -> int:
    """Step replica ``j`` up to slot ``target`` (not run), keeping each slot's memory and queue.

    Replica ``j``'s tables are row ``j`` of each stacked array (C-contiguous rows: the kernel
    runs with the very types of the single-server engine, so its cached code serves both)."""
    st = sts[j]
    out = outs[j]
    mem = mems[j]
    que = queues[j]
    horizon = nslots[j]
    width = out.shape[1]
    while st[L.ST_T] < target:
        t0 = st[L.ST_T]
        te = min(target, t0 + width)
        c = cfg[j]  # replica j's settings record (kvstab.engine._layout's C_* fields): this batch's bounds
        c[L.C_T_END], c[L.C_T_BASE] = te, t0
        status = K.run_builtins(
            c, (pslots[j], pss[j], pos[j]), Rs[j], qbufs[j], elists[j], hks[j], hids[j], phs[j], st, out, (b1, b2, bp), FT
        )  # fmt: skip
        t1 = st[L.ST_T]
        for c in range(t1 - t0):
            if t0 + c < horizon:
                mem[t0 + c] = out[5, c]
                que[t0 + c] = out[8, c]
        if status == L.VIOLATION:
            return VIOLATION
    return DONE


@_njit(cache=True)
def run_fleet(
    code: int, k0: int, times: np.ndarray, s_all: np.ndarray, o_all: np.ndarray, fixed: np.ndarray,
    U: np.ndarray, ucur: np.ndarray, bbar: np.ndarray, cfg: np.ndarray, count: np.ndarray, where: np.ndarray,
    nslots: np.ndarray, pslots: np.ndarray, pss: np.ndarray, pos: np.ndarray, Rs: np.ndarray, qbufs: np.ndarray,
    elists: np.ndarray, hks: np.ndarray, hids: np.ndarray, phs: np.ndarray, sts: np.ndarray, outs: np.ndarray,
    mems: np.ndarray, queues: np.ndarray, FT: np.ndarray, b1: np.ndarray, b2: np.ndarray, bp: np.ndarray,
) -> tuple[int, int]:
    """Route arrivals ``k0 …`` in time order; returns ``(status, the arrival it stopped at)``."""
    N = bbar.shape[0]
    n = times.shape[0]
    tgt = np.zeros(N, dtype=np.int64)
    keys = np.zeros(N, dtype=np.float64)
    for k in range(k0, n):
        for j in range(N):
            if count[j] == pslots.shape[1]:  # before any draw, so a resumed arrival draws what it would have
                return GROW, k
        t = times[k]
        for j in range(N):
            tj = np.int64(np.floor(t / bbar[j]))
            tgt[j] = tj
            if advance(j, tj, cfg, nslots, pslots, pss, pos, Rs, qbufs, elists, hks, hids, phs, sts, outs, mems,
                       queues, FT, b1, b2, bp) == VIOLATION:  # fmt: skip
                return VIOLATION, k
        if code == FIXED:
            j = fixed[k]
        else:
            best = np.inf
            for i in range(N):
                st = sts[i]
                # waiting, running, and routed to it in this slot but not taken yet (the reference engine's
                # arrive puts those in its queue at once)
                keys[i] = np.float64(st[L.ST_QL] + st[L.ST_NA] + count[i] - st[L.ST_I])
                if keys[i] < best:
                    best = keys[i]
            m = 0
            for i in range(N):
                if keys[i] == best:
                    m += 1
            pick = 0
            if m > 1:
                pick = np.int64(U[ucur[0]] * m)  # type: ignore[assignment]
                ucur[0] += 1
            j = 0
            for i in range(N):
                if keys[i] == best:
                    if pick == 0:
                        j = i
                        break
                    pick -= 1
        c = count[j]
        pslots[j, c] = tgt[j]
        pss[j, c] = s_all[k]
        pos[j, c] = o_all[k]
        count[j] = c + 1
        where[k] = j
    return DONE, n
