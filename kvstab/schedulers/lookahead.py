"""``lookahead``: FCFS admission that projects every admitted request's memory.

Clairvoyant (reads ``o``): admit the queue head while the projected memory of
all admitted requests, the head's included, stays within ``M`` in every
future slot, assuming each advances one unit per slot (MODEL.md, convention
2).  Each request's memory grows until it finishes and then drops to zero,
so the total is largest just before some request finishes: it suffices to
check the total at each admitted request's finish slot.  Unlike ``reserve``
it does not hold memory a request will only need later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstab.contract import Decision, Traits, View, WaitingEntry, fcfs_admit
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["Lookahead", "SCHEDULER", "Projection"]


@dataclass(frozen=True, slots=True)
class Projection:
    """A request's future: slots until it finishes (``f``, this slot counted)
    and enough to evaluate the memory it holds ``τ`` slots from now."""

    s: IntLike
    p: IntLike
    f: IntLike
    rp: IntLike
    present: BoolLike

    @staticmethod
    def of(view: View, s: IntLike, o: IntLike, p: IntLike, present: BoolLike, ops: Ops) -> Projection:
        """Project a request with prompt ``s``, output ``o`` and progress ``p``."""
        rp = ops.ceil_div(ops.max(s - p, 0), view.chunk)  # prefill slots left
        f = rp + s + o - ops.max(p, s)  # + decode slots left
        return Projection(s=s, p=p, f=f, rp=rp, present=present)

    def held_at(self, view: View, tau: IntLike, ops: Ops) -> IntLike:
        """Memory after ``tau`` more slots (``tau ≥ 1``); 0 once finished or if empty."""
        prog = ops.ite(
            ops.le(tau, self.rp),
            ops.min(self.p + tau * view.chunk, self.s),
            ops.max(self.p, self.s) + tau - self.rp,
        )
        alive = ops.and_(self.present, ops.le(tau, self.f))
        return ops.ite(alive, tokens_held(prog, view.block, ops), 0)


@dataclass(frozen=True, slots=True)
class Lookahead:
    """FCFS; admit while projected memory of all admitted requests stays within M in every future slot."""

    name: str = "lookahead"
    description: str = "FCFS, clairvoyant; admit while projected memory stays within M at every future slot; never preempts"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Declared margin ``Δ = M − 1``: only that some request runs while the
        queue is non-empty is guaranteed, because admission is judged on
        memory the admitted requests will hold later, not on what they hold now."""
        return params.M - 1

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admit the head while the projected peak (checked at every finish slot) fits in ``M``."""
        act = [Projection.of(view, a.s, a.o, a.progress, a.present, ops) for a in view.active]
        # totals[k]: projected memory at the finish slot of act[k]
        totals = tuple(ops.sum(q.held_at(view, k.f, ops) for q in act) for k in act)
        # the accumulator: (projected totals at each included request's finish
        # slot,) with a per-candidate entry appended lazily below
        cands = [Projection.of(view, w.s, w.o, 0, w.present, ops) for w in view.waiting]
        index = {id(w): j for j, w in enumerate(view.waiting)}
        # included flags of earlier candidates are tracked through the accumulator
        start: tuple[Any, ...] = (totals, tuple(False for _ in cands))

        def fits(w: WaitingEntry, acc: tuple[Any, ...]) -> tuple[BoolLike, tuple[Any, ...]]:
            tot_act, incl = acc
            j = index[id(w)]
            c = cands[j]
            # candidate's own memory at every earlier finish slot
            new_act = tuple(t + c.held_at(view, k.f, ops) for t, k in zip(tot_act, act))
            new_cand_tot = []
            for i, (flag, ci) in enumerate(zip(incl, cands)):
                if i >= j:
                    break
                new_cand_tot.append((flag, ci))
            # total at the candidate's own finish slot: everyone included, itself too
            at_own = (
                ops.sum(q.held_at(view, c.f, ops) for q in act)
                + ops.sum(ops.ite(flag, ci.held_at(view, c.f, ops), 0) for flag, ci in new_cand_tot)
                + c.held_at(view, c.f, ops)
            )
            # totals at finish slots of earlier included candidates, with c added
            ok_cands = [
                ops.or_(
                    ops.not_(flag),
                    ops.le(
                        ops.sum(q.held_at(view, ci.f, ops) for q in act)
                        + ops.sum(ops.ite(fl2, cj.held_at(view, ci.f, ops), 0) for fl2, cj in new_cand_tot)
                        + c.held_at(view, ci.f, ops),
                        view.M,
                    ),
                )
                for flag, ci in new_cand_tot
            ]
            ok = ops.and_(
                c.present,
                ops.le(at_own, view.M),
                *[ops.le(t, view.M) for t in new_act],
                *ok_cands,
            )
            new_incl = tuple(True if i == j else f for i, f in enumerate(incl))
            return ok, (new_act, new_incl)

        admit = fcfs_admit(view, ops, fits, start)
        return Decision(admit=admit, preempt=tuple(False for _ in view.active))


SCHEDULER = Lookahead()
