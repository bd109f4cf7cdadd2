"""Mutant: current-fit that grants prefill only half a chunk per slot.

Its admission still assumes a full chunk (so memory stays safe), but the
request is served at half rate while prefilling: its lifetime area is no
longer ``g(s, o)`` — the model's maximal batching is broken.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View
from kvstab.model import unit_tokens
from kvstab.ops import Ops
from kvstab.schedulers.current_fit import CurrentFit
from mutants._base import CurrentFitClaims


@dataclass(frozen=True)
class HalfChunk(CurrentFitClaims):
    name: str = "mutant-half-chunk"
    description: str = "current-fit granting ⌈ŝ/2⌉ prefill tokens per slot"

    def decide(self, view: View, ops: Ops) -> Decision:
        d = CurrentFit().decide(view, ops)
        half = ops.ceil_div(view.chunk, 2)
        grants = tuple(
            ops.min(unit_tokens(a.s, a.progress, view.chunk, ops), half) for a in view.active  # BUG
        ) + tuple(ops.min(w.s, half) for w in view.waiting)
        return Decision(admit=d.admit, preempt=d.preempt, grants=grants)


SCHEDULER = HalfChunk()
