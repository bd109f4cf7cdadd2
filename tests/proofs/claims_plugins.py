"""The one-line claim bugs of ``tests/mutants`` written with kvstab.contract's folds, so that
the claims for any number of requests (``proofs/claims_folds.py``) meet them: each is in the
prefix-fold class, each breaks one declared claim (``BREAKS``), and the bounded check must
find the concrete state that shows it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvstab.contract import (
    ActiveEntry,
    Decision,
    Traits,
    View,
    WaitingEntry,
    any_of,
    count_of,
    fcfs_admit,
    held_first,
    held_next,
    no_preemption,
    preempt_newest,
    scan,
    sum_of,
    used_next,
    zipped,
)
from kvstab.model import tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.schedulers.reserve import peak

#: current-fit's declared claims, as a port of it would keep them
CURRENT_FIT = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)


def _admit_by_current_fit(
    view: View, ops: Ops, kept: IntLike, allowed: BoolLike, also: Callable[[WaitingEntry, IntLike], BoolLike] | None = None
) -> tuple[BoolLike, ...]:
    """current-fit's admission (``also``: a further test a port adds)."""

    def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
        after = acc + held_first(view, w, ops)
        ok = ops.le(after, view.M)
        return (ok if also is None else ops.and_(ok, also(w, acc))), after

    return fcfs_admit(view, ops, fits, kept, allowed=allowed)


def _preempt_on_overflow(view: View, ops: Ops, victim: Callable[[ActiveEntry, BoolLike, BoolLike], BoolLike]) -> Decision:
    """When the post-slot memory of everyone exceeds ``M``, preempt the entries ``victim(a, overflow,
    none_before)`` picks (``none_before``: no present entry before ``a``); admit only without an overflow."""
    total = used_next(view, ops)
    overflow = ops.lt(view.M, total)

    def step(a: ActiveEntry, none_before: BoolLike) -> tuple[BoolLike, BoolLike]:
        return victim(a, overflow, none_before), ops.and_(none_before, ops.not_(a.present))

    preempt, _ = scan(view.active, step, True)
    freed = sum_of(zipped(view.active, preempt), lambda ap: ops.ite(ap[1], held_next(view, ap[0], ops), 0), ops)
    return Decision(admit=_admit_by_current_fit(view, ops, total - freed, ops.not_(overflow)), preempt=preempt)


@dataclass(frozen=True, slots=True)
class FirstFitFolds:
    """``skips_blocked_head`` in folds: reserve's test, but a refused head blocks nobody."""

    name: str = "first-fit-folds"
    description: str = "reserve with first-fit admission (no head-of-line blocking) claiming FCFS"
    traits: Traits = Traits(fcfs=True, clairvoyant=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        def step(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + peak(view, w, ops)
            take = ops.and_(w.present, ops.le(after, view.M))  # BUG: no blocking behind a refused head
            return take, ops.ite(take, after, acc)

        admit, _ = scan(view.waiting, step, sum_of(view.active, lambda a: peak(view, a, ops), ops))
        return Decision(admit=admit, preempt=no_preemption(view))


@dataclass(frozen=True, slots=True)
class OldestVictimFolds:
    """``wrong_victim`` in folds: on overflow the *oldest* running request is preempted."""

    name: str = "oldest-victim-folds"
    description: str = "current-fit that preempts the oldest running request instead of the newest"
    traits: Traits = CURRENT_FIT

    def decide(self, view: View, ops: Ops) -> Decision:
        # BUG: the first present (oldest) request, whatever the overflow
        return _preempt_on_overflow(view, ops, lambda a, overflow, first: ops.and_(a.present, overflow, first))


@dataclass(frozen=True, slots=True)
class PreemptsAllFolds:
    """``preempts_all`` in folds: on overflow every running request is preempted."""

    name: str = "preempts-all-folds"
    description: str = "current-fit that preempts the whole batch when memory would overflow"
    traits: Traits = CURRENT_FIT

    def decide(self, view: View, ops: Ops) -> Decision:
        return _preempt_on_overflow(view, ops, lambda a, overflow, _: ops.and_(a.present, overflow))  # BUG: everyone


@dataclass(frozen=True, slots=True)
class BusyOnlyFolds:
    """current-fit that admits only while something runs: an empty server never fills."""

    name: str = "busy-only-folds"
    description: str = "current-fit that admits only while a request is running"
    traits: Traits = CURRENT_FIT

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)
        busy = ops.lt(0, count_of(view.active, lambda a: a.present, ops))  # BUG: an empty server stays empty
        return Decision(
            admit=_admit_by_current_fit(view, ops, kept, ops.and_(busy, ops.not_(any_of(preempt, ops)))), preempt=preempt
        )


@dataclass(frozen=True, slots=True)
class PeakCheckFolds:
    """current-fit that also checks the head's peak ``s + o`` — reading ``o`` while declaring it does not."""

    name: str = "peak-check-folds"
    description: str = "current-fit whose admission also needs the head's peak to fit (claims non-clairvoyance)"
    traits: Traits = CURRENT_FIT

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def peak_fits(w: WaitingEntry, acc: IntLike) -> BoolLike:
            return ops.le(acc + tokens_held(w.s + w.o, view.block, ops), view.M)  # BUG: reads o

        return Decision(
            admit=_admit_by_current_fit(view, ops, kept, ops.not_(any_of(preempt, ops)), peak_fits), preempt=preempt
        )


FIRST_FIT_FOLDS = FirstFitFolds()
OLDEST_VICTIM_FOLDS = OldestVictimFolds()
PREEMPTS_ALL_FOLDS = PreemptsAllFolds()
BUSY_ONLY_FOLDS = BusyOnlyFolds()
PEAK_CHECK_FOLDS = PeakCheckFolds()

#: each rule and the declared claims it breaks
BREAKS: dict[str, tuple[str, ...]] = {
    "FIRST_FIT_FOLDS": ("FCFS admissions",),
    "OLDEST_VICTIM_FOLDS": ("oldest running request progresses", "no livelock (ranking function)"),
    "PREEMPTS_ALL_FOLDS": ("oldest running request progresses", "no livelock (ranking function)"),
    "BUSY_ONLY_FOLDS": ("lone head admitted", "no livelock (ranking function)"),
    "PEAK_CHECK_FOLDS": ("non-clairvoyant",),
}
