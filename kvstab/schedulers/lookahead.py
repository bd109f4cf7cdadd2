"""``lookahead``: FCFS admission that projects every admitted request's memory.

Clairvoyant (reads ``o``): admit the queue head while the projected memory of
all admitted requests, the head's included, stays within ``M`` in every
future slot, assuming each advances one unit per slot (MODEL.md, convention
2).  Each request's memory grows until it finishes and then drops to zero,
so the total is largest just before some request finishes: it suffices to
check the total at each admitted request's finish slot.  Unlike ``reserve``
it does not hold memory a request will only need later.  The walk is
:func:`kvstab.contract.fcfs_admit_projected`; this module gives it the
projection.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View, fcfs_admit_projected, no_preemption
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.schedulers.reserve import future_memory_margin

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
        """Declared margin: :func:`~kvstab.schedulers.reserve.future_memory_margin`."""
        return future_memory_margin(params)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admit the head while the projected peak (checked at every finish slot) fits in ``M``."""

        def project(s: IntLike, o: IntLike, p: IntLike, present: BoolLike) -> Projection:
            return Projection.of(view, s, o, p, present, ops)

        return Decision(admit=fcfs_admit_projected(view, ops, project), preempt=no_preemption(view))


SCHEDULER = Lookahead()
