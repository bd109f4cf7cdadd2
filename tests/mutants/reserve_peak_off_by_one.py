"""Mutant: reserve whose peak is one token short.

A port that reserves ``s + o − 1`` (the last output token "is sampled, not
stored"): each request on its own fits, and two that run together overflow
only if they reach their peaks in the same slot and their true peaks sum to
just over ``M``.  The strategies once drew no such sets, and at the ``ci``
budget this bug passed the whole suite.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import ActiveEntry, Decision, Traits, View, WaitingEntry, fcfs_admit
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.schedulers.reserve import Reserve


@dataclass(frozen=True)
class ReservePeakOffByOne:
    name: str = "mutant-reserve-peak-off-by-one"
    description: str = "reserve that reserves s + o − 1 tokens per request"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Reserve's declared margin."""
        return Reserve().margin(params, max_s, max_o)

    def decide(self, view: View, ops: Ops) -> Decision:
        def peak(r: ActiveEntry | WaitingEntry) -> IntLike:
            return ops.ite(r.present, tokens_held(r.s + r.o - 1, view.block, ops), 0)  # BUG: one token short

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + peak(w)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, ops.sum(peak(a) for a in view.active))
        return Decision(admit=admit, preempt=tuple(False for _ in view.active))


SCHEDULER = ReservePeakOffByOne()
