"""``vllm-v1``: vLLM 0.33.0's v1 scheduler (FCFS, chunked prefill, token budget, recompute).

The rule of ``vllm.v1.core.sched.scheduler.Scheduler.schedule`` with the
defaults kvstab cross-checks (FCFS policy, chunked prefill on, no watermark,
``scheduler_reserve_full_isl=True``, no speculative decoding, one
full-attention KV group), written once against ``ops``; with prefix caching the
engine shows each entry off what older requests share and a waiting entry from
its cache hit, and the same rule is vLLM's with caching on (``docs/MODEL.md``,
"The model with prefix caching"):

1. **Running requests first, oldest admission first**, one token budget
   (``max_num_batched_tokens``) for the step: a decoding request asks for one
   token, a prefilling one for the rest of its prompt, capped at ``ŝ``
   (vLLM's ``long_prefill_token_threshold``); each gets
   ``min(ask, budget left)``; once the budget is spent the rest of the running
   list holds its blocks without doing work this step.
2. **Recompute preemption of the newest request.**  vLLM allocates the blocks
   of each scheduled request in turn and, when the pool runs dry, pops the
   tail of the running list (freeing its blocks) until the allocation fits or
   the request has preempted itself.  Memory only grows within a step, so the
   survivors are the longest admission-order prefix whose post-step memory —
   scheduled requests at their new size, unscheduled ones at their current
   size — fits in ``M``; the prefix sums below compute exactly that.
3. **No admission in a step that preempted.**  Otherwise waiting requests are
   admitted in queue order while the budget lasts, the running count stays
   below ``max_num_seqs``, and the request's *whole* prompt fits in the free
   blocks (``full_sequence_must_fit``); it is then allocated only its first
   chunk, ``min(s, ŝ, budget left)``.  The first request that cannot be
   admitted blocks the queue behind it.

Memory is block-granular through :func:`kvstab.model.tokens_held`, and ``M``
is ``(num_blocks − 1)·B`` (vLLM reserves one null block).  Output lengths are
not read: the rule is non-clairvoyant.

Two differences of *request lifecycle* are not the rule's business but the
engine's, and ``kvstab.empirical`` applies them when it replays vLLM
(``docs/empirical.md``): vLLM samples output token 1 in the last prefill
step, so a vLLM request ``(s, o)`` is a kvstab request with ``o − 1`` decode
units; and a request preempted after producing ``k`` output tokens resumes by
recomputing ``s + k`` tokens as a prompt.  In kvstab's own engine (restart
from scratch on preemption) this rule is vLLM's scheduling decision under
kvstab's lifecycle, and it is audited there like every other scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstab.contract import (
    ActiveEntry,
    Decision,
    Traits,
    View,
    WaitingEntry,
    any_of,
    fcfs_admit_with_grants,
    first_step,
    scan,
)
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["VllmV1", "SCHEDULER"]


@dataclass(frozen=True, slots=True)
class VllmV1:
    """vLLM v1: token budget shared running-first, recompute-preempt the newest, full-prompt admission."""

    name: str = "vllm-v1"
    description: str = (
        "vLLM 0.33 v1: running first under one token budget, chunked prefill, recompute-preempt newest, "
        "no admission after a preemption, admit only if the whole prompt fits"
    )
    # the full-prompt check and the token budget can leave memory idle
    traits: Traits = Traits(fcfs=True, work_conserving=False, clairvoyant=False, preempts=True)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Declared work-conservation margin ``Δ`` (tokens).

        A refused head needs its whole prompt (at most ``B⌈max s/B⌉``) free, and
        a preempting step's survivors plus the first victim exceed ``M``, so
        memory used is at least ``M − B⌈(max s + max o)/B⌉ + 1`` *when the token
        budget did not stop admission*; a token budget or a ``max_num_seqs`` cap
        can stop admission with memory idle, which voids the margin (``Δ = M``).
        """
        if params.max_num_seqs is not None or params.token_budget is not None:
            return params.M
        return min(params.M, int(tokens_held(max_s + max_o, params.block)) - 1)

    def decide(self, view: View, ops: Ops) -> Decision:
        """One vLLM step: grants for the running list, the preempted suffix, then admissions."""
        unlimited = view.token_budget is None  # a configuration fact, not a value of the state

        def schedule(a: ActiveEntry, acc: tuple[IntLike, IntLike, IntLike]) -> tuple[tuple[BoolLike, IntLike], Any]:
            """One running request, oldest first; ``acc``: post-step memory of the running
            list so far (``prefix``), budget left, post-step memory of the survivors (``kept``)."""
            prefix, budget, kept = acc
            ask = ops.ite(ops.lt(a.progress, a.s), ops.min(a.s - a.progress, view.chunk), 1)
            grant = ask if unlimited else ops.min(ask, budget)
            grant = ops.ite(a.present, grant, 0)
            # post-step memory, masked: an empty slot (symbolic runs) holds nothing
            after = ops.ite(a.present, tokens_held(a.progress + grant, view.block, ops), 0)
            prefix = prefix + after
            victim = ops.and_(a.present, ops.lt(view.M, prefix))
            # a victim was never scheduled, so it spends no budget; victims are a
            # suffix, so the survivors' grants are what vLLM's loop gives them
            if not unlimited:
                budget = budget - ops.ite(victim, 0, grant)
            return (victim, ops.ite(victim, 0, grant)), (prefix, budget, kept + ops.ite(victim, 0, after))

        start = (0, 0 if unlimited else view.token_budget, 0)
        (preempt, grants), (_, budget, kept) = scan(view.active, schedule, start, width=2)
        any_preempted = any_of(preempt, ops)

        def fits(w: WaitingEntry, acc: tuple[IntLike, IntLike]) -> tuple[BoolLike, tuple[IntLike, IntLike], IntLike]:
            """The whole prompt must fit; the request is allocated only its first chunk."""
            used, left = acc
            # the first chunk starts past a cached prefix (vLLM: num_computed_tokens = the hit)
            first, after = first_step(view, w, ops, None if unlimited else left)
            whole_prompt_fits = ops.le(used + tokens_held(w.s, view.block, ops), view.M)
            ok = whole_prompt_fits if unlimited else ops.and_(ops.lt(0, left), whole_prompt_fits)
            return ok, (used + tokens_held(after, view.block, ops), left - first), first

        admit, admit_grants = fcfs_admit_with_grants(view, ops, fits, (kept, budget), allowed=ops.not_(any_preempted))
        return Decision(admit=admit, preempt=preempt, grants=grants + admit_grants)


SCHEDULER = VllmV1()
