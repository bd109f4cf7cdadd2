"""Properties 1–8 on adversarial workloads, for every scheduler under audit.

Each test draws a server and an arrival plan (``kvstab.testing.strategies.scenarios``),
runs it through the reference engine to the end and drains it, checking one
property after every slot (``kvstab.testing.checks``).  A failure is shrunk by
Hypothesis to a minimal workload, and its message carries one-line replay
commands.  After the examples, a vacuity guard checks that the property's
premise actually held somewhere (a drift bound never tested with a queue is
not a pass).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.contract import traits_of
from kvstab.model import ModelParams
from kvstab.testing.checks import PROPERTIES, PropertyViolation, audit_plan, margin_of
from kvstab.testing.pytest_plugin import AuditTarget, Budget, ShrinkNotice
from kvstab.testing.strategies import saturated_scenarios, scenarios, windows

SLUGS = {
    1: "memory",
    2: "conservation-fcfs",
    3: "served-area",
    4: "area-per-slot",
    5: "lyapunov-identity",
    6: "drift-margin",
    7: "work-conservation",
    8: "liveness",
}
assert set(SLUGS) == set(PROPERTIES)


def run_property(target: AuditTarget, prop: int, b: Budget) -> Counter[int | str]:
    """Audit ``prop`` over the profile's examples (the queue window drawn too);
    return how often its premise held."""
    __tracebackhide__ = True  # the failure shows the property, the workload and the replay line
    exercised: Counter[int | str] = Counter()
    notice = ShrinkNotice(f"property {prop} of {target.spec}")

    @given(scenario=scenarios(max_M=b.max_M, max_size=b.max_requests, max_num_seqs=True), window=windows())
    def check(scenario: tuple, window: int) -> None:
        __tracebackhide__ = True
        params, plan = scenario
        try:
            aud = audit_plan(target.scheduler, params, plan, select={prop}, spec=target.spec, window=window)
        except PropertyViolation as exc:
            notice(exc)
            raise
        exercised.update(aud.exercised)

    check()
    return exercised


@pytest.mark.parametrize("prop", sorted(SLUGS), ids=[f"p{k}-{v}" for k, v in sorted(SLUGS.items())])
def test_property(audited_scheduler: AuditTarget, prop: int, props_budget: Budget) -> None:
    sched = audited_scheduler.scheduler
    if prop == 7 and not traits_of(sched).work_conserving:
        return  # the rule declares Traits(work_conserving=False): property 7 claims nothing of it
    __tracebackhide__ = True
    exercised = run_property(audited_scheduler, prop, props_budget)
    assert exercised[prop] > 0, f"vacuous: the premise of property {prop} never held on the drawn workloads"
    if prop == 3 and traits_of(sched).preempts:
        assert exercised["3-preempted"] > 0, "vacuous: no preempted request finished, g + wasted untested"
    if prop == 7 and traits_of(sched).clairvoyant and not traits_of(sched).preempts:
        assert exercised["7-engine"] > 0, "vacuous: the queue head never waited, the engine-state test never ran"


def _count_p6(
    exercised: Counter[int | str], notice: ShrinkNotice, target: AuditTarget, params: ModelParams, plan: ArrivalPlan,
    margin: int | None = None,
) -> None:
    """Check property 6 on one drawn plan and count the premises it exercised; a violation is
    noticed (the shrunk case's line) and raised to Hypothesis."""
    __tracebackhide__ = True
    try:
        aud = audit_plan(target.scheduler, params, plan, select={6}, spec=target.spec, margin=margin)
    except PropertyViolation as exc:
        notice(exc)
        raise
    exercised.update(aud.exercised)


def test_p6_drift_bound_under_saturation(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    """Property 6 where it has teeth: many small requests keep the server busy,
    so a margin of one peak is small against ``M`` and memory left idle while
    requests wait shows (with a few large requests, idleness hides inside Δ)."""
    exercised: Counter[int | str] = Counter()

    __tracebackhide__ = True
    notice = ShrinkNotice(f"property 6 of {audited_scheduler.spec} under saturation")

    @settings(max_examples=props_budget.max_examples)
    @given(scenario=saturated_scenarios(max_M=max(64, 2 * props_budget.max_M)))
    def check(scenario: tuple) -> None:
        __tracebackhide__ = True
        params, plan = scenario
        _count_p6(exercised, notice, audited_scheduler, params, plan)

    check()
    assert exercised[6] > 0, "vacuous: no saturated draw left a request waiting"


#: the small server on which the margin Δ is proved (kvstab.proofs): K active
#: and Q waiting entries in the encoding, prompts of exactly MAX_S tokens (so at
#: most M / MAX_S requests are ever active: the K bound covers every reachable
#: state) and outputs of at most MAX_O
PROVED_SERVER = ModelParams(M=12, chunk=4)
PROOF_K, PROOF_Q, MAX_S, MAX_O = 3, 2, 4, 3


def proved_margin(target: AuditTarget, b: Budget) -> int:
    """Δ proved for the rule on :data:`PROVED_SERVER` within the profile's solver
    budget; fails if it is not proved (Unknown is never a pass) or if it
    contradicts the declared margin."""
    __tracebackhide__ = True
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.margins import work_conservation_margin
    from kvstab.proofs.solver import Budget as SolverBudget
    from kvstab.proofs.verdicts import Proved

    p = PROVED_SERVER
    result = work_conservation_margin(
        target.scheduler, Setting(M=p.M, chunk=p.chunk), PROOF_K, PROOF_Q, MAX_S, MAX_O,
        budget=SolverBudget(rlimit=b.solver_rlimit, timeout_ms=120_000),
    )
    assert isinstance(result.verdict, Proved) and result.delta is not None, (
        f"the margin Δ of {target.spec} on M={p.M}, ŝ={p.chunk}, s ≤ {MAX_S}, o ≤ {MAX_O} is not proved: "
        f"{result.verdict} (an Unknown is not a pass; the profile's solver_rlimit is {b.solver_rlimit})"
    )
    declared = margin_of(target.scheduler, p, MAX_S, MAX_O)
    assert declared >= result.delta, (
        f"{target.spec} declares Δ = {declared} but the proof gives Δ = {result.delta} on M={p.M}: a state of "
        f"the invariant with a request waiting uses only M − {result.delta} (witness: {result.witness})"
    )
    return result.delta


@st.composite
def small_plans(draw: st.DrawFn) -> ArrivalPlan:
    """Workloads on :data:`PROVED_SERVER` within the proof's length bounds: a
    burst that overfills ``M`` (so requests wait), then a few more arrivals."""
    burst = draw(st.lists(st.integers(1, MAX_O), min_size=2, max_size=4))
    more = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(1, MAX_O)), max_size=5))
    rows = [(0, MAX_S, o) for o in burst]
    t = 0
    for gap, o in more:
        t += gap
        rows.append((t, MAX_S, o))
    return fixed_arrivals(rows)


def test_p6_drift_bound_with_the_proved_margin(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    """Property 6 with Δ proved by z3 where it is smaller than the declared one
    (``reserve`` and ``lookahead`` declare ``M − 1``), on a server small enough
    to prove it; a declared Δ the proof contradicts fails."""
    __tracebackhide__ = True
    if not traits_of(audited_scheduler.scheduler).work_conserving:
        return  # the rule claims no margin worth proving: property 6 keeps Δ = the declared one
    delta = min(proved_margin(audited_scheduler, props_budget),
                margin_of(audited_scheduler.scheduler, PROVED_SERVER, MAX_S, MAX_O))
    exercised: Counter[int | str] = Counter()
    notice = ShrinkNotice(f"property 6 of {audited_scheduler.spec} with the proved Δ = {delta}")

    @settings(max_examples=props_budget.max_examples)
    @given(plan=small_plans())
    def check(plan: ArrivalPlan) -> None:
        __tracebackhide__ = True
        _count_p6(exercised, notice, audited_scheduler, PROVED_SERVER, plan, margin=delta)

    check()
    assert exercised[6] > 0, "vacuous: no drawn workload left a request waiting"
