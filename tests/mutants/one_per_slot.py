"""Mutant: lookahead that admits at most one request per slot.

A port that forgot to loop over the queue: it tests only the head.  Memory is
safe (the head passes look-ahead's own test), but when two requests would fit
one is left waiting although the rule itself admits it — not work-conserving,
while it still claims to be.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View
from kvstab.model import ModelParams
from kvstab.ops import Ops
from kvstab.schedulers.lookahead import Lookahead


@dataclass(frozen=True)
class OnePerSlot:
    name: str = "mutant-one-per-slot"
    description: str = "lookahead that only ever considers the queue head"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Look-ahead's declared margin."""
        return Lookahead().margin(params, max_s, max_o)

    def decide(self, view: View, ops: Ops) -> Decision:
        head_only = View(  # BUG: the rest of the queue is never shown to the rule
            active=view.active,
            waiting=view.waiting[:1],
            M=view.M,
            chunk=view.chunk,
            block=view.block,
            token_budget=view.token_budget,
            max_num_seqs=view.max_num_seqs,
            n_waiting=view.n_waiting,
        )
        d = Lookahead().decide(head_only, ops)
        admit = tuple(d.admit) + tuple(False for _ in view.waiting[1:])
        return Decision(admit=admit, preempt=d.preempt)


SCHEDULER = OnePerSlot()
