"""Mutant: current fit that stops admitting at three quarters of ``M``.

A "safety headroom" port: while anything runs, it admits only up to
``3M/4`` — yet it still claims current-fit's margin ``Δ`` (a peak).  With
large requests the headroom hides inside ``Δ``; it takes many small requests
(a crowded server) to show that a quarter of the memory idles while requests
wait.  Found by review: the audit's strategies once drew no crowded servers,
and this mutant passed the whole suite.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View, WaitingEntry, fcfs_admit, held_first, preempt_newest
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class IdlesAtThreeQuarters(CurrentFitClaims):
    name: str = "mutant-idles-at-three-quarters"
    description: str = "current fit, but admits only up to 3M/4 while anything runs"

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)
        busy = ops.lt(0, ops.count(a.present for a in view.active))
        limit = ops.ite(busy, ops.div(view.M * 3, 4), view.M)  # BUG: a quarter of M kept idle

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, limit), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = IdlesAtThreeQuarters()
