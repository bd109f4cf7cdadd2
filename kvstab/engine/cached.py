"""The compiled engine with prefix caching: plan in, :class:`SimResult` out.

Drives :func:`kvstab.engine._kernel_cache.run_cached` batch by batch for the rules it
carries (``vllm-v1`` under kvstab's and vLLM's lifecycles; ``current-fit``, ``reserve`` and
``lookahead`` under kvstab's, on a server without a token budget, which they ignore and the
reference engine reports breaking).  It prepares what the kernel hashes — each request's content segments (the
plan's prompts, else a prompt of its own, then its output tokens, as
:meth:`kvstab.simulator.Engine.arrive` builds them) — and hands any run the kernel cannot
finish exactly (a rule that never preempts meeting a full pool) to the reference engine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import Scheduler
from kvstab.engine import _finish_tree
from kvstab.engine import _kernel_cache as KC
from kvstab.engine import _layout as L
from kvstab.engine._drive import Requests, finish
from kvstab.engine.stream import StreamStats, Summary
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix import PromptSet, chain_constants, content_ids, segment_digests
from kvstab.schedulers.current_fit import CurrentFit
from kvstab.schedulers.lookahead import Lookahead
from kvstab.schedulers.reserve import Reserve
from kvstab.schedulers.vllm_v1 import VllmV1
from kvstab.simulator import SimResult

__all__ = ["cached_rule", "why_not_cached", "run_cached", "BATCH"]

IntArray = npt.NDArray[np.int64]

#: slots per call of the compiled loop (a progress bar moves between calls)
BATCH = 1 << 16


def cached_rule(scheduler: Scheduler) -> int | None:
    """The kernel's code for ``scheduler``, or ``None`` (only the built-in classes, exactly)."""
    kind = type(scheduler)
    if kind is VllmV1:
        return L.VLLM_V1
    if kind is CurrentFit:
        return L.CURRENT_FIT
    if kind is Reserve:
        return L.RESERVE
    if kind is Lookahead:
        return L.LOOKAHEAD
    return None


def why_not_cached(scheduler: Scheduler, params: ModelParams, lifecycle: str) -> str:
    """Why the compiled cache engine cannot run this ("" if it can)."""
    rule = cached_rule(scheduler)
    if rule is None:
        return "the compiled prefix-cache engine carries vllm-v1, current-fit, reserve and lookahead"
    if lifecycle not in ("kvstab", "vllm"):
        return f"lifecycle {lifecycle!r}"
    if rule != L.VLLM_V1 and params.token_budget is not None:
        return f"{scheduler.name} ignores the token budget, which only the reference engine reports breaking"
    if rule != L.VLLM_V1 and lifecycle == "vllm":
        return "vLLM's lifecycle is compiled for vllm-v1 only"
    return ""


def _contents(plan: ArrivalPlan, outputs: IntArray) -> PromptSet:
    """Every request's KV content: its prompt (the plan's, else one of its own), then its
    ``outputs`` output tokens (``output[i]`` or an id of its own)."""
    n = len(plan)
    prompts = plan.prompts
    if prompts is None:
        own = content_ids("own", np.arange(n, dtype=np.int64))
        prompts = PromptSet(np.arange(n + 1, dtype=np.int64), own, plan.s.astype(np.int64))
    return prompts.with_outputs(outputs)


def _lookahead_tables(rule: int, plan: ArrivalPlan, params: ModelParams) -> tuple[IntArray, IntArray]:
    """``lookahead``'s finish-time table (a row per request) and finish tree (a ring that holds
    every request's whole life, its prefill from progress 0 then its decode: a hit only shortens
    it); stubs for the other rules, and no tree (the table throughout) for lives too long."""
    stub = np.zeros((1, 1), dtype=np.int64)
    if rule != L.LOOKAHEAD:
        return np.zeros((1, KC.L_SIZE), dtype=np.int64), stub
    la = np.zeros((max(len(plan), 1), KC.L_SIZE), dtype=np.int64)
    longest = int((-(-plan.s // params.chunk) + plan.o).max(initial=0))
    W = _finish_tree.ring_for(longest)
    if not W:
        return la, stub
    mean_o = float(plan.o.mean()) if len(plan) else 0.0
    return la, _finish_tree.new(W, *_finish_tree.thresholds(params.block, mean_o))


def run_cached(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    slots: int | None,
    *,
    drain: bool,
    lifecycle: str,
    max_slots: int,
    progress: Callable[[int, int | None], None] | None = None,
    record: bool = True,
    warmup: float = 0.25,
    batches: int = 20,
) -> tuple[Summary, SimResult | None] | None:
    """The run's :class:`Summary` and (with ``record``) the :class:`SimResult` the reference
    engine would record — without ``record`` the rows stream into the summary, none is kept —
    or ``None`` when the kernel met what only the reference engine reports exactly (the
    caller then runs the reference)."""
    rule = cached_rule(scheduler)
    if rule is None or why_not_cached(scheduler, params, lifecycle):
        raise InvalidArgument(f"no compiled prefix-cache path: {why_not_cached(scheduler, params, lifecycle)}")
    n = len(plan)
    B = params.block
    usable = params.M // B
    vllm = lifecycle == "vllm"
    o = plan.o - 1 if vllm else plan.o.copy()
    contents = _contents(plan, plan.o.astype(np.int64))  # content: prompt + every output token sampled
    seg_d = segment_digests(contents.content)
    seg_len = contents.length.copy()
    seg_off = contents.offsets.copy()
    R = np.zeros((max(n, 1), KC.R_SIZE), dtype=np.int64)  # a row per request: its fields together
    R[:n, KC.R_S] = plan.s
    R[:n, KC.R_O] = o
    R[:, KC.R_FIRST] = -1
    R[:, KC.R_FIN] = -1
    R[:, KC.R_OHEAD] = -1
    R[:, KC.R_OTAIL] = -1
    R[:, KC.R_CPTR] = -1
    R[:, KC.R_HLAST] = -1
    hP = np.zeros(max(n, 1), dtype=np.uint64)
    nb = usable + 1  # block 0: vLLM's null block, never handed out
    blk = np.full((nb, KC.K_SIZE), -1, dtype=np.int64)  # a row per block: its fields together
    blk[:, KC.K_REF] = 0
    blk[:, KC.K_HASH] = 0
    blk[:, KC.K_DPREV] = KC.UNCACHED
    # the free queue starts as every block in id order (kv_cache_utils.py:281)
    blk[1:-1, KC.K_FNEXT] = np.arange(2, nb, dtype=np.int64)
    blk[2:, KC.K_FPREV] = np.arange(1, nb - 1, dtype=np.int64)
    par = np.full(nb, -1, dtype=np.int64)  # a hit block's predecessor in its chain
    cap = 1 << max(4, int(2 * nb - 1).bit_length())  # the hash table: at least 2× the blocks, a power of 2
    ht = np.zeros((cap, KC.H_SIZE), dtype=np.int64)  # a row per table slot: key, first, last, used
    ht[:, KC.H_FIRST] = -1
    ht[:, KC.H_LAST] = -1
    run = np.zeros(max(n, 1), dtype=np.int64)
    wq = np.zeros(max(n, 1), dtype=np.int64)
    longest = int(np.max((plan.s + plan.o + B - 1) // B)) if n else 1
    scratch = np.zeros(longest + 2, dtype=np.int64)
    victims = np.zeros(max(n, 1), dtype=np.int64)
    memo = np.full((longest + 2, 4), -1, dtype=np.int64)  # the queue head's chain, hashed once
    memo_P = np.zeros(longest + 2, dtype=np.uint64)
    la, FT = _lookahead_tables(rule, plan, params)
    st = np.zeros(KC.CS_SIZE, dtype=np.int64)
    st[KC.CS_LAH] = -1
    st[KC.CS_NFREE] = usable
    st[KC.CS_FHEAD] = 1 if usable else -1
    st[KC.CS_FTAIL] = usable if usable else -1
    CR, SEED, K1, K2 = (np.uint64(x) for x in chain_constants())
    life = L.VLLM_LIFE if vllm else L.KVSTAB_LIFE
    budget = -1 if params.token_budget is None else params.token_budget
    seqs = -1 if params.max_num_seqs is None else params.max_num_seqs
    fixed_end = 0 if slots is None else slots  # a drained run still reaches `slots` if given
    stats = StreamStats(params.M, None if drain or slots is None else slots, warmup, batches, keep_all=record)
    while True:
        t0 = int(st[KC.CS_T])
        draining = drain and t0 >= fixed_end
        end = max_slots if draining else fixed_end
        t_end = min(t0 + BATCH, end)
        out = np.zeros((len(KC.COLUMNS), t_end - t0), dtype=np.int64)
        status = KC.run_cached(
            st, R, hP, plan.slot, seg_d, seg_len, seg_off, blk, par, ht, run, wq, scratch, victims, memo, memo_P,
            la, FT, rule, life, B, params.chunk, budget, seqs, usable, CR, SEED, K1, K2, t_end, draining, out,
        )  # fmt: skip
        if status == L.BROKEN:
            return None
        t = int(st[KC.CS_T])
        stats.add(out[:, : t - t0])
        if progress is not None:
            progress(t, None if drain else end)
        if status == L.DRAINED:
            break
        if t >= end:
            if draining:
                raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
            if not drain:
                break
    # the running requests' charge since their last change of blocks, up to now (kept lazily by the loop)
    T = int(st[KC.CS_T])
    for r in run[: int(st[KC.CS_NRUN])]:
        R[r, KC.R_SERVED] += (R[r, KC.R_HIT] + R[r, KC.R_NOWN]) * B * (T - R[r, KC.R_SINCE])
        R[r, KC.R_SINCE] = T
    arrived = int(st[KC.CS_I])
    req = Requests(
        R[:, KC.R_S], R[:, KC.R_O], R[:, KC.R_ARR], R[:, KC.R_FIRST], R[:, KC.R_FIN], R[:, KC.R_NPRE],
        R[:, KC.R_SERVED], R[:, KC.R_WASTED],
    )  # fmt: skip
    return finish(stats, scheduler.name, params, T, arrived, req, plan.dropped, record)
