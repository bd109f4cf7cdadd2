"""Where the paper formula's gap to SGLang comes from: an exact accounting of one SGLang replay.

The same identity as :mod:`kvstab.empirical.decompose` (vLLM's), over the
steady-state window ``W`` of ``T`` steps of a :class:`SglangModelLog` —
SGLang's own log (:func:`~kvstab.empirical.sglang_driver.replay_sglang`) or the
model's (:func:`~kvstab.empirical.sglang_replay.replay_sglang_model`), which
are step-identical: every KV token-step of ``W`` belongs to an attempt that
completes in ``W``, to one a retraction throws away, or to one still in
progress at the end, so

    C / T  =  (Ū − w̄ − ē + ā) / ḡ

and ``ln(μ_paper·b̄ / (C/T))`` splits, exactly, into

    ln(M_paper / M_sglang)        capacity (whole pages: B⌊M/B⌋)
  + ln(M_sglang / Ū)              idle memory, split by SGLang's causes (below)
  + ln(Ū / (Ū − w̄))               retraction waste
  + ln((Ū − w̄)/(Ū − w̄ − ē + ā))   window boundary
  + ln(ḡ / E[g_paper])            the area per request, split along a chain (below).

**The accounting is rebuilt from the log alone.**  A step's ``tokens`` say which
request computed how many tokens; a request holds ``B⌈p/B⌉`` KV tokens for the
``p`` tokens of its current attempt from the step it computed them, through the
step it finishes in (SGLang frees a finished request after the step's forward)
or up to the step that retracts it (``retract_decode`` frees the victim before
the decode).  ``Ū`` is the mean of that memory *during* the step: the log's
``kv_used`` (after the release of the finished requests) plus what the
finished ones held — checked step by step, so a log the accounting does not
explain is refused rather than decomposed.

**Idle memory** (``M − memory`` in a step) is assigned to one cause per step,
in this order, and the log term ``ln(M/Ū)`` is split in proportion to the
idle token-steps of each:

* a *retraction* step: the victims' memory is freed after the step's prefill
  pass, so nothing can use it before the next step;
* *nothing waiting* after the step: idle for want of requests;
* the ``max_running_requests`` *cap*: as many requests hold memory as the cap;
* the *token budget* spent: a prefill step whose page-rounded extends used
  ``chunked_prefill_size`` (or ``max_prefill_tokens``, whichever is smaller),
  requests still waiting — the step was compute-bound, not memory-bound;
* otherwise the admission pass stopped on memory or was not tried, and the
  step's idle memory is split: first what SGLang's reservation held back —
  the running requests' remaining outputs at ``new_token_ratio``
  (``total_offset``'s opening sum, ``schedule_policy.py:677``, at the ratio
  the pass saw), then the whole ``max_new`` and the page of each request the
  step admitted — and the rest goes to the ``batch_is_full`` *flag* when it
  was set as the pass began, no chunk was in flight (so no prefill was tried,
  ``scheduler.py:4098``) and the queue head *would* have passed SGLang's
  admission test ``s + min(max_new − out, clip) + B < free − total_offset``
  (the flag outlives the shortage it records: the reservation shrinks with
  every decode step), else to the head's *own* ``max_new`` when what is left
  would hold the head's prompt and a page but not its whole ``max_new``, else
  to *head-of-line* blocking (not even the head's prompt fits).

The queue is rebuilt too (FCFS arrivals, admissions from its head,
retractions to its tail) and checked against the log's ``queue``.

**Prefill-only steps** are not idle memory: the running requests keep their KV
while a prefill step gives them no token.  Their area is *held but not
progressing*, so it enters through the area per request, as the last link of
the chain (``stall``).

**The area per request** (means over the requests completing in ``W``), link
by link: the sample (``g_paper`` of their ``(s, o)`` vs ``E[g]``); partial
last chunks (exact ``g`` vs the continuous form); output token 1 sampled by the
last prefill step (``max_new − 1`` decode steps) with SGLang's arrival clip of
``max_new``; page rounding (``B⌈·/B⌉``); the retraction's re-prefill (a
retracted request keeps its ``k`` outputs and re-prefills ``s + k`` as one
prompt, ``(s + k, max_new − 1 − k)``); chunks shorter than ``ŝ`` (the prefill
batch's chunk budget is shared, and a chunk is memory-limited after a
retraction); and the stalls (the area a request holds in steps where it
computes nothing — SGLang's prefill-only steps).  Terms are natural logs;
``100·term`` is its share of the gap in log points.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.empirical.decompose import GapDecomposition, area_chain, waste_to_first_token
from kvstab.errors import InvalidArgument
from kvstab.steplog import SglangModelLog

__all__ = ["SGLANG_TERMS", "SglangAccounts", "sglang_accounts", "sglang_window", "decompose_sglang_gap"]

#: (key, label) of every term of SGLang's decomposition, in the accounting's order.
SGLANG_TERMS: tuple[tuple[str, str], ...] = (
    ("capacity", "capacity: M in whole pages of B vs M"),
    ("idle_retraction", "idle memory: freed by a retraction after the prefill pass"),
    ("idle_empty", "idle memory: nothing waiting"),
    ("idle_cap", "idle memory: max_running_requests cap"),
    ("idle_chunk", "idle memory: chunked_prefill_size spent (compute-bound)"),
    ("idle_prefill_tokens", "idle memory: max_prefill_tokens spent (compute-bound)"),
    ("idle_ratio", "idle memory: reserved for running outputs (new_token_ratio)"),
    ("idle_new", "idle memory: reserved for admitted requests' whole max_new"),
    ("idle_full", "idle memory: batch_is_full blocks a head that would fit"),
    ("idle_head_max_new", "idle memory: the head's prompt fits, not its whole max_new"),
    ("idle_head", "idle memory: not even the head's prompt fits (head-of-line)"),
    ("waste", "retraction waste (area thrown away)"),
    ("boundary", "window boundary (work before it, in progress after it)"),
    ("sample", "sample of completed requests vs E[g]"),
    ("partial_chunks", "partial last chunk (exact vs continuous g)"),
    ("first_token", "token 1 sampled by the last prefill step; max_new clip"),
    ("page_rounding", "page rounding B⌈·/B⌉"),
    ("reprefill", "retraction: s + k re-prefilled as one prompt"),
    ("chunks", "prefill chunks shorter than ŝ (shared, memory-limited)"),
    ("stall", "held through prefill-only steps (no decode progress)"),
)

#: The idle-memory terms.
IDLE_TERMS = tuple(k for k, _ in SGLANG_TERMS if k.startswith("idle_"))
#: A step's idle-memory cause: one term, or ``memory`` (split by :func:`decompose_sglang_gap`).
STEP_CAUSES = ("idle_retraction", "idle_empty", "idle_cap", "idle_chunk", "idle_prefill_tokens", "memory")

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class SglangAccounts:
    """The memory accounting of one SGLang log, rebuilt from its steps (see the module docstring)."""

    start: int  # first step of the window
    # per step
    memory: IntArray  # KV tokens held during the step (finished requests included)
    live: IntArray  # requests holding KV during the step
    cause: list[str]  # the step's idle-memory cause (a STEP_CAUSES entry)
    reserved_running: FloatArray  # new_token_ratio × Σ remaining outputs of the running requests, as the pass saw it
    reserved_new: IntArray  # the page, and the whole max_new once the prefill completes, of the step's prefill batch
    flag_binds: BoolArray  # batch_is_full stopped a pass whose queue head would have been admitted
    head_prompt: IntArray  # the prompt and page of the request the pass stopped at (0: none waited)
    # per request (plan order)
    area: IntArray  # area of the attempt that finished (-1 if unfinished)
    area_before: IntArray  # the part of it served before the window
    progress_area: IntArray  # the part of it held in steps where the request computed tokens
    final_s: IntArray  # prompt of that attempt: s + outputs kept from retractions (-1 if unfinished)
    # over the window
    wasted: int  # area of attempts retracted in the window, served in it
    in_progress: int  # area served in the window to attempts still running at the end


def _paged(x: int, B: int) -> int:
    return -(-x // B) * B


def sglang_accounts(log: SglangModelLog, start: int) -> SglangAccounts:
    """Rebuild the per-step memory, queue and per-attempt areas of ``log`` (SGLang's
    ratio regime, ``ignore_eos=False``), the window starting at ``start``.

    Raises :class:`InvalidArgument` when a step's ``kv_used`` or ``queue`` is not
    what its requests give (the log is not one this accounting explains).
    """
    rule, p = log.rule, log.params
    B = p.block
    clip = rule.clip_max_new_tokens
    M = B * (p.M // B)
    chunk_budget = min(_paged(p.chunk, B), rule.max_prefill_tokens)
    chunk_binds = _paged(p.chunk, B) <= rule.max_prefill_tokens
    n = len(log.s)
    n_steps = len(log.steps)
    s = log.s
    max_new = log.max_new
    arrivals: dict[int, list[int]] = {}
    for r, t in enumerate(log.arrival):
        arrivals.setdefault(t, []).append(r)
    queue: deque[int] = deque()
    progress = [0] * n  # tokens of the current attempt
    target = list(s)  # prompt of the current attempt: s + the outputs kept from retractions
    out = [0] * n  # len(output_ids)
    held = [0] * n
    since = [0] * n  # the step from which `held` is held
    decoding = [False] * n
    before = [0] * n  # the current attempt's area served before the window
    inside = [0] * n  # ... and in it
    prog = [0] * n  # ... over the steps it computed tokens
    first_s = list(s)  # prompt of the current attempt, fixed when it starts
    area_out = np.full(n, -1, dtype=np.int64)
    before_out = np.zeros(n, dtype=np.int64)
    prog_out = np.zeros(n, dtype=np.int64)
    final_s = np.full(n, -1, dtype=np.int64)
    memory = np.zeros(n_steps, dtype=np.int64)
    live_n = np.zeros(n_steps, dtype=np.int64)
    res_run = np.zeros(n_steps, dtype=np.float64)
    res_new = np.zeros(n_steps, dtype=np.int64)
    flag_binds = np.zeros(n_steps, dtype=np.bool_)
    head_prompt = np.zeros(n_steps, dtype=np.int64)
    causes: list[str] = []
    total = 0  # Σ held
    n_live = 0
    remaining = 0  # Σ over decoding requests of min(max_new − out, clip)
    wasted = 0

    def accrue(r: int, end: int) -> None:
        h = held[r]
        a = since[r]
        if h and end > a:
            if a < start:
                before[r] += h * (min(end, start) - a)
            if end > start:
                inside[r] += h * (end - max(a, start))
        since[r] = end

    for t, st in enumerate(log.steps):
        queue.extend(arrivals.get(t, ()))
        prev = log.steps[t - 1] if t else None
        ratio = prev.new_token_ratio if prev is not None else rule.ratio_init
        res_run[t] = ratio * remaining
        prefill = st.kind == "prefill"
        if prev is not None and prev.batch_is_full and not prefill and queue:
            # the pass was not tried: would SGLang's admission test (add_one_req) have taken the head?
            h = queue[0]
            need = target[h] + min(max_new[h] - out[h], clip) + B
            flag_binds[t] = need < (M - prev.kv_used) - res_run[t]
        extends = 0
        for r, k in st.tokens:
            accrue(r, t)
            if held[r] == 0:
                n_live += 1
            if prefill:
                if progress[r] == 0:
                    first_s[r] = target[r]
                progress[r] += k
                extends += _paged(k, B)
                res_new[t] += B
                if progress[r] == target[r]:
                    out[r] += 1  # the last prefill step samples an output token
                    decoding[r] = True
                    remaining += min(max_new[r] - out[r], clip)
                    res_new[t] += min(max_new[r], clip)
            else:
                before_rem = min(max_new[r] - out[r], clip)
                progress[r] += k
                out[r] += k
                remaining += min(max_new[r] - out[r], clip) - before_rem
            h = _paged(progress[r], B)
            total += h - held[r]
            held[r] = h
            prog[r] += h
        for r in st.admitted:
            if queue and queue[0] == r:
                queue.popleft()
            elif r in queue:
                queue.remove(r)
        if queue:
            head_prompt[t] = _paged(target[queue[0]], B) + B  # the request the pass stopped at
        for r in st.retracted:
            accrue(r, t)
            if held[r]:
                n_live -= 1
            total -= held[r]
            held[r] = 0
            wasted += inside[r]
            before[r] = inside[r] = prog[r] = progress[r] = 0
            target[r] = s[r] + out[r]
            if decoding[r]:
                remaining -= min(max_new[r] - out[r], clip)
                decoding[r] = False
            queue.append(r)
        memory[t] = total
        live_n[t] = n_live
        for r in st.finished:
            accrue(r, t + 1)
            area_out[r] = before[r] + inside[r]
            before_out[r] = before[r]
            prog_out[r] = prog[r]
            final_s[r] = first_s[r]
            total -= held[r]
            n_live -= 1
            held[r] = 0
            if decoding[r]:
                remaining -= min(max_new[r] - out[r], clip)
                decoding[r] = False
        if total != st.kv_used or len(queue) != st.queue:
            raise InvalidArgument(
                f"step {t} of the {log.source} log: kv_used {st.kv_used} and queue {st.queue}, but its requests "
                f"hold {total} and {len(queue)} wait; the log is not one SGLang's accounting explains"
            )
        # the step's idle-memory cause (exclusive, in STEP_CAUSES order)
        if st.retracted:
            cause = "idle_retraction"
        elif st.queue == 0:
            cause = "idle_empty"
        elif p.max_num_seqs is not None and live_n[t] >= p.max_num_seqs:
            cause = "idle_cap"
        elif prefill and extends >= chunk_budget:
            cause = "idle_chunk" if chunk_binds else "idle_prefill_tokens"
        else:
            cause = "memory"
        causes.append(cause)
    in_progress = 0
    for r in range(n):
        if held[r]:
            accrue(r, n_steps)
        if area_out[r] < 0:
            in_progress += inside[r]
    return SglangAccounts(
        start=start,
        memory=memory,
        live=live_n,
        cause=causes,
        reserved_running=res_run,
        reserved_new=res_new,
        flag_binds=flag_binds,
        head_prompt=head_prompt,
        area=area_out,
        area_before=before_out,
        progress_area=prog_out,
        final_s=final_s,
        wasted=wasted,
        in_progress=in_progress,
    )


def sglang_window(log: SglangModelLog, warmup: float) -> slice:
    """The steps after the warm-up fraction ``warmup`` of the run (at least 8 of them): the
    steady-state window of :func:`~kvstab.empirical.compare.sglang_rate` and of the decomposition."""
    n = len(log.steps)
    start = int(n * warmup)
    if n - start < 8:
        raise InvalidArgument(f"a steady-state window needs at least 8 steps, the run has {n} with warm-up {warmup}")
    return slice(start, n)


def decompose_sglang_gap(
    log: SglangModelLog,
    M_paper: int,
    E_g_paper: float,
    warmup: float = 0.25,
    *,
    requested: npt.ArrayLike | None = None,
) -> GapDecomposition:
    """Decompose ``ln(M_paper / E_g_paper / (C/T))`` for a SGLang log (see the module docstring).

    ``E_g_paper`` is the paper's ``E[g]`` (continuous form, chunk ``ŝ``) of the
    workload the plan was drawn from; ``requested`` the plan's ``max_new_tokens``
    before SGLang's arrival clip (default: the log's, i.e. no clip).  The window
    is the one of :func:`~kvstab.empirical.compare.sglang_rate`.
    """
    if not 0 <= warmup < 1:
        raise InvalidArgument(f"warm-up fraction must be in [0, 1), got {warmup!r}")
    w = sglang_window(log, warmup)
    start = w.start
    T = w.stop - start
    acc = sglang_accounts(log, start)
    p = log.params
    B = p.block
    chunk = p.chunk
    Mu = float(B * (p.M // B))
    done = np.asarray(log.finish, dtype=np.int64) >= start
    C = int(done.sum())
    if C == 0:
        raise InvalidArgument("no request completed in the steady-state window; run longer")
    mu_paper = M_paper / E_g_paper
    mu_meas = C / T
    mem = acc.memory[start:].astype(np.float64)
    U = float(mem.mean())
    before = float(acc.area_before[done].sum())
    wasted = acc.wasted / T
    useful = U - wasted
    if useful <= 0 or useful - (acc.in_progress - before) / T <= 0:
        raise InvalidArgument("the window's memory is all wasted area; the decomposition is undefined")

    # idle token-steps by cause; a step stopped on memory splits: reservation first, then the flag or the head
    idle = Mu - mem
    shares = dict.fromkeys(IDLE_TERMS, 0.0)
    for j, cause in enumerate(acc.cause[start:]):
        x = float(idle[j])
        if cause != "memory":
            shares[cause] += x
            continue
        t = start + j
        ratio_part = min(x, float(acc.reserved_running[t]))
        new_part = min(x - ratio_part, float(acc.reserved_new[t]))
        shares["idle_ratio"] += ratio_part
        shares["idle_new"] += new_part
        rest = x - ratio_part - new_part
        if acc.flag_binds[t]:
            shares["idle_full"] += rest
        elif rest >= acc.head_prompt[t]:
            shares["idle_head_max_new"] += rest
        else:
            shares["idle_head"] += rest
    idle_total = float(idle.sum())
    ln_idle = float(np.log(Mu / U))

    s = np.asarray(log.s, dtype=np.int64)[done]
    mn = np.asarray(log.max_new, dtype=np.int64)[done]
    o = mn if requested is None else np.asarray(requested, dtype=np.int64)[: len(log.s)][done]
    a_paper, a_exact, a_first, a_page, a_resumed = area_chain(s, o, mn, acc.final_s[done], chunk, B)
    a_progress = float(acc.progress_area[done].mean())
    a_final = float(acc.area[done].mean())

    terms = {
        "capacity": float(np.log(M_paper / Mu)),
        **{k: (ln_idle * shares[k] / idle_total if idle_total > 0 else 0.0) for k in IDLE_TERMS},
        **waste_to_first_token(U, useful, acc.in_progress - before, T, E_g_paper, a_paper, a_exact, a_first),
        "page_rounding": float(np.log(a_page / a_first)),
        "reprefill": float(np.log(a_resumed / a_page)),
        "chunks": float(np.log(a_progress / a_resumed)),
        "stall": float(np.log(a_final / a_progress)),
    }
    return GapDecomposition.of(mu_paper, mu_meas, terms, T, C, labels=SGLANG_TERMS)
