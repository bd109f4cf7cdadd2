"""The compiled fast path of the built-in ``sglang`` rule, under three request lifecycles.

:func:`run_fast` runs :mod:`kvstab.engine._kernel_sglang` batch by batch for
:func:`kvstab.engine.run` (kvstab's lifecycle, vLLM's, or SGLang's own,
``lifecycle="sglang"``) and returns what the reference engine would: the
:class:`~kvstab.simulator.SimResult` (or the streamed :class:`Summary`), or the
same :class:`~kvstab.errors.InvariantViolation`.  :func:`replay_steps` yields
SGLang's step log for :func:`kvstab.empirical.sglang_replay.replay_sglang_model`.

Only the class :class:`~kvstab.schedulers.sglang.Sglang` itself takes this path
(a subclass may override ``decide``); the server (``M``, ``chunk``, ``block``,
``max_num_seqs``) is the run's ``ModelParams`` in every lifecycle, as the rule
reads it off the view (SGLang's lifecycle checks it with
:func:`~kvstab.lifecycles.sglang.check_server`), and every knob of the instance
is carried: ``max_prefill_tokens``, the clip, the ratio's knobs, the retract
steps, and (SGLang's lifecycle) ``context_len`` for the arrival clip.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.engine import _kernel_sglang as KS
from kvstab.engine import _layout as L
from kvstab.engine._drive import Bins, KernelState, Reporting, Requests, check_plan, run_kernel
from kvstab.engine._skeleton import config
from kvstab.engine.stream import Summary
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang import check_server, clip_max_new, max_req_len, replay_reference
from kvstab.model import ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import Horizon, SimResult

__all__ = ["is_fast", "no_fast_path", "run_fast", "replay_steps", "RawStep", "sglang_lengths", "SglangLife"]

IntArray = npt.NDArray[np.int64]
SglangLife = Literal["kvstab", "vllm", "sglang"]
_LIFE = {"kvstab": L.KVSTAB_LIFE, "vllm": L.VLLM_LIFE, "sglang": L.SGLANG_LIFE}

#: steps per call when the step log is kept (its buffers are emptied between calls)
LOG_BATCH = 1 << 12


#: the rule's ``total_offset`` is Python's ``sum`` of floats, which adds them one by one before
#: CPython 3.12 (3.12 compensates it, Neumaier): the kernel replicates the sequential sum only
SEQUENTIAL_FLOAT_SUM = sys.version_info < (3, 12)


def no_fast_path(scheduler: object) -> str | None:
    """Why ``scheduler`` has no compiled sglang path (``None``: it has one).  Only the built-in
    class itself qualifies (a subclass may change ``decide``; an instance with other knobs is
    carried whole), and only where Python's float ``sum`` is the sequential one."""
    if type(scheduler) is not Sglang:
        return "not the built-in Sglang class (a subclass may change decide)"
    if not SEQUENTIAL_FLOAT_SUM:
        return "CPython >= 3.12 compensates float sums (sglang's total_offset); the kernel adds one by one"
    return None


def is_fast(scheduler: object) -> bool:
    """Whether ``scheduler`` has this compiled path (see :func:`no_fast_path`)."""
    return no_fast_path(scheduler) is None


def sglang_lengths(rule: Sglang, params: ModelParams, plan: ArrivalPlan, fed: int) -> IntArray:
    """kvstab's ``o`` of each request under SGLang's lifecycle on the server ``params``
    (``max_new − 1`` after SGLang's arrival clip, :func:`kvstab.lifecycles.sglang.clip_max_new`);
    the first of the ``fed`` rows that :class:`~kvstab.lifecycles.sglang.SglangEngine` would
    refuse raises its :class:`InvalidArgument`."""
    B = params.block
    s = plan.s.astype(np.int64)
    limit = max_req_len(rule, params)
    paged = -(-s // B) * B
    max_new = np.maximum(0, np.minimum(np.minimum(plan.o, limit - s - 1), params.M - paged - B - 1))
    bad = np.flatnonzero(((s >= limit - 5) | (max_new < 1))[:fed])
    if bad.size:
        k = int(bad[0])
        clip_max_new(rule, params, int(s[k]), int(plan.o[k]))  # raises SGLang's refusal of the prompt
        raise InvalidArgument(
            f"request (s={int(s[k])}, max_new={int(plan.o[k])}): SGLang clips max_new_tokens to 0 at "
            f"M={params.M}; use a shorter prompt"
        )
    return (max_new - 1).astype(np.int64)


class _State(KernelState):
    """The flat arrays of one run of the compiled ``sglang`` engine (the request table
    ``R`` has :data:`_kernel_sglang.NG` rows, one column per request)."""

    WORK = KS.WORK

    def __init__(self, rule: Sglang, params: ModelParams, plan: ArrivalPlan, po: IntArray) -> None:
        n = len(plan)
        self.rule = rule
        self.params = params
        self.pslot = np.ascontiguousarray(plan.slot, dtype=np.int64)
        self.ps = np.ascontiguousarray(plan.s, dtype=np.int64)
        self.po = np.ascontiguousarray(po, dtype=np.int64)
        self.R = np.zeros((L.NG, n), dtype=np.int64)
        for f in (L.G_FIRST, L.G_FIN, L.G_NXT, L.G_PRV):
            self.R[f] = -1
        self.qbuf = np.zeros(n + 1, dtype=np.int64)
        self.elist = np.zeros(n + 1, dtype=np.int64)
        self.hk = np.zeros(n + 1, dtype=np.int64)
        self.hid = np.zeros(n + 1, dtype=np.int64)
        self.ck = np.zeros(n + 1, dtype=np.int64)
        self.cid = np.zeros(n + 1, dtype=np.int64)
        self.chain = np.zeros(n + 1, dtype=np.int64)
        B = params.block
        self.ph = np.zeros(B, dtype=np.int64)
        self.cnt = np.zeros(B, dtype=np.int64)
        self.st = np.zeros(L.ST_SIZE, dtype=np.int64)
        for f in (L.ST_AH, L.ST_AT, L.ST_DUMPV):
            self.st[f] = -1
        self.fs = np.array([rule.ratio_init], dtype=np.float64)
        self.no_bins = (np.zeros(1), np.zeros(1), np.zeros(L.BP_SIZE, dtype=np.int64))
        self.no_log = (np.zeros((L.NLOG, 0), dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))

    def load(
        self,
        active: list[tuple[int, int, int]],
        waiting: list[tuple[int, int]],
        sched_state: tuple[float, int] | None = None,
    ) -> None:
        """Start from a given state, as :meth:`kvstab.simulator.Engine.load_state` does (kvstab's
        lifecycle; the plan's first ``len(active)`` rows are ``active``'s requests, ``(s, o,
        progress)`` in batch order, the next ``len(waiting)`` the waiting ones, in queue order)."""
        R, st, B = self.R, self.st, self.params.block
        prev = -1
        for r, (s, o, p) in enumerate(active):
            R[L.G_S, r], R[L.G_O, r], R[L.G_PRV, r], R[L.G_RANK, r] = s, o, prev, r
            if prev >= 0:
                R[L.G_NXT, prev] = r
            else:
                st[L.ST_AH] = r
            prev = r
            if p >= s:
                KS.load_lazy(R, self.hk, self.hid, self.ck, self.cid, self.ph, self.cnt, st, r, p, B,
                             self.rule.clip_max_new_tokens)  # fmt: skip
            else:
                R[L.G_MODE, r], R[L.G_PROG, r] = L.M_EXPL, p
                self.elist[st[L.ST_NE]] = r
                st[L.ST_NE] += 1
        st[L.ST_AT], st[L.ST_NA], st[L.ST_RANKC] = prev, len(active), len(active)
        for k in range(len(waiting)):
            r = len(active) + k
            R[L.G_S, r], R[L.G_O, r] = waiting[k]
            self.qbuf[k] = r
        st[L.ST_QL] = len(waiting)
        st[L.ST_I] = len(active) + len(waiting)
        if sched_state is not None:
            self.fs[L.FS_RATIO], st[L.ST_BATCH_FULL] = float(sched_state[0]), int(sched_state[1])

    def sync(self) -> None:
        """Bring the lazy decoders' progress and areas up to the current slot."""
        KS.sync_lazy(self.R, self.st, self.cnt, self.params.block)

    def requests(self) -> Requests:
        """The request table's columns, as :func:`~kvstab.engine._drive.finish` reads them."""
        R = self.R
        return Requests(R[L.G_S], R[L.G_O], self.pslot, R[L.G_FIRST], R[L.G_FIN], R[L.G_NPRE], R[L.G_SERVED],
                        R[L.G_WASTED])  # fmt: skip

    def step(
        self,
        life: int,
        check: bool,
        t_end: int,
        drain: bool,
        drain_min: int,
        out: IntArray,
        bins: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], IntArray] | None = None,
        log: tuple[IntArray, npt.NDArray[np.float64], IntArray] | None = None,
    ) -> int:
        """Run the compiled engine towards ``t_end``; returns its status code."""
        p, rule = self.params, self.rule
        cfg = config(p, check, t_end, drain, drain_min, self.t, life=life, mpt=rule.max_prefill_tokens,
                     clip=rule.clip_max_new_tokens, rds=rule.retract_decode_steps)  # fmt: skip
        fcfg = np.zeros(L.FC_SIZE, dtype=np.float64)
        fcfg[L.FC_INIT], fcfg[L.FC_MIN], fcfg[L.FC_DECAY] = rule.ratio_init, rule.ratio_min, rule.ratio_decay
        return int(
            KS.run_sglang(
                cfg, fcfg, (self.pslot, self.ps, self.po), self.R, self.qbuf, self.elist, self.hk, self.hid, self.ck,
                self.cid, self.ph, self.cnt, self.chain, self.st, self.fs, out, self.no_bins if bins is None else bins,
                self.no_log if log is None else log,
            )
        )  # fmt: skip


def _lengths(
    rule: Sglang, params: ModelParams, plan: ArrivalPlan, lifecycle: SglangLife, fed: int
) -> tuple[ArrivalPlan, IntArray]:
    """The plan as the reference engine accepts it, and kvstab's ``o`` per request."""
    if lifecycle == "sglang":
        return plan, sglang_lengths(rule, check_server(params), plan, fed)
    plan = check_plan(plan, params, lifecycle)
    return plan, plan.o - 1 if lifecycle == "vllm" else plan.o


def run_fast(
    rule: Sglang,
    params: ModelParams,
    plan: ArrivalPlan,
    h: Horizon,
    rep: Reporting,
    check: bool,
    lifecycle: SglangLife,
    work: dict[str, int] | None = None,
) -> tuple[Summary, SimResult | None]:
    """The compiled engine's run, as :func:`kvstab.engine.driver._run_fast` runs the other
    built-ins (``work``, if given, receives :meth:`_State.work`)."""
    fed = int(np.searchsorted(plan.slot, h.end, side="left"))
    plan, po = _lengths(rule, params, plan, lifecycle, fed)
    state = _State(rule, params, plan, po)
    life = _LIFE[lifecycle]

    def step(t_end: int, out: IntArray, bins: Bins | None) -> int:
        return state.step(life, check, t_end, h.drain, h.drain_min, out, bins)

    return run_kernel(state, step, rule.name, params, plan.dropped, h, rep, rows=L.NSIM, work=work)


@dataclass(frozen=True, slots=True)
class RawStep:
    """One step of SGLang's step log as the compiled engine writes it (plain values)."""

    kind: str
    admitted: tuple[int, ...]
    retracted: tuple[int, ...]
    finished: tuple[int, ...]
    tokens: tuple[tuple[int, int], ...]
    prefill_tokens: int
    decode_tokens: int
    kv_used: int
    new_token_ratio: float
    batch_is_full: int
    queue: int


@dataclass(frozen=True, slots=True)
class LogEnd:
    """The requests' outcomes at the end of a logged replay (arrival order)."""

    arrived: int
    max_new: IntArray  # kvstab's o + 1 at arrival (SGLang's max_new after the clip)
    first_admit: IntArray
    finish: IntArray
    retractions: IntArray
    recomputed: IntArray


_KINDS = ("idle", "prefill", "decode")


def replay_steps(
    plan: ArrivalPlan, rule: Sglang, params: ModelParams, steps: int | None, max_steps: int, end: list[LogEnd]
) -> Iterator[RawStep]:
    """SGLang's lifecycle on the server ``params``, one step per slot (idle steps too), ``steps``
    steps or until every request arrived and finished (at most ``max_steps``); yields each step's
    record and appends the requests' outcomes to ``end`` when done.  Raises as
    ``replay_sglang_model`` does."""
    horizon = max_steps if steps is None else min(steps, max_steps)
    fed = int(np.searchsorted(plan.slot, horizon, side="left"))
    po = sglang_lengths(rule, check_server(params), plan, fed)
    state = _State(rule, params, plan, po)
    width = LOG_BATCH
    lg = np.zeros((L.NLOG, width), dtype=np.int64)
    lr = np.zeros(width, dtype=np.float64)
    ev = np.zeros(4 * len(plan) + 16 * width + 64, dtype=np.int64)
    out = np.zeros((L.NSIM, 0), dtype=np.int64)
    while True:
        t0 = state.t
        t_end = min(t0 + width, horizon)
        state.st[L.ST_EVP] = 0
        state.st[L.ST_DUMPV] = -1  # the buffer is emptied: the batch is dumped again when it decodes
        status = state.step(L.SGLANG_LIFE, True, t_end, steps is None, 0, out, None, (lg, lr, ev))
        if status == L.VIOLATION:
            # the reference engine raises it, with every detail of the slot
            replay_reference(plan, rule, params, steps, max_steps=max_steps)
            raise AssertionError("the compiled sglang engine stopped at a violation the reference did not raise")
        yield from _decode_log(lg, lr, ev, state.t - t0)
        if status == L.DRAINED or (steps is not None and state.t >= steps):
            break
        if state.t >= max_steps:
            raise InvalidArgument(f"the SGLang model did not drain within {max_steps} steps")
    n = state.arrived
    R = state.R
    end.append(
        LogEnd(
            arrived=n,
            max_new=po[:n] + 1,
            first_admit=R[L.G_FIRST, :n].copy(),
            finish=R[L.G_FIN, :n].copy(),
            retractions=R[L.G_NPRE, :n].copy(),
            recomputed=R[L.G_RECOMP, :n].copy(),
        )
    )


def _decode_log(lg: IntArray, lr: npt.NDArray[np.float64], ev: IntArray, width: int) -> Iterator[RawStep]:
    """The steps of one call's log buffers (a decode step's batch dump is shared while it holds)."""
    cols = lg[:, :width].T.tolist()
    ratios = lr[:width].tolist()
    evl = ev.tolist() if width else []
    dumps: dict[int, tuple[tuple[int, int], ...]] = {}
    for c, row in enumerate(cols):
        ntok, off = row[L.L_NTOK], row[L.L_TOKOFF]
        nadm = row[L.L_NADM]
        if ntok < 0:
            tokens = dumps.get(off)
            if tokens is None:
                tokens = dumps[off] = tuple((r, 1) for r in evl[off : off + (-ntok - 1)])
            admitted: tuple[int, ...] = ()
        else:
            flat = evl[off : off + 2 * ntok]
            tokens = tuple(zip(flat[0::2], flat[1::2]))
            admitted = tuple(flat[2 * (ntok - nadm) :: 2]) if nadm else ()
        ret, fin = row[L.L_RET], row[L.L_FIN]
        yield RawStep(
            kind=_KINDS[row[L.L_KIND]],
            admitted=admitted,
            retracted=tuple(evl[ret : ret + row[L.L_NRET]]),
            finished=tuple(evl[fin : fin + row[L.L_NFIN]]),
            tokens=tokens,
            prefill_tokens=row[L.L_PF],
            decode_tokens=row[L.L_DC],
            kv_used=row[L.L_KV],
            new_token_ratio=ratios[c],
            batch_is_full=row[L.L_FULL],
            queue=row[L.L_QUEUE],
        )
