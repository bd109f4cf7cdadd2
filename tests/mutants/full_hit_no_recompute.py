"""Mutant (prefix caching): current-fit that forgets a full-prompt hit recomputes one token.

vLLM caps a cache hit at ``s − 1`` tokens (whole blocks): the last prompt token
is always computed, to give the first output's logits, so a prompt cached up to
its last block still computes at least one token and needs a block for it.  This
port charges a request with a hit that covers its prompt up to the last block
(``0 < hit``, ``s − cached ≤ B``) its cached prefix only, as if the hit were the whole
prompt: each such admission is one block short, and memory overflows ``M``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, any_of, fcfs_admit, held_first, preempt_newest
from kvstab.model import tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class FullHitNoRecompute(CurrentFitClaims):
    name: str = "mutant-full-hit-no-recompute"
    description: str = "current-fit that charges a prompt cached up to its last block nothing past its hit"

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            # BUG: "all but the last block is cached, so the prompt is cached": the last token is recomputed
            whole_hit = ops.and_(ops.lt(0, w.cached + w.shared), ops.le(w.s - w.cached, view.block))
            first = ops.ite(whole_hit, tokens_held(w.cached, view.block, ops), held_first(view, w, ops))
            after = acc + first
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(any_of(preempt, ops)))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = FullHitNoRecompute()
