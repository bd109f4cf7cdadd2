"""``sglang``: SGLang 0.5.23's scheduler (FCFS, no radix cache, no mixed chunk, no overlap).

This is SGLang with ``--disable-radix-cache``; with its radix cache on (prefix caching), the
model is :mod:`kvstab.lifecycles.sglang_radix`, which reads this rule's knobs (``schedule_policy``
among them) and follows the same admission arithmetic with the tree's evictable memory.

The decision of one step of ``Scheduler.get_next_batch_to_run``
(``srt/managers/scheduler.py:3894``), written once against ``ops``.  Line
numbers below are into sglang 0.5.23's ``srt/``.

**A step is a prefill step whenever a prefill batch can be formed, else a
decode step** (``scheduler.py:3992``): running requests make no progress in a
prefill step (their grant is 0), and a decode step gives every running
request one token.

*Prefill* (``_get_new_batch_prefill_raw``, ``scheduler.py:4079``) is tried
when the in-flight chunked request exists, or when the queue is non-empty and
the ``batch_is_full`` flag is clear.  A ``PrefillAdder``
(``schedule_policy.py:607``) starts with

* ``total_offset = Σ_running min(max_new − out, clip) · new_token_ratio``
  over the running (decoding) requests in batch order (``:785``), a float;
* ``rem_chunk = chunked_prefill_size`` (kvstab's ``ŝ``), and
  ``rem_input = max_prefill_tokens``;

and ``remaining_total = free − total_offset`` (``mem_cache/prefill_budget.py:100``),
``free = M − Σ held``.  The chunked request goes first
(``add_chunked_req``, ``:1140``): it takes ``min(rem_chunk, ⌊remaining_total⌋)``
prompt tokens (``rem_chunk`` when that is not positive) and reserves its
chunk, a page, and on its last chunk its ``min(max_new, clip)``.  Then
waiting requests in queue order (``add_one_req``, ``:1395``): stop when a
budget is spent (``rem_input ≤ 0`` or ``rem_chunk ≤ 0``), or the running
count reaches ``max_running_requests`` (sets the flag); a request is admitted
iff ``s + min(max_new − out, clip) + B < remaining_total`` (``prefill_budget.py:114``;
``NO_TOKEN`` sets the flag when anything runs or was admitted, and stops);
it is chunked if ``B⌈s/B⌉ > rem_chunk`` (``⌊rem_chunk/B⌋·B`` tokens, no
reservation of its outputs yet), else taken whole with ``min(max_new, clip)``
reserved; the reservation adds ``B⌈extend/B⌉ + B (+ max_new)`` to
``total_offset`` and ``B⌈extend/B⌉`` to both budgets; after it, a budget
that is spent or a ``remaining_total ≤ 0`` stops the walk.  The float
arithmetic follows SGLang's order (Python's ``sum`` over the running list,
then one addition per admission), so the concrete rule takes SGLang's branch
on every tie.

*Decode* (``update_running_batch``, ``scheduler.py:4459``):
``check_decode_mem`` (``schedule_batch.py:3432``) asks a new page for each
request whose length is a multiple of ``B``; if they do not fit, requests are
retracted (``retract_decode``, ``:3451``) in the order of
``_get_decode_retraction_order`` (``:3542``): fewest output tokens first,
ties longest original prompt first, then the latest in batch order; at least
one is always retracted and at least one always kept.  After a retraction
the ratio becomes ``min(1, (Σ out + 20·n) / (Σ max_new + 1))`` over the kept
requests (``new_token_ratio_tracker.py:41``); otherwise it decays by
``(init − min)/600`` down to ``min`` (``:33``).

**State** (``state_vars``): ``new_token_ratio`` (real, in ``[0, 1]``: a
retraction can set it below the decay floor, and the next decay lifts it back
to the floor; an idle step, with nothing running or waiting, resets it to its
initial value, ``scheduler.py:5318``) and ``batch_is_full`` (0/1).  The flag is cleared at the start
of the next step when a request leaves the running batch — one finishing,
one retracted, or a prefill batch whose chunked request continues
(``scheduler.py:3951``, ``:3968``, ``:4545``) — so the rule clears it in the
step that causes it.  While it is set and no chunk is in flight, no prefill is
tried, however much memory a finish has not yet freed.

**kvstab's lengths.**  kvstab's ``o`` plays SGLang's ``max_new_tokens``: SGLang
knows it at admission, so the rule is *clairvoyant*.  SGLang samples output
token 1 in the last prefill step, so a SGLang request ``(s, max_new)`` is a
kvstab request ``(s, max_new − 1)``, and ``max_new − out = s + o − p`` for a
decoding request at progress ``p``.  A retracted request resumes by
re-prefilling its prompt and its ``k`` outputs (``kvstab/lifecycles/sglang.py``:
kvstab lengths ``(s + k, o − k)``, like vLLM's recompute); SGLang still counts
its original prompt and outputs, which the rule reads as ``prior = k`` when
the engine shows it (``getattr(entry, "prior", 0)``: 0 in kvstab's own
lifecycle, where a victim restarts from scratch).

**One deviation, outside SGLang's reachable states:** an empty system (nothing
active, nothing admitted yet) admits the queue head whatever the reservation
says.  SGLang clips ``max_new`` at arrival so that ``s + max_new + B < M``
(``scheduler.py:2700``, ``init_req_max_new_tokens``) — the head always fits an
empty pool there — while kvstab's engine accepts any request with
``s + o ≤ M``, which SGLang's strict test would starve.  A chunk is never
granted more than free memory (SGLang's allocation would fail; its chunk is
``min(rem_chunk, ⌊remaining_total⌋)``, which after a retraction can be below
``rem_chunk`` but stays within free memory in its reachable states).
SGLang's own scheduler checks all of this step for step
(``tests/empirical/test_empirical_sglang.py``).  A chunk
``ŝ`` that is not a whole number of pages, which SGLang refuses
(``chunked_prefill_size % page_size == 0``, ``arg_groups/validation_hook.py:244``),
is rounded up to pages for the batch's budget (the engine still clamps each
request to ``ŝ`` tokens a slot).

Traits: FCFS of first admissions holds (retracted requests rejoin the tail
and are re-admissions), the rule preempts (retraction), it reads ``o``, and it
is not work-conserving (the reservation and the flag leave memory idle), and it
stalls running requests (a prefill step gives them no token), so its drain is
bounded by the work left, not by ``n(s) + o`` per request (property 8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvstab.contract import (
    ActiveEntry,
    Decision,
    StateVar,
    Traits,
    View,
    WaitingEntry,
    any_of,
    count_of,
    retract_until_fits,
    scan,
    select,
    sum_of,
    zipped,
)
from kvstab.errors import InvalidArgument
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["Sglang", "SCHEDULER", "SCHEDULE_POLICIES"]

#: the ``--schedule-policy`` values kvstab models (``schedule_policy.py:172``, ``:180``)
SCHEDULE_POLICIES = ("lpm", "fcfs")


def _prior(entry: ActiveEntry | WaitingEntry) -> IntLike:
    """Output tokens a request produced before its last retraction (0 unless the engine shows them)."""
    return getattr(entry, "prior", 0)


@dataclass(frozen=True, slots=True)
class Sglang:
    """SGLang 0.5.23's scheduler: its own knobs, one source for the model and the real run.

    The server (``M``, ``chunk``, ``block``, ``max_num_seqs``) is not here: it is the
    :class:`~kvstab.model.ModelParams` passed alongside the rule, and ``decide`` reads
    it off the view like every other rule."""

    max_prefill_tokens: int = field(
        default=16384, metadata={"help": "max_prefill_tokens: input tokens per prefill batch (a soft cap)"}
    )
    context_len: int | None = field(
        default=None, metadata={"help": "the model's context length (clips max_new at arrival); None: unbounded"}
    )
    # --- SGLang's knobs (environ.py:646-650, schedule fields)
    schedule_conservativeness: float = field(default=1.0, metadata={"help": "--schedule-conservativeness"})
    init_new_token_ratio: float = field(default=0.7, metadata={"help": "SGLANG_INIT_NEW_TOKEN_RATIO"})
    min_new_token_ratio_factor: float = field(default=0.14, metadata={"help": "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"})
    new_token_ratio_decay_steps: int = field(default=600, metadata={"help": "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"})
    retract_decode_steps: int = field(default=20, metadata={"help": "SGLANG_RETRACT_DECODE_STEPS"})
    clip_max_new_tokens: int = field(default=4096, metadata={"help": "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"})
    schedule_policy: str = field(
        default="lpm",
        metadata={
            "help": "--schedule-policy: 'lpm' (longest prefix match, SGLang's default) or 'fcfs'; "
            "only read with the radix cache on (SGLang runs FCFS without it, schedule_policy.py:324)"
        },
    )

    name: str = "sglang"
    description: str = (
        "SGLang 0.5.23: prefill whenever a batch forms, else decode; admission reserves the prompt, the "
        "request's whole max_new and new_token_ratio of the running requests' remaining outputs; "
        "retraction of the fewest-output request to the queue's tail"
    )
    traits: Traits = Traits(fcfs=True, work_conserving=False, clairvoyant=True, preempts=True, stalls_running=True)

    def __post_init__(self) -> None:
        for name in ("max_prefill_tokens", "new_token_ratio_decay_steps", "clip_max_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument(f"sglang: {name} must be a positive integer, got {v!r}")
        ctx = self.context_len
        if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1):
            raise InvalidArgument(f"sglang: context_len must be a positive integer or None, got {ctx!r}")
        if (
            isinstance(self.retract_decode_steps, bool)
            or not isinstance(self.retract_decode_steps, int)
            or (self.retract_decode_steps < 0)
        ):
            raise InvalidArgument(
                f"sglang: retract_decode_steps must be an integer >= 0, got {self.retract_decode_steps!r}"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise InvalidArgument(
                f"sglang: schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, got {self.schedule_policy!r}"
            )
        for name in ("schedule_conservativeness", "init_new_token_ratio", "min_new_token_ratio_factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < float(v) < float("inf")):
                raise InvalidArgument(f"sglang: {name} must be a positive finite number, got {v!r}")

    # --- configuration derived from the knobs
    @property
    def ratio_init(self) -> float:
        """``new_token_ratio`` at start: ``min(init · conservativeness, 1)`` (``new_token_ratio_tracker.py:24``)."""
        return min(float(self.init_new_token_ratio) * float(self.schedule_conservativeness), 1.0)

    @property
    def ratio_min(self) -> float:
        """The decay floor ``min(init · factor, 1)``."""
        return min(self.ratio_init * float(self.min_new_token_ratio_factor), 1.0)

    @property
    def ratio_decay(self) -> float:
        """The decay per decode step without retraction, ``(init − min) / steps``."""
        return (self.ratio_init - self.ratio_min) / self.new_token_ratio_decay_steps

    @property
    def state_vars(self) -> tuple[StateVar, ...]:
        """``new_token_ratio`` and ``batch_is_full``, the state SGLang carries between steps."""
        return (
            StateVar(
                "new_token_ratio",
                initial=self.ratio_init,
                lo=0.0,
                hi=1.0,
                real=True,
                help="share of running requests' remaining outputs that admission reserves",
            ),
            StateVar("batch_is_full", initial=0, lo=0, hi=1, help="1: no prefill is tried until a request leaves"),
        )

    # --- the rule
    def decide(self, view: View, ops: Ops) -> Decision:
        """One SGLang step: a prefill batch if one forms, else a decode step with retraction.

        Written with ``kvstab.contract``'s folds (one walk over the running list, one
        over the queue, the retraction, and sums), so that ``kvstab prove`` covers any
        number of requests (``docs/proofs.md``); the values, floats included, are the
        plain loops' in SGLang's order."""
        ratio, full = view.state if view.state else tuple(v.initial for v in self.state_vars)
        B = view.block
        clip = self.clip_max_new_tokens
        cap = view.max_num_seqs
        max_prefill = self.max_prefill_tokens

        unit_pages = isinstance(B, int) and B == 1  # decided once: paged() runs for every entry

        def paged(x: IntLike) -> IntLike:
            return x if unit_pages else ops.ceil_div(x, B) * B

        actives = view.active

        def classify(a: ActiveEntry, acc: tuple[()]) -> tuple[tuple[BoolLike, BoolLike, IntLike], tuple[()]]:
            """Per request: decoding, in a chunked prefill, the memory it holds."""
            d = ops.and_(a.present, ops.le(a.s, a.progress))
            c = ops.and_(a.present, ops.lt(a.progress, a.s))
            return (d, c, ops.ite(a.present, paged(a.progress), 0)), acc

        (decoding, chunked, held), _ = scan(actives, classify, (), width=3)
        free = view.M - sum_of(held, lambda h: h, ops)
        n_running = count_of(decoding, lambda d: d, ops)
        n_active = count_of(actives, lambda a: a.present, ops)
        any_chunked = any_of(chunked, ops)
        # the flag is cleared when the running batch is empty (scheduler.py:4094)
        full = ops.ite(ops.eq(n_running, 0), 0, full)

        # ---- prefill: the adder's budgets (Python's sum over the running list, in batch order)
        total_offset = sum_of(
            zipped(actives, decoding),
            lambda x: ops.ite(x[1], ops.min(x[0].s + x[0].o - x[0].progress, clip) * ratio, 0),
            ops,
        )

        def continue_chunk(x: tuple[ActiveEntry, BoolLike], acc: tuple[Any, ...]) -> tuple[IntLike, tuple[Any, ...]]:
            """The chunked request's next chunk (add_chunked_req): its grant, and the adder's budgets."""
            a, c = x
            total, current, rem_chunk, rem_input, used, in_batch, continuing, finishing = acc
            remaining_total = free - total
            cand = a.s - a.progress
            # available_chunk_tokens (prefill_budget.py:146): min(rem_chunk, int(remaining_total)),
            # and the whole rem_chunk when that is not positive (a continuation must progress)
            limited = ops.min(rem_chunk, ops.floor(remaining_total))
            allow = ops.ite(ops.le(limited, 0), rem_chunk, limited)
            # never more than free memory (SGLang would fail the allocation; see the docstring)
            room = paged(a.progress) - a.progress + ops.div(ops.max(free - used, 0), B) * B
            allow = ops.max(0, ops.min(allow, room))
            new_len = ops.ite(c, ops.min(cand, allow), 0)
            truncated = ops.lt(new_len, cand)
            max_new_res = ops.ite(truncated, 0, ops.min(a.o + 1 + _prior(a), clip))
            ext = paged(new_len)
            return new_len, (
                total + ops.ite(c, ext + B + max_new_res, 0),
                current + ops.ite(c, ext + B, 0),
                rem_chunk - ops.ite(c, ext, 0),
                rem_input - ops.ite(c, ext, 0),
                # tokens this batch allocates (the memory clamp's account)
                used + ops.ite(c, paged(a.progress + new_len) - paged(a.progress), 0),
                in_batch + ops.ite(c, 1, 0),  # requests in the prefill batch (can_run_list)
                ops.or_(continuing, ops.and_(c, truncated)),  # a chunked request stays chunked
                ops.or_(finishing, ops.and_(c, ops.not_(truncated), ops.eq(a.o, 0))),
            )

        # SGLang requires whole pages (validation_hook.py:244); another chunk is rounded up to pages
        start = (total_offset, 0, paged(view.chunk), max_prefill, 0, 0, False, False)
        grants, after_chunks = scan(zipped(actives, chunked), continue_chunk, start)
        in_batch_chunks = after_chunks[5]

        # the walk over the queue runs when a chunk is in flight, or the queue is open
        walk = ops.or_(any_chunked, ops.eq(full, 0))
        empty_system = ops.eq(n_active, 0)

        def admit_one(w: WaitingEntry, acc: tuple[Any, ...]) -> tuple[tuple[BoolLike, IntLike], tuple[Any, ...]]:
            """One waiting request (add_one_req): admitted (whole or chunked) or not, and the walk's stop."""
            total, current, rem_chunk, rem_input, used, in_batch, continuing, finishing, stopped, set_full, waits = acc
            remaining_total = free - total
            # budget_state (schedule_policy.py:874): no memory is NO_TOKEN, and it comes before a
            # spent token budget (OTHER), so the request is then tried, fails and sets the flag
            mem_out = ops.le(free - total, 0)
            budget_other = ops.and_(ops.or_(ops.le(rem_input, 0), ops.le(rem_chunk, 0)), ops.not_(mem_out))
            # the running count: n_running + in_batch, the active requests (each decodes or continues
            # its chunk in this batch) and those admitted so far — written from n_active, so that its
            # bound is one fold's fact (docs/proofs.md)
            capped = False if cap is None else ops.le(cap, n_active + (in_batch - in_batch_chunks))
            # the walk's stops, in SGLang's order: spent budget, then the running cap
            stop_budget = ops.and_(w.present, ops.not_(stopped), budget_other)
            stop_cap = ops.and_(w.present, ops.not_(stopped), ops.not_(budget_other), capped)
            tries = ops.and_(w.present, ops.not_(stopped), ops.not_(budget_other), ops.not_(capped))
            max_new_check = ops.min(w.o + 1, clip)
            fits = ops.lt(w.s + max_new_check + B, remaining_total)
            # the empty system admits its head whatever the reservation (see the module docstring)
            fits = ops.or_(fits, ops.and_(empty_system, ops.eq(in_batch, 0)))
            take = ops.and_(tries, fits)
            no_token = ops.and_(tries, ops.not_(fits))
            # chunked admission when the paged prompt exceeds the chunk budget
            whole = ops.le(paged(w.s), rem_chunk)
            chunk_len = ops.div(ops.max(rem_chunk, 0), B) * B
            take = ops.and_(take, ops.or_(whole, ops.lt(0, chunk_len)))
            ext_raw = ops.ite(whole, w.s, chunk_len)
            max_new_res = ops.ite(whole, ops.min(w.o + 1 + _prior(w), clip), 0)
            ext = paged(ext_raw)
            total = total + ops.ite(take, ext + B + max_new_res, 0)
            current = current + ops.ite(take, ext + B, 0)
            rem_chunk = rem_chunk - ops.ite(take, ext, 0)
            rem_input = rem_input - ops.ite(take, ext, 0)
            in_batch = in_batch + ops.ite(take, 1, 0)
            # after an admission, add_one_req returns the budget state: NO_TOKEN stops the walk too
            after_no_token = ops.and_(take, ops.or_(ops.le(free - total, 0), ops.le(free - current, 0)))
            after_other = ops.and_(take, ops.not_(after_no_token), ops.or_(ops.le(rem_input, 0), ops.le(rem_chunk, 0)))
            nt = ops.or_(no_token, after_no_token)
            running = ops.or_(ops.lt(0, in_batch), ops.lt(0, n_running))
            return (take, ops.ite(take, ext_raw, 0)), (
                total,
                current,
                rem_chunk,
                rem_input,
                used + ops.ite(take, ext, 0),
                in_batch,
                ops.or_(continuing, ops.and_(take, ops.not_(whole))),
                ops.or_(finishing, ops.and_(take, whole, ops.eq(w.o, 0))),
                ops.or_(stopped, stop_budget, stop_cap, nt, after_other, ops.and_(w.present, ops.not_(take))),
                ops.or_(set_full, stop_cap, ops.and_(nt, running)),
                ops.or_(waits, w.present),
            )

        (admit, admit_grants), after_queue = scan(
            view.waiting, admit_one, (*after_chunks, ops.not_(walk), False, False), width=2
        )
        _, _, _, _, _, in_batch, continuing, finishing_in_prefill, _, set_full, anyone_waits = after_queue
        # a request is admitted only into a prefill batch (in_batch ≥ 1 from then on), so the
        # admissions need no `prefill` conjunct

        prefill = ops.lt(0, in_batch)
        # ---- decode: check_decode_mem, retraction in SGLang's order
        decode = ops.and_(ops.not_(prefill), ops.lt(0, n_running))

        def need(x: tuple[ActiveEntry, BoolLike]) -> IntLike:
            """A new page for a decoding request whose length is a multiple of B (schedule_batch.py:3415)."""
            a, d = x
            return ops.ite(ops.and_(d, ops.eq(paged(a.progress), a.progress)), B, 0)

        retracting = ops.and_(decode, ops.lt(free, sum_of(zipped(actives, decoding), need, ops)))

        def page_after_decode(a: ActiveEntry) -> IntLike:
            """What a request holds after one decode token (a chunked request, absent in a decode step, holds what it holds)."""
            return paged(a.progress) + need((a, ops.le(a.s, a.progress)))

        def order(a: ActiveEntry) -> tuple[IntLike, IntLike]:
            """_get_decode_retraction_order (schedule_batch.py:3542): fewest outputs first, then the
            longest original prompt (ties: the latest in batch order, which the combinator gives)."""
            return (a.progress - a.s + 1 + _prior(a), _prior(a) - a.s)

        # a decode step has no chunked request (a chunk in flight makes a prefill batch), so the
        # running batch SGLang retracts from is the active list, and it fits in M
        preempt = retract_until_fits(view, ops, page_after_decode, order, view.M, allowed=decode)

        def decode_one(
            x: tuple[ActiveEntry, BoolLike, BoolLike], acc: tuple[IntLike, IntLike, IntLike, BoolLike]
        ) -> tuple[IntLike, tuple[IntLike, IntLike, IntLike, BoolLike]]:
            """A decode step's grant (one token to a kept request) and the kept requests' sums."""
            a, d, popped = x
            n_kept, sum_out, sum_max_new, finishing = acc
            k = ops.and_(d, ops.not_(popped))
            return ops.ite(ops.and_(decode, k), 1, 0), (
                n_kept + ops.ite(k, 1, 0),
                sum_out + ops.ite(k, a.progress - a.s + 1 + _prior(a), 0),  # len(output_ids)
                sum_max_new + ops.ite(k, a.o + 1 + _prior(a), 0),
                ops.or_(finishing, ops.and_(k, ops.eq(a.progress + 1, a.s + a.o))),
            )

        decode_grants, (n_kept, sum_out, sum_max_new, finishing_in_decode) = scan(
            zipped(actives, decoding, preempt), decode_one, (0, 0, 0, False)
        )
        estimate = (sum_out + self.retract_decode_steps * n_kept) / (sum_max_new + 1)
        after_retract = ops.min(1.0, estimate)
        decayed = ops.max(ratio - self.ratio_decay, self.ratio_min)
        # an idle step (nothing runs, nothing waits) resets the ratio (on_idle, scheduler.py:5318)
        idle = ops.and_(ops.eq(n_active, 0), ops.not_(anyone_waits))
        next_ratio = ops.ite(decode, ops.ite(retracting, after_retract, decayed), ops.ite(idle, self.ratio_init, ratio))

        # ---- the flag for the next step
        # a prefill batch formed with nothing running *becomes* the running batch next step
        # (scheduler.py:3957), a new ScheduleBatch whose flag is clear: the flag set now is lost
        leaves = ops.or_(
            ops.and_(prefill, ops.or_(continuing, finishing_in_prefill, ops.eq(n_running, 0))),
            ops.and_(decode, ops.or_(retracting, finishing_in_decode)),
        )
        next_full = ops.ite(leaves, 0, ops.ite(set_full, 1, full))

        return Decision(
            admit=admit,
            preempt=preempt,
            grants=select(prefill, grants, decode_grants, ops) + admit_grants,
            state=(next_ratio, next_full),
        )


SCHEDULER = Sglang()
