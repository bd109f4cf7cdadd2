"""The skeleton every compiled slot loop shares: the run's settings record, the state a loop
loads and stores, arrivals, the drain test, the invariant checks, a slot's row and the
streamed batch-means sums (numba; plain Python without numba).

The compiled loops (:mod:`~kvstab.engine._kernel`, :mod:`~kvstab.engine._kernel_sglang`,
:mod:`~kvstab.engine._plugin_kernel`, :mod:`~kvstab.engine._kernel_cache`) differ in their
decision and in how they keep the running requests; what happens around the decision is
written once here and inlined into each of them.  A kernel that inlines these helpers writes
this file's hash into its own text (``SKELETON_SHA``, see :func:`kvstab.engine._layout.stale`),
so that numba's cache, keyed by the kernel's own text, is rebuilt when they change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvstab.engine import _layout as _L
from kvstab.engine._layout import (
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
    C_DRAIN,
    C_DRAIN_MIN,
    C_M,
    C_MAXSEQ,
    C_SIZE,
    C_T_BASE,
    C_T_END,
    F_O,
    F_S,
    ST_ADMIT,
    ST_AH,
    ST_AT,
    ST_DL,
    ST_DONE,
    ST_EXPL,
    ST_FULL,
    ST_HN,
    ST_I,
    ST_MEMSUM,
    ST_NA,
    ST_NE,
    ST_NL,
    ST_PREEMPT,
    ST_QH,
    ST_QL,
    ST_RUNSUM,
    ST_SKIP,
    ST_STRETCH,
    ST_T,
    ST_VKIND,
    ST_VMEM,
    ST_VSLOT,
    ST_VVALUE,
    V_BUDGET,
    V_MEMORY,
    V_SEQS,
)

if TYPE_CHECKING:
    from kvstab.model import ModelParams

#: a kernel's plan record: the requests' arrival slots, prompts and outputs (``pslot``, ``ps``, ``po``)
Plan = tuple[np.ndarray, np.ndarray, np.ndarray]
#: the streamed batch-means record: throughput bins, queue-slope bins, their parameters ``bp`` (``BP_*``)
Bins = tuple[np.ndarray, np.ndarray, np.ndarray]

#: the text of ``_layout.py`` this file was last compiled with (its indices are compiled in)
LAYOUT_SHA = "14a0a08f1956fdd1"
GUARDS = (("_layout.py", LAYOUT_SHA),)
_L.warn_if_stale(__name__, GUARDS)

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


def config(
    params: ModelParams, check: bool, t_end: int, drain: bool, drain_min: int, t_base: int, **more: int
) -> np.ndarray:  # fmt: skip
    """A run's settings as the ``cfg`` record a kernel reads: the server's ``M``, chunk, block, token
    budget and ``max_num_seqs`` (``-1``: none), then ``check``, ``t_end``, ``drain``, ``drain_min``
    and ``t_base``; ``more`` sets further fields by their names in :mod:`~kvstab.engine._layout`
    without the ``C_`` (``pol``, ``life``, ``comp``, ``mpt``, ``clip``, ``rds``, ``window``)."""
    cfg = np.zeros(C_SIZE, dtype=np.int64)
    cfg[C_M], cfg[C_CHUNK], cfg[C_B] = params.M, params.chunk, params.block
    cfg[C_BUDGET] = -1 if params.token_budget is None else params.token_budget
    cfg[C_MAXSEQ] = -1 if params.max_num_seqs is None else params.max_num_seqs
    cfg[C_CHECK], cfg[C_T_END], cfg[C_DRAIN], cfg[C_DRAIN_MIN], cfg[C_T_BASE] = check, t_end, drain, drain_min, t_base
    for name, value in more.items():
        cfg[getattr(_L, "C_" + name.upper())] = value
    return cfg


@_njit(cache=True, inline="always")
def settings(cfg: np.ndarray) -> tuple[int, int, int, int, int, bool, int, bool, int, int]:
    """The settings every kernel reads of ``cfg``: ``M``, ``chunk``, ``B``, the token budget and
    ``max_num_seqs`` (``-1``: none), ``check``, ``t_end``, ``drain``, ``drain_min`` and ``t_base``
    (the slot of the row block's first column)."""
    return (
        cfg[C_M], cfg[C_CHUNK], cfg[C_B], cfg[C_BUDGET], cfg[C_MAXSEQ], cfg[C_CHECK] != 0, cfg[C_T_END],
        cfg[C_DRAIN] != 0, cfg[C_DRAIN_MIN], cfg[C_T_BASE],
    )  # fmt: skip


# ---- records written a field at a time
@_njit(cache=True, inline="always")
def put(st: np.ndarray, fields: tuple[int, ...], values: tuple[int, ...]) -> None:
    """``st[fields[k]] = values[k]`` for every ``k``: a record's fields, named by a tuple of indices."""
    for k in range(len(fields)):
        st[fields[k]] = values[k]


@_njit(cache=True, inline="always")
def put_column(out: np.ndarray, col: int, first: int, values: tuple[int, ...]) -> None:
    """``out[first + k, col] = values[k]`` for every ``k``: consecutive rows of one column."""
    for k in range(len(values)):
        out[first + k, col] = values[k]


# ---- the scalar state: the clock and the queue (every kernel), the actives (the event-driven ones)
#: what :func:`load_queue` loads, in its order
QUEUE = (ST_T, ST_I, ST_QH, ST_QL, ST_NA)
#: what :func:`load_state` loads after :data:`QUEUE`, in its order
ACTIVES = (ST_AH, ST_AT, ST_NL, ST_DL, ST_NE, ST_HN, ST_MEMSUM)


@_njit(cache=True, inline="always")
def load_queue(st: np.ndarray) -> tuple[int, int, int, int, int]:
    """The clock, the plan's next arrival, the queue ring's head and length, the actives' number."""
    return st[ST_T], st[ST_I], st[ST_QH], st[ST_QL], st[ST_NA]


@_njit(cache=True, inline="always")
def store_queue(st: np.ndarray, t: int, i: int, qh: int, ql: int, na: int) -> None:
    """Store what :func:`load_queue` loads."""
    put(st, QUEUE, (t, i, qh, ql, na))


@_njit(cache=True, inline="always")
def load_state(st: np.ndarray) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int]:
    """What :func:`load_queue` loads, then what the event-driven kernels keep of their actives: the
    list of actives (head, tail), the lazy decoders (number, memory), the explicit requests, the
    finish heap's size and the streamed memory sum."""
    t, i, qh, ql, na = load_queue(st)
    return t, i, qh, ql, na, st[ST_AH], st[ST_AT], st[ST_NL], st[ST_DL], st[ST_NE], st[ST_HN], st[ST_MEMSUM]


@_njit(cache=True, inline="always")
def store_state(
    st: np.ndarray, t: int, i: int, qh: int, ql: int, na: int, ah: int, at: int, nL: int, DL: int, ne: int, hn: int,
    memsum: int,
) -> None:  # fmt: skip
    """Store what :func:`load_state` loads."""
    put(st, QUEUE + ACTIVES, (t, i, qh, ql, na, ah, at, nL, DL, ne, hn, memsum))


@_njit(cache=True, inline="always")
def drained(drain: bool, drain_min: int, t: int, i: int, n: int, na: int, ql: int) -> bool:
    """Whether a draining run ends at slot ``t``: the plan's ``n`` requests all arrived, none active
    or waiting, and ``drain_min`` reached."""
    return drain and i >= n and na == 0 and ql == 0 and t >= drain_min


# ---- arrivals
@_njit(cache=True, inline="always")
def enqueue(R: np.ndarray, qbuf: np.ndarray, s: int, o: int, i: int, qh: int, ql: int) -> int:
    """Request ``i`` (prompt ``s``, output ``o``) joins the queue ring's tail; returns its length."""
    R[F_S, i] = s
    R[F_O, i] = o
    qbuf[(qh + ql) % qbuf.shape[0]] = i
    return ql + 1


@_njit(cache=True, inline="always")
def arrivals(
    t: int, i: int, pslot: np.ndarray, ps: np.ndarray, po: np.ndarray, ocut: int, R: np.ndarray, qbuf: np.ndarray,
    qh: int, ql: int,
) -> tuple[int, int, int]:  # fmt: skip
    """Slot ``t``'s arrivals join the queue's tail, each with ``ocut`` fewer outputs than the plan's
    (vLLM's lifecycle: ``o − 1`` decode units).  Returns the plan's next request, the queue's
    length and the arrivals."""
    n = pslot.shape[0]
    arrived = 0
    while i < n and pslot[i] == t:
        ql = enqueue(R, qbuf, ps[i], po[i] - ocut, i, qh, ql)
        i += 1
        arrived += 1
    return i, ql, arrived


@_njit(cache=True, inline="always")
def arrivals_until(
    te: int, i: int, pslot: np.ndarray, ps: np.ndarray, po: np.ndarray, ocut: int, R: np.ndarray, qbuf: np.ndarray,
    qh: int, ql: int, binned: bool, b2f: int, b2s: int, b2n: int, bins2: np.ndarray,
) -> tuple[int, int]:  # fmt: skip
    """Every arrival before slot ``te`` joins the queue's tail (as in :func:`arrivals`), each counted
    in the queue slope's bin of its slot (``binned``).  Returns the plan's next request and the
    queue's length."""
    n = pslot.shape[0]
    while i < n and pslot[i] < te:
        ql = enqueue(R, qbuf, ps[i], po[i] - ocut, i, qh, ql)
        if binned:
            bin_add(bins2, b2f, b2s, b2n, pslot[i], 1.0)
        i += 1
    return i, ql


# ---- the invariants a slot is checked against
@_njit(cache=True, inline="always")
def breach(memory: int, M: int, na: int, maxseq: int, tokens: int, budget: int) -> tuple[int, int]:
    """The slot's first broken limit and the value that broke it (``(0, 0)`` if none), in the
    reference engine's order: memory over ``M``, then running over ``max_num_seqs``, then tokens
    over the budget (``-1``: no cap, no budget)."""
    if memory > M:
        return V_MEMORY, memory
    if maxseq >= 0 and na > maxseq:
        return V_SEQS, na
    if budget >= 0 and tokens > budget:
        return V_BUDGET, tokens
    return 0, 0


@_njit(cache=True, inline="always")
def violated(st: np.ndarray, t: int, memory: int, M: int, na: int, maxseq: int, tokens: int, budget: int) -> bool:
    """Whether slot ``t`` breaks a limit (:func:`breach`); the violation is recorded in ``st``
    (``ST_VKIND``, ``ST_VSLOT``, ``ST_VVALUE`` and the slot's memory ``ST_VMEM``)."""
    vk, vv = breach(memory, M, na, maxseq, tokens, budget)
    if vk == 0:
        return False
    st[ST_VKIND] = vk
    st[ST_VSLOT] = t
    st[ST_VVALUE] = vv
    st[ST_VMEM] = memory
    return True


# ---- what a slot reports: its row, its batch-means sums, the work counters
#: the work counters every event-driven kernel reports first (name, index into ``st``)
WORK = (
    ("full_slots", ST_FULL),
    ("skipped_slots", ST_SKIP),
    ("stretches", ST_STRETCH),
    ("explicit_steps", ST_EXPL),
    ("admissions", ST_ADMIT),
    ("preemptions", ST_PREEMPT),
)


@_njit(cache=True, inline="always")
def slot_row(
    out: np.ndarray, col: int, arrived: int, admitted: int, preempted: int, completed: int, running: int,
    memory: int, wasted: int, tokens: int, queue: int,
) -> None:  # fmt: skip
    """A slot's ``SimResult`` row (:data:`~kvstab.engine._layout.COLUMNS`' first ``NSIM``) at column ``col``."""
    put_column(out, col, 0, (arrived, admitted, preempted, completed, running, memory, wasted, tokens, queue))


@_njit(cache=True, inline="always")
def bin_params(bp: np.ndarray) -> tuple[bool, int, int, int, int, int, int, int]:
    """The streamed batch-means bins (``bp``): whether they are on, throughput's first slot, bin
    size and count, the queue slope's, and the slot the memory sum starts at."""
    return bp[BP_ON] != 0, bp[BP_F1], bp[BP_S1], bp[BP_N1], bp[BP_F2], bp[BP_S2], bp[BP_N2], bp[BP_MEM]


@_njit(cache=True, inline="always")
def bin_add(bins: np.ndarray, first: int, size: int, count: int, t: int, x: Any) -> None:
    """Add ``x`` to the bin of slot ``t`` (``count`` bins of ``size`` slots from ``first``), if any."""
    k = t - first
    if size > 0 and k >= 0 and k < size * count:
        bins[k // size] += x


@_njit(cache=True, inline="always")
def bin_slot(
    t: int, b1f: int, b1s: int, b1n: int, b2f: int, b2s: int, b2n: int, mstart: int, bins1: np.ndarray,
    bins2: np.ndarray, memsum: int, arrived: int, done: int, memory: int,
) -> int:  # fmt: skip
    """Slot ``t``'s batch-means sums: completions to ``bins1``, arrivals less completions to
    ``bins2``, its memory to the memory sum from ``mstart``; returns the memory sum."""
    bin_add(bins1, b1f, b1s, b1n, t, done)
    bin_add(bins2, b2f, b2s, b2n, t, arrived - done)
    if t >= mstart:
        memsum += memory
    return memsum


@_njit(cache=True, inline="always")
def count_stretch(st: np.ndarray, L: int, na: int) -> None:
    """Work counters: a quiet stretch of ``L`` slots skipped with ``na`` running."""
    st[ST_STRETCH] += 1
    st[ST_SKIP] += L
    st[ST_RUNSUM] += na * L


@_njit(cache=True, inline="always")
def count_slot(st: np.ndarray, done: int, running: int) -> None:
    """Counters at a full slot's end: its completions, its running requests."""
    st[ST_DONE] += done
    st[ST_RUNSUM] += running
