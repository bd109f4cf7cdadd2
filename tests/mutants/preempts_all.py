"""Mutant: current-fit that preempts every running request on overflow.

A "clear the batch" recovery: memory is safe, but requests that overflow
together are restarted together, regrow together and overflow again — a
preemption livelock.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, fcfs_admit, held_first, used_next
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class PreemptsAll(CurrentFitClaims):
    name: str = "mutant-preempts-all"
    description: str = "current-fit that preempts the whole batch when memory would overflow"

    def decide(self, view: View, ops: Ops) -> Decision:
        total = used_next(view, ops)
        overflow = ops.lt(view.M, total)
        preempt = tuple(ops.and_(a.present, overflow) for a in view.active)  # BUG: everyone

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, total, allowed=ops.not_(overflow))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = PreemptsAll()
