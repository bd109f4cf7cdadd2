"""Mutant (prefix caching): current-fit that takes referenced blocks as evictable room.

With prefix caching a waiting request's hit may lie in blocks that running
requests hold (the view's ``shared``); only cached blocks that *no* request
holds are free (evictable).  This port credits the blocks its hit shares with
running requests as room, as if admitting it could evict them: the pool then
lacks the blocks the admission takes, and memory overflows ``M``.  Without
sharing (``shared = 0``) it is current-fit exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, any_of, fcfs_admit, held_first, preempt_newest
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class EvictsReferenced(CurrentFitClaims):
    name: str = "mutant-evicts-referenced"
    description: str = "current-fit that counts the blocks its cache hit shares with running requests as free room"

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            # BUG: w.shared is held by running requests (referenced), not evictable
            after = acc + held_first(view, w, ops) - w.shared
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(any_of(preempt, ops)))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = EvictsReferenced()
