"""Mutant (prefix caching): current-fit whose victims need not be the newest requests.

The preemption walk keeps every running request that still fits after the ones kept
before it, even behind a victim (first fit over the running list).  Without sharing
that is safe: the survivors' memory is at most ``M`` by construction, and
``kvstab prove`` proves it for any number of requests.  With prefix caching it is
not: the view charges a shared block to its oldest holder, so a survivor younger
than a victim was shown the victim's shared blocks free of charge, and when the
victim leaves they are the survivor's — memory overflows ``M``.  The proof's suffix
premise (victims are a suffix of the active list) is what fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import ActiveEntry, Decision, View, WaitingEntry, any_of, fcfs_admit, held_first, held_next, scan
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class KeepsBehindVictim(CurrentFitClaims):
    name: str = "mutant-keeps-behind-victim"
    description: str = "current-fit that preempts the running requests that do not fit and keeps later ones that do"

    def decide(self, view: View, ops: Ops) -> Decision:
        def step(a: ActiveEntry, kept: IntLike) -> tuple[BoolLike, IntLike]:
            nxt = held_next(view, a, ops)
            # BUG (with sharing): a later request may stay behind a victim
            victim = ops.and_(a.present, ops.lt(view.M, kept + nxt))
            return victim, kept + ops.ite(victim, 0, nxt)

        preempt, kept = scan(view.active, step, 0)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(any_of(preempt, ops)))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = KeepsBehindVictim()
