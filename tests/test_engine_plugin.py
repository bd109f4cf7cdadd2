"""The plug-in path: a rule kvstab does not know, traced once per view shape, must
give the reference engine's outcome exactly; a rule that cannot be traced falls
back to the reference engine, and the run says so."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutants import MUTANTS

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.contract import Decision, Scheduler, StateVar, Traits, View, state_vars_of
from kvstab.engine import run
from kvstab.engine.plugin import PluginPath, Untraceable, plugin_path, trace_rule
from kvstab.errors import InvariantViolation
from kvstab.model import ModelParams
from kvstab.ops import Ops
from kvstab.registry import builtin_names, load_scheduler
from kvstab.simulator import SimResult

FIELDS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "s o arrival first_admit finish preemptions served request_wasted"
).split()


@dataclass(frozen=True, slots=True)
class Outside:
    """A built-in's rule in a class kvstab does not know: it gets no compiled path,
    so the plug-in path (the tracer) runs it."""

    inner: Scheduler
    name: str = "outside"
    description: str = "a built-in rule behind an unknown class"
    traits: Traits = Traits()

    @property
    def state_vars(self) -> tuple[StateVar, ...]:
        """The wrapped rule's state (``sglang`` carries a real-valued ratio and a flag)."""
        return state_vars_of(self.inner)

    def decide(self, view: View, ops: Ops) -> Decision:
        """The wrapped rule's decision."""
        return self.inner.decide(view, ops)


RULES: list[Scheduler] = [Outside(load_scheduler(n)) for n in builtin_names(include_negative=True)] + [
    importlib.import_module(f"mutants.{m}").SCHEDULER for m in MUTANTS
]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ModelParams, ArrivalPlan, int]:
    M = draw(st.integers(8, 120))
    chunk = draw(st.one_of(st.integers(1, min(32, M)), st.just(M)))
    block = draw(st.sampled_from([b for b in (1, 1, 2, 4) if 2 * b <= M]))
    budget = draw(st.none() | st.integers(1, 48))
    seqs = draw(st.none() | st.integers(1, 5))
    params = ModelParams(M=M, chunk=chunk, block=block, token_budget=budget, max_num_seqs=seqs)
    horizon = draw(st.integers(1, 80))
    cap = M // block * block
    rows = []
    for _ in range(draw(st.integers(1, 16))):
        s = draw(st.integers(1, max(1, cap - 1)))
        rows.append((draw(st.integers(0, horizon // 2)), s, draw(st.integers(1, max(1, cap - s)))))
    return params, fixed_arrivals(rows), horizon


def _outcome(sched: Scheduler, params: ModelParams, plan: ArrivalPlan, horizon: int, engine: str) -> object:
    try:
        out = run(sched, params, plan, horizon, engine=engine)  # type: ignore[arg-type]
    except InvariantViolation as exc:
        return ("violation", exc.slot, exc.requests, str(exc))
    if engine == "fast" and out.engine == "reference":  # handed over: only for what the reference reports
        assert "handed over" in out.reason, out.reason
    else:
        assert out.engine == ("fast-plugin" if engine == "fast" else "reference"), out.reason
    return out.result


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), k=st.integers(0, len(RULES) - 1))
def test_plugin_path_matches_reference(scenario: tuple[ModelParams, ArrivalPlan, int], k: int) -> None:
    params, plan, horizon = scenario
    sched = RULES[k]
    ref = _outcome(sched, params, plan, horizon, "reference")
    fast = _outcome(sched, params, plan, horizon, "fast")
    if isinstance(ref, SimResult):
        assert isinstance(fast, SimResult), fast
        for f in FIELDS:
            assert np.array_equal(getattr(ref, f), getattr(fast, f)), f
    else:
        assert fast == ref


def test_untraceable_rule_falls_back_to_the_reference_engine() -> None:
    branches = load_scheduler("plugins.sample_plugins:BRANCHES")  # a Python `if` on a view value
    path, why = plugin_path(branches, "kvstab")
    assert path is None and "cannot be traced" in why
    params = ModelParams(M=64, chunk=8)
    plan = fixed_arrivals([(0, 5, 3), (1, 6, 3)])  # both short: the rule admits them, the run drains
    out = run(branches, params, plan, drain=True, max_slots=1000)  # a drained run is worth tracing: the tracer refuses
    assert out.engine == "reference" and "cannot be traced" in out.reason
    with pytest.raises(ValueError, match="no fast path"):
        run(branches, params, plan, 20, engine="fast")


def test_tracing_refuses_value_conversions() -> None:
    @dataclass(frozen=True)
    class Indexes:
        name: str = "indexes"
        description: str = "indexes a tuple with a view value"

        def decide(self, view: View, ops: Ops) -> Decision:
            pick = (True, False)[int(view.n_waiting > 0)]
            return Decision(admit=tuple(pick for _ in view.waiting), preempt=tuple(False for _ in view.active))

    with pytest.raises(Untraceable):
        trace_rule(Indexes(), ModelParams(M=64, chunk=8), 1, 1)
    assert isinstance(plugin_path(Outside(load_scheduler("lookahead")), "kvstab")[0], PluginPath)
