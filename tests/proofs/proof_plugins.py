"""Plug-ins whose claims the proofs must refute (each one line away from a built-in)."""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import (
    Decision,
    StateVar,
    Traits,
    View,
    WaitingEntry,
    fcfs_admit,
    held_first,
    preempt_newest,
    used_next,
    used_now,
)
from kvstab.ops import BoolLike, IntLike, Ops


@dataclass(frozen=True, slots=True)
class AdmitsOnHeldNow:
    """current-fit that admits against the memory held *before* this slot's growth."""

    name: str = "admits-on-held-now"
    description: str = "current-fit, but admission is judged on memory held before the slot's growth"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, _kept = preempt_newest(view, ops)
        any_preempted = ops.or_(*preempt)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, used_now(view, ops), allowed=ops.not_(any_preempted))  # BUG
        return Decision(admit=admit, preempt=preempt)


ADMITS_ON_HELD_NOW = AdmitsOnHeldNow()


@dataclass(frozen=True, slots=True)
class ShortestTotalFirst:
    """Admits the queued request with the least s + o first — reading o while declaring it does not."""

    name: str = "shortest-total-first"
    description: str = "admit one request per slot: the least s + o that fits (claims to be non-clairvoyant)"
    traits: Traits = Traits(fcfs=False, work_conserving=False, clairvoyant=False, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)
        allowed = ops.not_(ops.or_(*preempt))
        admits: list[BoolLike] = []
        for j, w in enumerate(view.waiting):
            fits = ops.le(kept + held_first(view, w, ops), view.M)
            # BUG: ranks by s + o although o is not known at admission
            best = ops.and_(*[ops.or_(ops.not_(v.present), ops.le(w.s + w.o, v.s + v.o)) for v in view.waiting])
            first_best = ops.and_(
                *[ops.or_(ops.not_(v.present), ops.lt(w.s + w.o, v.s + v.o)) for v in view.waiting[:j]]
            )
            admits.append(ops.and_(w.present, allowed, fits, best, first_best))
        return Decision(admit=tuple(admits), preempt=preempt)


SHORTEST_TOTAL_FIRST = ShortestTotalFirst()


@dataclass(frozen=True, slots=True)
class ModestMargin:
    """current-fit with a declared margin smaller than the one the proof finds."""

    name: str = "modest-margin"
    description: str = "current-fit whose margin() claims Δ = 5"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def margin(self, params: object, max_s: int, max_o: int) -> int:
        return 5

    def decide(self, view: View, ops: Ops) -> Decision:
        from kvstab.schedulers.current_fit import CurrentFit

        return CurrentFit().decide(view, ops)


MODEST_MARGIN = ModestMargin()


@dataclass(frozen=True, slots=True)
class SizeDependent:
    """current-fit while few requests run; with four or more it stops preempting (a structure that changes with K)."""

    name: str = "size-dependent"
    description: str = "current-fit below four running requests, current-fit-no-preempt from four"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        # a Python branch on the view's length is allowed by the contract, but it
        # means the structure seen at small sizes is not the one at large sizes
        if len(view.active) < 4:
            preempt, kept = preempt_newest(view, ops)
            admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
            return Decision(admit=admit, preempt=preempt)
        admit = fcfs_admit(view, ops, fits, used_next(view, ops))
        return Decision(admit=admit, preempt=tuple(False for _ in view.active))


SIZE_DEPENDENT = SizeDependent()


@dataclass(frozen=True, slots=True)
class ThresholdBeyondSizes:
    """current-fit that admits against 2·M once five or more requests run: it overflows, but only
    at sizes larger than those at which the class premises are observed symbolically."""

    name: str = "threshold-beyond-sizes"
    description: str = "current-fit, but the admission limit doubles from five running requests"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        limit = view.M * 2 if len(view.active) >= 5 else view.M

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, limit), after

        preempt, kept = preempt_newest(view, ops)
        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt)


THRESHOLD_BEYOND_SIZES = ThresholdBeyondSizes()


# --- stateful rules (kvstab.contract.StateVar): the proofs carry their state symbolically


@dataclass(frozen=True, slots=True)
class RatioReserve:
    """current-fit that also sets aside ``ratio · (remaining output)`` for every
    request, with ``ratio`` a real state variable that decays every slot and
    jumps back up after a preemption (the shape of SGLang's ``new_token_ratio``).
    Memory-safe whatever the ratio: the reserve only makes admission stricter."""

    name: str = "ratio-reserve"
    description: str = "current-fit plus a decaying reserve ratio·Σ remaining tokens (real state)"
    traits: Traits = Traits(fcfs=True, clairvoyant=True, preempts=True)
    state_vars: tuple[StateVar, ...] = (
        StateVar("ratio", initial=0.75, lo=0.1, hi=1.0, real=True, help="share of remaining tokens to reserve"),
    )

    def decide(self, view: View, ops: Ops) -> Decision:
        (ratio,) = view.state
        preempt, kept = preempt_newest(view, ops)
        any_preempted = ops.or_(*preempt)
        remaining = ops.sum(ops.ite(a.present, a.s + a.o - a.progress, 0) for a in view.active)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops) + ratio * w.o
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept + ratio * remaining, allowed=ops.not_(any_preempted))
        nxt = ops.ite(any_preempted, ops.min(ratio + 0.25, 1.0), ops.max(ratio - 0.125, 0.1))
        return Decision(admit=admit, preempt=preempt, state=(nxt,))


RATIO_RESERVE = RatioReserve()


@dataclass(frozen=True, slots=True)
class ToggleUnchecked:
    """current-fit every other slot; in the others (its state says which) it admits
    the queue head without looking at memory — overflows two slots into a run."""

    name: str = "toggle-unchecked"
    description: str = "current-fit, but every second slot admission skips the memory test"
    traits: Traits = Traits(fcfs=True, clairvoyant=False, preempts=True)
    state_vars: tuple[StateVar, ...] = (StateVar("odd", initial=0, lo=0, hi=1, help="1 in every second slot"),)

    def decide(self, view: View, ops: Ops) -> Decision:
        (odd,) = view.state
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.or_(ops.eq(odd, 1), ops.le(after, view.M)), after  # BUG: no memory test when odd

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt, state=(1 - odd,))


TOGGLE_UNCHECKED = ToggleUnchecked()


@dataclass(frozen=True, slots=True)
class CountsAdmissions:
    """current-fit that records how many it admitted, declared as at most one — but
    nothing limits admissions to one, so two arrivals in a slot break the bound."""

    name: str = "counts-admissions"
    description: str = "current-fit with a state 'admitted last slot' declared in [0, 1]"
    traits: Traits = Traits(fcfs=True, clairvoyant=False, preempts=True)
    state_vars: tuple[StateVar, ...] = (StateVar("admitted", initial=0, lo=0, hi=1, help="admissions last slot"),)

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt, state=(ops.count(admit),))  # BUG: can exceed 1


COUNTS_ADMISSIONS = CountsAdmissions()
