"""One ``RuleBasedStateMachine`` over every scheduler under audit.

Hypothesis interleaves three rules — a request arrives, one slot runs, the
system drains — on a server it draws first; the :class:`~kvstab.checks.Auditor`
checks properties 1–6 and 7 after every slot (and 8 on every drain), and the
invariants below re-check the state after every rule, arrivals included.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from kvstab.checks import Auditor
from kvstab.model import ModelParams, tokens_held
from kvstab.pytest_plugin import AuditTarget, Budget, budget
from kvstab.strategies import model_params, request_lengths


class SchedulerMachine(RuleBasedStateMachine):
    """Arrive / step / drain against one scheduler (set by :func:`machine_for`)."""

    target: AuditTarget

    def __init__(self) -> None:
        super().__init__()
        self.aud: Auditor | None = None

    @initialize(params=model_params(max_M=budget().max_M, max_num_seqs=True))
    def server(self, params: ModelParams) -> None:
        self.aud = Auditor(self.target.scheduler, params, spec=self.target.spec)

    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        assert self.aud is not None
        r = data.draw(request_lengths(self.aud.params), label="request")
        self.aud.arrive(r.s, r.o)

    @rule()
    def step(self) -> None:
        assert self.aud is not None
        self.aud.step()

    @rule()
    def drain(self) -> None:
        assert self.aud is not None
        self.aud.drain()
        assert self.aud.engine.idle

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
    return type(f"Machine[{target.spec}]", (SchedulerMachine,), {"target": target})


def test_stateful_machine(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    run_state_machine_as_test(
        machine_for(audited_scheduler),
        settings=settings(
            max_examples=props_budget.stateful_examples, stateful_step_count=props_budget.stateful_steps
        ),
    )
