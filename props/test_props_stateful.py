"""One ``RuleBasedStateMachine`` over every scheduler under audit.

Hypothesis interleaves three rules — a request arrives, one slot runs, the
system drains — on a server it draws first; the :class:`~kvstab.testing.checks.Auditor`
checks properties 1–6 and 7 after every slot (and 8 on every drain), and the
invariants below re-check the state after every rule, arrivals included.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from kvstab.model import ModelParams, tokens_held
from kvstab.testing.checks import Auditor, PropertyViolation
from kvstab.testing.pytest_plugin import AuditTarget, Budget, ShrinkNotice, budget
from kvstab.testing.strategies import model_params, request_lengths, windows


class SchedulerMachine(RuleBasedStateMachine):
    """Arrive / step / drain against one scheduler (set by :func:`machine_for`)."""

    target: AuditTarget
    #: says once that a failure is being shrunk (set by :func:`machine_for`)
    notice: Callable[[BaseException], None]

    def __init__(self) -> None:
        super().__init__()
        self.aud: Auditor | None = None

    @initialize(params=model_params(max_M=budget().max_M, max_num_seqs=True), window=windows())
    def server(self, params: ModelParams, window: int) -> None:
        self.aud = Auditor(self.target.scheduler, params, spec=self.target.spec, window=window)

    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        assert self.aud is not None
        r = data.draw(request_lengths(self.aud.params), label="request")
        self.aud.arrive(r.s, r.o)

    @rule()
    def step(self) -> None:
        __tracebackhide__ = True
        assert self.aud is not None
        try:
            self.aud.step()
        except PropertyViolation as exc:
            self.notice(exc)
            raise

    @rule()
    def drain(self) -> None:
        __tracebackhide__ = True
        assert self.aud is not None
        try:
            self.aud.drain()
        except PropertyViolation as exc:
            self.notice(exc)
            raise
        # a drain stopped far past its bound is a livelock: property 8's, so it fails here under 8
        assert self.aud.engine.idle, self.aud.fail(8, None, "the drain did not empty the system")

    @invariant()
    def memory_within_capacity(self) -> None:
        # property 1 on the state as it stands between rules
        if self.aud is None:
            return
        p = self.aud.params
        held = sum(int(tokens_held(r.progress, p.block)) for r in self.aud.engine.active)
        assert held <= p.M, self.aud.fail(1, self.aud.engine.slot, f"active requests hold {held} > M={p.M}")

    @invariant()
    def requests_conserved(self) -> None:
        # property 2 between rules: every arrival is waiting, active or finished, once
        if self.aud is None:
            return
        eng = self.aud.engine
        ids = [r.rid for r in eng.waiting] + [r.rid for r in eng.active] + [r.rid for r in eng.requests if r.finish >= 0]
        assert sorted(ids) == list(range(len(eng.requests))), self.aud.fail(
            2, eng.slot, f"requests not conserved between rules: {sorted(ids)}"
        )

    @invariant()
    def remaining_area_accounted(self) -> None:
        # property 5's V between rules: it equals the remaining area of the system
        if self.aud is None:
            return
        a, eng = self.aud, self.aud.engine
        V = sum(a.g[r.rid] for r in eng.waiting) + sum(a.g[r.rid] - a.area[r.rid] for r in eng.active)
        assert V == a.V + a.arrived_g, a.fail(5, eng.slot, f"remaining area {V} != tracked {a.V} + {a.arrived_g}")


def machine_for(target: AuditTarget) -> type[SchedulerMachine]:
    """A machine class bound to one scheduler."""
    notice = ShrinkNotice(f"the stateful run of {target.spec}")
    return type(f"Machine[{target.spec}]", (SchedulerMachine,), {"target": target, "notice": staticmethod(notice)})


def test_stateful_machine(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    # shrinking is bounded by the profile's shrink_seconds (the plugin wraps every
    # audit test); each shrink step replays a whole run, so the runs stay short too
    __tracebackhide__ = True
    run_state_machine_as_test(
        machine_for(audited_scheduler),
        settings=settings(
            max_examples=props_budget.stateful_examples, stateful_step_count=props_budget.stateful_steps
        ),
    )
