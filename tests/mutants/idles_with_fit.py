"""Mutant: a policy that idles with a fitting request waiting.

It admits only into an empty server — a "fill a batch, then wait for it to
drain" port — yet still claims current-fit's work conservation and margin
``Δ``.  (It reserves peaks within a batch, so it never overflows ``M``: the
bug is idleness alone.)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View, WaitingEntry, fcfs_admit
from kvstab.model import tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class IdlesWithFit(CurrentFitClaims):
    name: str = "mutant-idles-with-fit"
    description: str = "admits only when nothing is running (idles while a request would fit)"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def decide(self, view: View, ops: Ops) -> Decision:
        empty = ops.eq(ops.count(a.present for a in view.active), 0)

        def fits_peak(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + ops.ite(w.present, tokens_held(w.s + w.o, view.block, ops), 0)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits_peak, 0, allowed=empty)  # BUG: waits for an empty server
        return Decision(admit=admit, preempt=tuple(False for _ in view.active))


SCHEDULER = IdlesWithFit()
