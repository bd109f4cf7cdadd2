"""Mutant: lookahead that keeps a quarter of ``M`` in reserve while anything runs.

A "safety headroom" port of ``lookahead``: it projects memory against ``3M/4``
instead of ``M`` whenever a request is running, and still claims look-ahead's
traits and its declared margin ``Δ = M − 1``.  With that margin the drift bound
(property 6) has nothing to say, and the rule is a fixed point of its own
accounting (property 7's first test); only work conservation judged from the
engine's state catches it.  It sustains about two thirds of ``μ`` where
look-ahead reaches nine tenths.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvstab.contract import Decision, Traits, View
from kvstab.model import ModelParams
from kvstab.ops import Ops
from kvstab.schedulers.lookahead import Lookahead


@dataclass(frozen=True)
class LookaheadIdles:
    name: str = "mutant-lookahead-idles"
    description: str = "lookahead that projects against 3M/4 while anything runs"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Look-ahead's declared margin."""
        return Lookahead().margin(params, max_s, max_o)

    def decide(self, view: View, ops: Ops) -> Decision:
        busy = ops.lt(0, ops.count(a.present for a in view.active))
        headroom = ops.ite(busy, ops.div(view.M * 3, 4), view.M)  # BUG: a quarter of M kept idle
        return Lookahead().decide(replace(view, M=headroom), ops)


SCHEDULER = LookaheadIdles()
