"""SGLang 0.5.23's scheduler with its radix cache on: the reference model, step by step.

With the radix cache on (SGLang's default), a request's KV is shared through
the tree of :mod:`kvstab.radix_cache`, and the scheduler's admission, eviction
and queue order all read it.  :class:`SglangRadixEngine` runs one
``Scheduler.get_next_batch_to_run`` step (``srt/managers/scheduler.py:3894``)
and the result processing after it, in SGLang's order (line numbers into
sglang 0.5.23's ``srt/``; ``docs/MODEL.md``, "SGLang with its radix cache"):

1. **The in-flight chunk is checkpointed** (``stash_chunked_request``,
   ``scheduler.py:3770``): its computed tokens are inserted into the tree and
   its lock moves to their last node (``checkpoint_into_tree``,
   ``mem_cache/unified_radix_cache.py:1164``).  Then the last prefill batch
   joins the running batch, finished requests leave it, and the
   ``batch_is_full`` flag clears when a request left (``:3951``, ``:3968``).
2. **Queue order** (``SchedulePolicy.calc_priority``,
   ``managers/schedule_policy.py:213``).  Under ``lpm`` with at most 128
   waiting, every waiting request is matched against the tree in queue order
   (its whole sequence), and one whose hit is at most 32 tokens is matched
   against a scratch tree of the queue itself: a match of 32 or more there
   *deprioritizes* it (another waiting request will cache that prefix first),
   else its sequence joins the scratch tree (``_compute_prefix_matches``, ``:346``).  The queue is
   then sorted, stably, by the longest hit first, the deprioritized last
   (``:441``).  Under ``fcfs`` (or more than 128 waiting) the queue keeps its
   order, and every 32nd pass touches the first 128 waiting prefixes, the
   head last (``_touch_waiting_prefixes``, ``:282``;
   ``SGLANG_ENABLE_WAITING_PREFIX_REFRESH`` is on by default).
3. **Admission** (``PrefillAdder``, ``:607``): the chunk continues first
   (``add_chunked_req``, ``:1140``); then each waiting request in that order is
   matched again, capped at its length − 1 (``init_next_round_input``,
   ``schedule_batch.py:1692``), and tested with its hit's path pinned
   (``add_one_req``, ``:1395``; ``_lock_node``, ``:1225``): it needs
   ``extend + min(max_new − out, clip) + 1 < available + evictable − total_offset``
   (``mem_cache/prefill_budget.py:100``, ``:114``), with ``extend`` the
   tokens past its hit.  An admitted request locks its hit's path for good
   (``_commit_prefill_admission``, ``:1685``), which takes that path out of the
   evictable tokens the next candidate sees.  The budgets, the chunking, the
   flag and ``total_offset`` are the no-cache rule's (:mod:`kvstab.schedulers.sglang`).
4. **Allocation evicts** (``alloc_token_slots``, ``mem_cache/allocation.py:152``):
   a prefill batch needs its extend tokens, a decode step one token a request;
   when fewer are free, unlocked leaves are evicted, least recently used first,
   until they are (``allocator/base.py:155``).
5. **Results** (``batch_result_processor.py:258``): a request whose prefill
   completed and that is not finished is checkpointed (its prompt, and the
   outputs it resumed with, go into the tree, ``:394``); a finished request is
   released with a checkpoint: its prompt and every output but the last go into
   the tree, and a second insert of the prompt splits the leaf at the prompt's
   end (``unified_radix_cache.py:1260``); then its lock is dropped
   (``mem_cache/common.py:400``).  What a request computed that the tree
   already held is freed (the insert's duplicates).
6. **Decode** (``update_running_batch``, ``scheduler.py:4459``):
   ``check_decode_mem`` evicts before it tests (``allocator/base.py:171``); a
   retraction releases the victim *without* a checkpoint (its unpublished
   tokens are freed, its lock dropped), then evicts until ``20`` tokens per
   request still running are free (``release_req``, ``schedule_batch.py:2389``);
   the victim keeps its outputs and later matches the tree again.

Memory is the allocator's: tokens in the tree (locked or evictable) plus each
request's tokens not in it (:attr:`SglangRadixEngine.used`).  kvstab models the
cache at ``page_size = 1`` (SGLang's default; a paged allocator over-reserves
pages at eviction time, which is not modelled): :func:`check_radix_server`
refuses other page sizes.

A request's tokens are real ids built from the plan's prefix structure
(:func:`request_tokens`, :func:`answer_tokens`), the same ids the cross-check
gives SGLang's own scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang import clip_max_new
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, PromptSet, content_id, token_ids
from kvstab.radix_cache import RadixCache, RadixNode
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import SimResult
from kvstab.steplog import SglangModelLog, SglangStep
from kvstab.validation import MAX_SLOTS

__all__ = [
    "SglangRadixEngine",
    "RadixRequest",
    "check_radix_server",
    "request_tokens",
    "answer_tokens",
    "replay_radix",
    "simulate_radix",
    "VOCAB",
    "EOS",
]

#: the vocabulary of the simulated model (the driver's ``model_config.vocab_size``)
VOCAB = 32_000
#: SGLang's EOS id in the cross-check; token ids start above it, so no output ever stops early
EOS = 2
_FIRST_ID = EOS + 1
#: ``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` and ``..._DEPRIORITIZE_THRESHOLD`` (``schedule_policy.py:110``, ``:116``)
IN_BATCH_CHECK = 32
IN_BATCH_DEPRIORITIZE = 32
#: ``WAITING_QUEUE_PREFIX_MATCH_MAX`` and ``WAITING_PREFIX_REFRESH_INTERVAL`` (``schedule_policy.py:137``, ``:139``)
MATCH_MAX = 128
REFRESH_INTERVAL = 32


def _ids(prompt: Prompt) -> list[int]:
    """Token ids of ``prompt`` in ``[EOS + 1, VOCAB)``: never SGLang's EOS."""
    return (token_ids(prompt, VOCAB - _FIRST_ID) + _FIRST_ID).tolist()


def request_tokens(prompts: PromptSet | None, rid: int, s: int) -> list[int]:
    """Request ``rid``'s prompt as token ids: its segments from ``prompts``, else ``s`` tokens of its own."""
    if prompts is None:
        return _ids(Prompt(((content_id("own", rid), s),)))
    return _ids(prompts.prompt(rid))


def answer_tokens(prompts: PromptSet | None, rid: int, n: int) -> list[int]:
    """The ``n`` tokens request ``rid`` samples: the plan's output content (a conversation's next
    turn holds it in its prompt), else content of its own."""
    out = content_id("output", rid) if prompts is None or prompts.output is None else int(prompts.output[rid])
    return _ids(Prompt(((out, n),)))


def check_radix_server(params: ModelParams) -> ModelParams:
    """``params`` if the radix-cache model runs on it: one token a page (see the module docstring)."""
    if params.block != 1:
        raise InvalidArgument(
            f"sglang: SGLang's radix cache is not modelled for pages of more than one token (kvstab models "
            f"page_size = 1, SGLang's default), got block={params.block}; use --block 1 or --prefix-caching off"
        )
    if params.token_budget is not None:
        raise InvalidArgument(
            f"sglang: SGLang has no token budget shared by all requests, got token_budget={params.token_budget}"
        )
    return params


@dataclass(slots=True, eq=False)
class RadixRequest:
    """One SGLang request as the model tracks it (SGLang's own fields, ``managers/schedule_batch.py``)."""

    rid: int
    origin: list[int]  # origin_input_ids
    answer: list[int]  # every output token it will sample
    max_new: int  # sampling_params.max_new_tokens after the arrival clip
    out: int = 0  # len(output_ids)
    kv: int = 0  # kv_committed_len: tokens with KV
    protected: int = 0  # kv.cache_protected_len: tokens of its row the tree owns
    prefix_len: int = 0
    extend_end: int = 0
    node: RadixNode | None = None  # last_node of its last match
    lock: RadixNode | None = None  # the node its tree lock holds
    retractions: int = 0
    recomputed: int = 0
    area: int = 0  # KV token-slots held, every attempt (kvstab's served area)
    attempt_area: int = 0  # the area of the current attempt (wasted if it is retracted)
    wasted: int = 0
    first_admit: int = -1
    finish: int = -1
    matched: int = 0  # num_matched_prefix_tokens

    @property
    def fill(self) -> list[int]:
        """``origin_input_ids + output_ids``."""
        return self.origin + self.answer[: self.out]

    @property
    def private(self) -> int:
        """Tokens of KV it holds outside the tree."""
        return self.kv - self.protected


@dataclass(slots=True)
class _Adder:
    """A ``PrefillAdder``'s budgets for one prefill pass."""

    total_offset: float
    current_offset: float
    rem_chunk: int
    rem_input: int
    can_run: list[RadixRequest] = field(default_factory=list)
    new_chunked: RadixRequest | None = None


class SglangRadixEngine:
    """SGLang's scheduler with the radix cache on, over the server ``params`` (see the module docstring)."""

    def __init__(self, rule: Sglang, params: ModelParams, rows: int) -> None:
        self.rule = rule
        self.params = check_radix_server(params)
        self.tree = RadixCache(1)
        self.rows = rows  # max_running_requests (the request-row table)
        self.waiting: list[RadixRequest] = []
        self.running: list[RadixRequest] = []
        self.full = False  # running_batch.batch_is_full
        self.chunked: RadixRequest | None = None
        self.last_prefill: list[RadixRequest] | None = None  # last_batch when it was a prefill batch
        self.ratio = rule.ratio_init
        self.requests: list[RadixRequest] = []
        self._refresh_calls = 0
        self.flag_at_prefill: list[bool] = []
        self.live: list[RadixRequest] = []  # requests holding KV (admitted, not released)
        self.slot_wasted = 0  # area thrown away by this step's retractions

    # ---- memory ---------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """KV tokens the allocator has handed out: the tree's, and each live request's own."""
        return self.tree.total_size + sum(r.private for r in self.live)

    @property
    def available(self) -> int:
        """``allocator.available_size()``."""
        return self.params.M - self.used

    def _evict_for(self, tokens: int) -> None:
        """``evict_to_free_tokens``: evict the shortfall, if any."""
        short = tokens - self.available
        if short > 0:
            self.tree.evict(short)

    # ---- the tree operations on a request ---------------------------------------------------

    def _match(self, r: RadixRequest, capped: bool) -> None:
        """``match_kv_cache``: the hit becomes the request's prefix (capped at length − 1 when admitting)."""
        fill = r.fill
        limit = max(len(fill) - 1, 0) if capped else None
        m = self.tree.match(fill, limit)
        r.prefix_len = m.length
        r.node = m.node
        r.matched = min(m.length, max(len(fill) - 1, 0))

    def _checkpoint(self, r: RadixRequest, up_to: int, *, finished: bool) -> None:
        """``checkpoint_into_tree``: insert ``fill[:up_to]``, free the duplicates, move the lock."""
        fill = r.fill[:up_to]
        _, last = self.tree.insert(fill)
        if finished and 0 < len(r.origin) < len(fill):
            self.tree.insert(r.origin)  # splits the leaf at the prompt's end
        # the tree owns [0, up_to) now: the request's own copies of it are freed or given to the tree
        r.protected = up_to
        if r.lock is not None:
            self.tree.unlock(r.lock)
        # the prompt's insert may split the path above it, but ``last`` still ends at ``up_to``
        self.tree.lock(last)
        r.lock = last
        r.node = last

    def _release(self, r: RadixRequest, *, checkpoint: bool) -> None:
        """``release_kv_cache``: with ``checkpoint`` the tree keeps the KV, else it is freed; the lock is dropped."""
        if checkpoint:
            self._checkpoint(r, r.kv, finished=True)
        if r.lock is not None:
            self.tree.unlock(r.lock)
        r.lock = None
        r.kv = 0
        r.protected = 0
        self.live.remove(r)

    # ---- arrival ----------------------------------------------------------------------------

    def arrive(self, prompt: list[int], max_new: int, answer: list[int]) -> RadixRequest:
        """A request with token ids ``prompt`` and ``max_new_tokens`` arrives (SGLang's arrival clip
        applies); it samples the tokens ``answer`` (at least as many as its clipped ``max_new``)."""
        s = len(prompt)
        clipped = clip_max_new(self.rule, self.params, s, max_new)
        if clipped < 1:
            raise InvalidArgument(f"request (s={s}, max_new={max_new}): SGLang clips max_new_tokens to 0")
        r = RadixRequest(len(self.requests), list(prompt), answer, clipped)
        self.requests.append(r)
        self.waiting.append(r)
        return r

    # ---- one step ---------------------------------------------------------------------------

    def step(self, t: int) -> SglangStep:
        """One ``get_next_batch_to_run`` and its result; the step's record."""
        rule = self.rule
        # 1. the chunk's checkpoint, then last batch joins the running batch (scheduler.py:3921-3968)
        if self.chunked is not None and self.chunked.extend_end > self.chunked.prefix_len:
            c = self.chunked
            self._checkpoint(c, c.extend_end, finished=False)
            c.prefix_len = c.extend_end
        if self.last_prefill is not None:
            last = self.last_prefill
            kept = [r for r in last if r is not self.chunked and r.finish < 0]
            if len(kept) < len(last):
                self.full = False
            if kept and not self.running:
                self.running = kept
                self.full = False  # the prefill batch becomes the running batch, its own flag clear
            elif kept:
                self.running = self.running + kept
        self.last_prefill = None
        before_running = len(self.running)
        self.running = [r for r in self.running if r.finish < 0]
        if len(self.running) < before_running:
            self.full = False

        batch = self._prefill(t)
        if batch is not None:
            return self._prefill_result(t, batch)
        if self.running:
            return self._decode(t)
        if not self.waiting and self.chunked is None:
            self.ratio = rule.ratio_init  # on_idle
        return self._record(t, "idle", [], [], [], [])

    def _allocatable(self, running_bs: int) -> int:
        """``get_num_allocatable_reqs`` (``scheduler.py:4027``): the rows left; a continuing chunk
        holds its row, which it counts back as held, so this is ``rows − running``."""
        return self.rows - running_bs

    def _calc_priority(self) -> None:
        """``SchedulePolicy.calc_priority`` (see the module docstring, item 2)."""
        q = self.waiting
        lpm = self.rule.schedule_policy == "lpm" and len(q) <= MATCH_MAX
        if lpm:
            scratch = RadixCache(1)
            deprioritized: set[int] = set()
            for r in q:
                self._match(r, capped=False)
                if r.prefix_len <= IN_BATCH_CHECK:
                    if scratch.match(r.fill).length >= IN_BATCH_DEPRIORITIZE:
                        deprioritized.add(r.rid)
                    else:
                        scratch.insert(r.fill)
            q.sort(key=lambda r: float("inf") if r.rid in deprioritized else -r.matched)
            return
        if q:
            refresh = self._refresh_calls % REFRESH_INTERVAL == 0
            self._refresh_calls += 1
            if refresh:
                for r in reversed(q[:MATCH_MAX]):
                    self.tree.match(r.fill)

    def _budget_state(self, a: _Adder, evictable: int | None = None) -> str:
        room = self.available + (self.tree.evictable_size if evictable is None else evictable)
        if not (room - a.total_offset > 0 and room - a.current_offset > 0):
            return "no_token"
        if a.rem_input <= 0 or a.rem_chunk <= 0:
            return "other"
        return "continue"

    def _reserve(self, a: _Adder, extend: int, max_new: int) -> None:
        a.total_offset += extend + 1 + max_new
        a.current_offset += extend + 1
        a.rem_chunk -= extend
        a.rem_input -= extend

    def _prefill(self, t: int) -> list[RadixRequest] | None:
        """``_get_new_batch_prefill_raw`` (``scheduler.py:4079``): the prefill batch, or ``None``."""
        rule = self.rule
        self.flag_at_prefill.append(self.full)
        if not self.running:
            self.full = False
        if (self.full or not self.waiting) and self.chunked is None:
            return None
        running_bs = len(self.running)
        if self._allocatable(running_bs) <= 0 and self.chunked is None:
            self.full = True
            return None
        self._calc_priority()
        clip = rule.clip_max_new_tokens
        offset = 0.0
        for r in self.running:
            offset += min(max(r.max_new - r.out, 0), clip) * self.ratio
        a = _Adder(offset, 0.0, self.params.chunk, rule.max_prefill_tokens)
        c = self.chunked
        if c is not None:
            # add_chunked_req: min(rem_chunk, int(remaining_total)), the whole rem_chunk when not positive
            remaining = self.available + self.tree.evictable_size - a.total_offset
            rem = min(a.rem_chunk, int(remaining))
            rem = rem if rem > 0 else a.rem_chunk
            cand = len(c.fill) - c.prefix_len
            truncated = cand > rem
            new_len = min(cand, rem)
            c.extend_end = c.prefix_len + new_len
            a.can_run.append(c)
            self._reserve(a, new_len, 0 if truncated else min(c.max_new, clip))
            self.chunked = c if truncated else None
        for r in list(self.waiting):
            if self._budget_state(a) == "other":
                break
            if len(a.can_run) >= self._allocatable(len(self.running)):
                self.full = True
            if self.full:
                break
            self._match(r, capped=True)
            res = self._add_one(a, r)
            if res != "continue":
                if res == "no_token":
                    self.full = len(a.can_run) > 0 or bool(self.running)
                break
        if not a.can_run:
            return None
        chosen = set(map(id, a.can_run))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        if a.new_chunked is not None:
            self.chunked = a.new_chunked
        # prepare_for_extend: allocate the extend tokens, evicting the shortfall
        need = sum(r.extend_end - r.prefix_len for r in a.can_run)
        self._evict_for(need)
        if need > self.available:
            raise InvalidArgument(f"step {t}: the prefill batch needs {need} tokens, {self.available} are free")
        for r in a.can_run:
            if r.kv == 0:
                self.live.append(r)
            r.kv = r.extend_end
        return a.can_run

    def _add_one(self, a: _Adder, r: RadixRequest) -> str:
        """``add_one_req`` (``schedule_policy.py:1395``) with the hit's path pinned for the test."""
        clip = self.rule.clip_max_new_tokens
        max_new = min(max(r.max_new - r.out, 0), clip)
        extend = len(r.fill) - r.prefix_len
        total = extend + max_new + 1
        node = r.node
        assert node is not None
        self.tree.lock(node)
        try:
            remaining = self.available + self.tree.evictable_size - a.total_offset
            if not total < remaining:
                return "no_token"
            chunked = extend > a.rem_chunk
            reserve_new = min(r.max_new, clip)
            if chunked:
                extend = a.rem_chunk
                if extend <= 0:
                    return "other"
                reserve_new = 0
        finally:
            self.tree.unlock(node)
        r.extend_end = r.prefix_len + extend
        self.tree.lock(node)
        r.lock = node
        r.protected = r.prefix_len
        a.can_run.append(r)
        if chunked:
            a.new_chunked = r
        self._reserve(a, extend, reserve_new)
        return self._budget_state(a)

    def _prefill_result(self, t: int, batch: list[RadixRequest]) -> SglangStep:
        """``process_batch_result_prefill`` for a plain generation request, its token simulated."""
        work = [(r.rid, r.extend_end - r.prefix_len) for r in batch]
        done: list[int] = []
        for r in batch:
            if r.first_admit < 0:
                r.first_admit = t
            if r is self.chunked:
                continue  # a middle chunk samples nothing
            r.out += 1
            if r.out >= r.max_new:
                r.finish = t
                done.append(r.rid)
                self._release(r, checkpoint=True)
            else:
                self._checkpoint(r, r.extend_end, finished=False)
                r.prefix_len = r.extend_end
        self.last_prefill = batch
        return self._record(t, "prefill", [], [], done, work, prefill=sum(n for _, n in work))

    def _decode(self, t: int) -> SglangStep:
        """``update_running_batch`` and ``process_batch_result_decode``."""
        rule = self.rule
        batch = self.running
        initial = len(batch)
        retracted: list[RadixRequest] = []
        self._evict_for(len(batch))
        if self.available < len(batch):
            # _get_decode_retraction_order: most outputs kept first, then the shorter prompt; ties in batch order
            order = sorted(range(len(batch)), key=lambda i: (-batch[i].out, len(batch[i].origin), i))
            first = True
            while first or not self._fits(len(order)):
                if len(order) == 1:
                    break
                first = False
                i = order.pop()
                r = batch[i]
                r.recomputed += r.kv
                r.wasted += r.attempt_area
                self.slot_wasted += r.attempt_area
                r.attempt_area = 0
                self._release(r, checkpoint=False)
                self._evict_for(len(order) * rule.retract_decode_steps)
                r.retractions += 1
                r.prefix_len = 0
                r.node = None
                retracted.append(r)
            if not self._fits(len(order)):
                # retract_decode aborts the last request (schedule_batch.py:3508); SGLang cannot serve it
                raise InvalidArgument(
                    f"step {t}: SGLang aborts request {batch[order[0]].rid}: out of memory even after retracting "
                    "all other requests in the decode batch"
                )
            keep = [batch[i] for i in order]
            self.running = keep
            n_kept = len(keep)
            sum_out = sum(r.out for r in keep)
            sum_max = sum(r.max_new for r in keep)
            self.ratio = min(1.0, (sum_out + rule.retract_decode_steps * n_kept) / (sum_max + 1))
            self.waiting.extend(retracted)
        else:
            self.ratio = max(self.ratio - rule.ratio_decay, rule.ratio_min)
        if len(self.running) < initial:
            self.full = False
        batch = self.running
        self._evict_for(len(batch))
        work: list[tuple[int, int]] = []
        done: list[int] = []
        for r in batch:
            r.kv += 1
            r.out += 1
            work.append((r.rid, 1))
            if r.out >= r.max_new:
                r.finish = t
                done.append(r.rid)
                self._release(r, checkpoint=True)
        return self._record(t, "decode", [], [r.rid for r in retracted], done, work, decode=len(work))

    def _fits(self, n: int) -> bool:
        self._evict_for(n)
        return self.available >= n

    def account(self) -> int:
        """Charge this step's area (each live request's KV, shared tokens to each holder); requests running."""
        for r in self.live:
            r.area += r.kv
            r.attempt_area += r.kv
        return len(self.live)

    def _record(
        self,
        t: int,
        kind: str,
        admitted: list[int],
        retracted: list[int],
        done: list[int],
        work: list[tuple[int, int]],
        *,
        prefill: int = 0,
        decode: int = 0,
    ) -> SglangStep:
        after = (self.used, self.ratio, self.full, len(self.waiting))
        return SglangStep.collected(t, kind, (admitted, retracted, done, work), (prefill, decode), after)


def replay_radix(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int | None = None,
    *,
    max_steps: int = MAX_SLOTS,
) -> SglangModelLog:
    """Replay ``plan`` (``o`` = SGLang's ``max_new_tokens``) on :class:`SglangRadixEngine`, its
    token ids built from the plan's prompts (:func:`request_tokens`): ``steps`` steps, or
    (``None``) until every request has arrived and finished."""
    start = time.perf_counter()
    n = len(plan)
    rows = params.max_num_seqs if params.max_num_seqs is not None else max(n, 1) + 1
    eng = SglangRadixEngine(rule, params, rows)
    prompts = plan.prompts
    arrival: list[int] = []
    log: list[SglangStep] = []
    i = t = 0
    while (t < steps) if steps is not None else (i < n or any(r.finish < 0 for r in eng.requests)):
        if t >= max_steps:
            raise InvalidArgument(f"the SGLang radix model did not drain within {max_steps} steps")
        while i < n and int(plan.slot[i]) <= t:
            eng.arrive(request_tokens(prompts, i, int(plan.s[i])), int(plan.o[i]), answer_tokens(prompts, i, int(plan.o[i])))
            arrival.append(t)
            i += 1
        chunk_before = eng.chunked
        n_flags = len(eng.flag_at_prefill)
        rec = eng.step(t)
        if rec.kind == "prefill":
            # the chunk carried over from the previous step is not an admission
            rec = replace(
                rec, admitted=tuple(rid for rid, _ in rec.tokens if chunk_before is None or rid != chunk_before.rid)
            )
        if len(eng.flag_at_prefill) > n_flags and log:
            log[-1] = replace(log[-1], batch_is_full=int(eng.flag_at_prefill[-1]))
        log.append(rec)
        t += 1
    reqs = eng.requests
    # the outcomes after the last step, before the pass below that only reads the flag
    outcomes = {
        "max_new": tuple(r.max_new for r in reqs),
        "first_admit": tuple(r.first_admit for r in reqs),
        "finish": tuple(r.finish for r in reqs),
        "retractions": tuple(r.retractions for r in reqs),
        "recomputed": tuple(r.recomputed for r in reqs),
    }
    if log:
        n_flags = len(eng.flag_at_prefill)
        if eng.waiting or eng.running or eng.chunked is not None or eng.last_prefill is not None:
            eng.step(t)
        if len(eng.flag_at_prefill) > n_flags:
            log[-1] = replace(log[-1], batch_is_full=int(eng.flag_at_prefill[-1]))
    return SglangModelLog(
        rule=rule,
        params=params,
        steps=tuple(log),
        s=tuple(int(x) for x in plan.s[:i]),
        arrival=tuple(arrival),
        wall_s=time.perf_counter() - start,
        engine="reference (radix cache)",
        **outcomes,  # type: ignore[arg-type]
    )



def simulate_radix(
    rule: Sglang,
    params: ModelParams,
    plan: ArrivalPlan,
    slots: int | None = None,
    *,
    drain: bool = False,
    max_slots: int = MAX_SLOTS,
    spec: str = "sglang",
) -> SimResult:
    """:func:`kvstab.simulator.simulate`'s result for the ``sglang`` rule with SGLang's radix cache:
    one SGLang step a slot, ``slots`` slots or (``drain``) until every request has finished.
    Lengths are kvstab's under SGLang's lifecycle (``o = max_new − 1``, ``kvstab.lifecycles.sglang``);
    ``memory`` is the allocator's (shared tokens once, evictable cache included), a request's
    ``served`` area counts the tokens its KV spans, shared ones included."""
    if slots is None and not drain:
        raise InvalidArgument("simulate_radix needs a number of slots, or drain=True")
    n = len(plan)
    rows = params.max_num_seqs if params.max_num_seqs is not None else max(n, 1) + 1
    eng = SglangRadixEngine(rule, params, rows)
    prompts = plan.prompts
    cols: dict[str, list[int]] = {k: [] for k in
                                  ("arrived", "admitted", "preempted", "completed", "running", "memory", "wasted",
                                   "tokens", "queue")}
    arrival: list[int] = []
    i = t = 0
    while (t < slots) if slots is not None and not drain else (i < n or any(r.finish < 0 for r in eng.requests)):
        if t >= max_slots:
            raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
        came = 0
        while i < n and int(plan.slot[i]) <= t:
            eng.arrive(request_tokens(prompts, i, int(plan.s[i])), int(plan.o[i]),
                       answer_tokens(prompts, i, int(plan.o[i])))
            arrival.append(t)
            i += 1
            came += 1
        chunk_before = eng.chunked
        eng.slot_wasted = 0
        rec = eng.step(t)
        running = eng.account()
        for k, v in (
            ("arrived", came),
            ("admitted", sum(1 for rid, _ in rec.tokens if rec.kind == "prefill"
                             and (chunk_before is None or rid != chunk_before.rid))),
            ("preempted", len(rec.retracted)),
            ("completed", len(rec.finished)),
            ("running", running),
            ("memory", rec.kv_used),
            ("wasted", eng.slot_wasted),
            ("tokens", rec.prefill_tokens + rec.decode_tokens),
            ("queue", rec.queue),
        ):
            cols[k].append(v)
        t += 1
    reqs = eng.requests
    arr = lambda xs: np.asarray(xs, dtype=np.int64)  # noqa: E731
    return SimResult(
        scheduler=spec,
        params=params,
        slots=t,
        **{k: arr(v) for k, v in cols.items()},  # type: ignore[arg-type]
        s=arr([len(r.origin) for r in reqs]),
        o=arr([r.max_new - 1 for r in reqs]),
        arrival=arr(arrival),
        first_admit=arr([r.first_admit for r in reqs]),
        finish=arr([r.finish for r in reqs]),
        preemptions=arr([r.retractions for r in reqs]),
        served=arr([r.area for r in reqs]),
        request_wasted=arr([r.wasted for r in reqs]),
        dropped=plan.dropped,
    )
