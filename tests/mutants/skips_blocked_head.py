"""Mutant: reserve without head-of-line blocking that still claims FCFS.

When the head does not fit it admits later requests that do (first fit
instead of FCFS) — a common "optimisation" — while declaring ``fcfs``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View
from kvstab.model import ModelParams
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.schedulers.reserve import Reserve, peak


@dataclass(frozen=True)
class SkipsBlockedHead:
    name: str = "mutant-skips-blocked-head"
    description: str = "reserve with first-fit admission (skips a blocked head) claiming FCFS"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Reserve's declared margin."""
        return Reserve().margin(params, max_s, max_o)

    def decide(self, view: View, ops: Ops) -> Decision:
        reserved: IntLike = ops.sum(peak(view, a, ops) for a in view.active)
        admit: list[BoolLike] = []
        for w in view.waiting:
            after = reserved + peak(view, w, ops)
            take = ops.and_(w.present, ops.le(after, view.M))  # BUG: no blocking behind a refused head
            admit.append(take)
            reserved = ops.ite(take, after, reserved)
        return Decision(admit=tuple(admit), preempt=tuple(False for _ in view.active))


SCHEDULER = SkipsBlockedHead()
