"""Mutant: current-fit that releases memory one slot early.

A request that produces its last token this slot releases its memory at the
*end* of the slot; this port counts it as already gone when it decides, so
the slot's memory (which still includes the finishing request) can overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import ActiveEntry, Decision, Traits, View, WaitingEntry, fcfs_admit, held_first, held_next
from kvstab.model import progress_after
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


def held_next_released_early(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """BUG: 0 for a request that finishes this slot (it still holds s + o during the slot)."""
    finishes = ops.le(a.s + a.o, progress_after(a.s, a.progress, view.chunk, None, ops))
    return ops.ite(finishes, 0, held_next(view, a, ops))


@dataclass(frozen=True)
class ReleaseEarly(CurrentFitClaims):
    name: str = "mutant-release-early"
    description: str = "current-fit that frees a finishing request's memory one slot too early"
    # it reads o to spot the finishing request, so it must say it is clairvoyant (engines hide o otherwise)
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        prefix: IntLike = 0
        preempt: list[BoolLike] = []
        kept: IntLike = 0
        for a in view.active:
            nxt = held_next_released_early(view, a, ops)
            prefix = prefix + nxt
            victim = ops.and_(a.present, ops.lt(view.M, prefix))
            preempt.append(victim)
            kept = kept + ops.ite(victim, 0, nxt)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=tuple(preempt))


SCHEDULER = ReleaseEarly()
