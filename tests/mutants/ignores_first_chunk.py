"""Mutant: current-fit whose admission test ignores the head's first chunk.

It admits while the running requests' post-slot memory fits, forgetting that
the admitted request itself takes a chunk of memory in this very slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, fcfs_admit, held_next
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class IgnoresFirstChunk(CurrentFitClaims):
    name: str = "mutant-ignores-first-chunk"
    description: str = "current-fit whose admission test leaves out the head's first chunk"

    def decide(self, view: View, ops: Ops) -> Decision:
        prefix: IntLike = 0
        preempt: list[BoolLike] = []
        kept: IntLike = 0
        for a in view.active:
            nxt = held_next(view, a, ops)
            prefix = prefix + nxt
            victim = ops.and_(a.present, ops.lt(view.M, prefix))
            preempt.append(victim)
            kept = kept + ops.ite(victim, 0, nxt)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            return ops.le(acc, view.M), acc  # BUG: the head's own first chunk is not added

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=tuple(preempt))


SCHEDULER = IgnoresFirstChunk()
