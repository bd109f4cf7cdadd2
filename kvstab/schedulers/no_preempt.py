"""``current-fit-no-preempt`` — a **negative control**.

Admits exactly like ``current-fit`` (post-slot memory plus the head's first
chunk fits) but never preempts.  Without output lengths at admission, decode
growth of the admitted requests overflows ``M``: the memory invariant is
broken.  kvstab ships it so that every verification layer can show it catches
a real bug (the engine raises ``InvariantViolation``, z3 refutes it with a
reachable trace, the property suite fails and shrinks).  It is excluded from
default audits.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View, WaitingEntry, fcfs_admit, held_first, no_preemption, used_next
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["CurrentFitNoPreempt", "SCHEDULER"]


@dataclass(frozen=True, slots=True)
class CurrentFitNoPreempt:
    """Negative control: admit by current fit and never preempt (breaks the invariant)."""

    name: str = "current-fit-no-preempt"
    description: str = "NEGATIVE CONTROL: admit by current fit, never preempt; must be caught overflowing M"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=False, negative_control=True)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Declared margin ``Δ``: a refused head's first chunk did not fit,
        ``Δ = B⌈min(ŝ, max s)/B⌉ − 1`` (moot: the policy overflows ``M``)."""
        if params.max_num_seqs is not None:
            return params.M
        return int(tokens_held(min(params.chunk, max_s), params.block)) - 1

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admit by current fit; never preempt."""

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, used_next(view, ops))
        return Decision(admit=admit, preempt=no_preemption(view))


SCHEDULER = CurrentFitNoPreempt()
