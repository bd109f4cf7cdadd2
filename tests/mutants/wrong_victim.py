"""Mutant: current-fit that preempts the wrong victim.

On overflow vLLM preempts from the *newest* admission until the rest fits.
This port preempts the *oldest* running request — one victim, whatever the
overflow — which may free too little, and throws away the most progress.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, fcfs_admit, held_first, held_next, used_next
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class WrongVictim(CurrentFitClaims):
    name: str = "mutant-wrong-victim"
    description: str = "current-fit that preempts the oldest running request instead of the newest"

    def decide(self, view: View, ops: Ops) -> Decision:
        total = used_next(view, ops)
        overflow = ops.lt(view.M, total)
        preempt: list[BoolLike] = []
        none_yet: BoolLike = True
        kept: IntLike = total
        for a in view.active:
            victim = ops.and_(a.present, overflow, none_yet)  # BUG: the first present (oldest) one
            preempt.append(victim)
            kept = kept - ops.ite(victim, held_next(view, a, ops), 0)
            none_yet = ops.and_(none_yet, ops.not_(a.present))

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(overflow))
        return Decision(admit=admit, preempt=tuple(preempt))


SCHEDULER = WrongVictim()
