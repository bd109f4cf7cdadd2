"""Mutant: current-fit whose admission test ignores the head's first chunk.

It admits while the running requests' post-slot memory fits, forgetting that
the admitted request itself takes a chunk of memory in this very slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, fcfs_admit, preempt_newest
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class IgnoresFirstChunk(CurrentFitClaims):
    name: str = "mutant-ignores-first-chunk"
    description: str = "current-fit whose admission test leaves out the head's first chunk"

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            return ops.le(acc, view.M), acc  # BUG: the head's own first chunk is not added

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = IgnoresFirstChunk()
