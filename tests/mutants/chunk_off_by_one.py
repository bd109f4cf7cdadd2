"""Mutant: current-fit that counts the head's first chunk one token short.

The classic off-by-one in chunk memory: ``min(s, ŝ) − 1`` instead of
``min(s, ŝ)``, so a head that misses by exactly one token is admitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, fcfs_admit, preempt_newest
from kvstab.model import first_chunk_tokens, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class ChunkOffByOne(CurrentFitClaims):
    name: str = "mutant-chunk-off-by-one"
    description: str = "current-fit with the first chunk counted one token short"

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            first = tokens_held(first_chunk_tokens(w.s, view.chunk, ops) - 1, view.block, ops)  # BUG: − 1
            after = acc + ops.ite(w.present, first, 0)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = ChunkOffByOne()
