"""``current-fit``: FCFS admission by current fit, recompute preemption (vLLM v1).

Admission (output lengths are *not* read): admit the queue head while the
memory the active requests will hold after this slot, plus the head's first
chunk, fits in ``M``.  Decode growth can later overflow ``M``; then the policy
preempts by recompute exactly as vLLM v1 does: the victim is the most recently
admitted running request, its memory is freed, its progress lost, it returns to
the head of the queue, and no new request is admitted in a slot that preempted.

vLLM walks the running list oldest first and preempts from the tail until the
current request's blocks fit; because memory only grows, what survives is the
longest prefix (in admission order) whose post-slot memory fits in ``M`` —
which is what the prefix sums below compute, without any Python branching.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View, WaitingEntry, any_of, fcfs_admit, held_first, preempt_newest
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["CurrentFit", "SCHEDULER"]


@dataclass(frozen=True, slots=True)
class CurrentFit:
    """FCFS, admit by current fit, preempt the newest running request by recompute."""

    name: str = "current-fit"
    description: str = "FCFS; admit while post-slot memory + first chunk fits; recompute-preempt newest on overflow (vLLM v1)"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Declared work-conservation margin ``Δ`` (tokens): whenever the queue
        is non-empty after the decision, memory used ≥ ``M − Δ``.

        Without a preemption the head was refused because post-slot memory
        plus its first chunk exceeds ``M``; with one, the kept prefix plus the
        first victim's post-slot memory (at most a peak) exceeds ``M``.  So
        ``Δ = B⌈(max s + max o)/B⌉ − 1``; a ``max_num_seqs`` cap voids it (``Δ = M``).
        """
        if params.max_num_seqs is not None:
            return params.M
        return min(params.M, int(tokens_held(max_s + max_o, params.block)) - 1)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Preempt the suffix (newest admissions) that does not fit; admit only if none was preempted."""
        preempt, kept = preempt_newest(view, ops)
        any_preempted = any_of(preempt, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(any_preempted))
        return Decision(admit=admit, preempt=preempt)


SCHEDULER = CurrentFit()
