"""``reserve``: FCFS admission that reserves every request's peak memory.

Clairvoyant (reads ``o``): admit the queue head while the peaks ``s + o`` of
all admitted requests, the head's included, fit in ``M``.  It can never
overflow and never preempts, but it holds memory its requests have not yet
used, so its own stability limit is ``M / (b̄·E[(s + o)(n(s) + o)])``, far
below ``μ`` (MODEL.md, convention 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import ActiveEntry, Decision, Traits, View, WaitingEntry, fcfs_admit, no_preemption, sum_of
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["Reserve", "SCHEDULER", "peak", "future_memory_margin"]


def peak(view: View, r: ActiveEntry | WaitingEntry, ops: Ops) -> IntLike:
    """The memory ``r`` holds in its last slot, ``s + o`` (block-rounded); 0 for an empty slot."""
    return ops.ite(r.present, tokens_held(r.s + r.o, view.block, ops), 0)


def future_memory_margin(params: ModelParams) -> int:
    """The margin ``Δ = M − 1`` of a rule that admits on memory the admitted requests will
    hold later, not on what they hold now (``reserve``, ``lookahead``): only that some
    request runs while the queue is non-empty is guaranteed."""
    return params.M - 1


@dataclass(frozen=True, slots=True)
class Reserve:
    """FCFS; admit while the reserved peaks s + o of all admitted requests fit in M."""

    name: str = "reserve"
    description: str = "FCFS, clairvoyant; admit while the peaks s+o of all admitted requests fit in M; never preempts"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Declared margin: :func:`future_memory_margin`."""
        return future_memory_margin(params)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admit the head while reserved peak memory stays within ``M``."""
        reserved = sum_of(view.active, lambda a: peak(view, a, ops), ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + peak(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, reserved)
        return Decision(admit=admit, preempt=no_preemption(view))


SCHEDULER = Reserve()
