"""Scheduler state in the proofs: symbolic pre state within its declared bounds,
a post state pinned to ``Decision.state``, one bounds obligation per variable,
counterexamples that carry the state and replay through ``Engine.load_state``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import z3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstab.cli import main
from kvstab.contract import Decision, StateVar, Traits, View
from kvstab.errors import InvalidScheduler
from kvstab.ops import Ops
from kvstab.proofs.claims import prove_claims
from kvstab.proofs.encoding import Setting, encode_step, fresh_state
from kvstab.proofs.induction import check_inductive
from kvstab.proofs.prove import prove
from kvstab.proofs.selfcheck import CompiledStep, compare, engine_step
from kvstab.proofs.solver import Budget, product_bounds
from kvstab.proofs.verdicts import Proved, Refuted
from kvstab.symbolic import Sym, Z3Ops

HERE = Path(__file__).resolve().parent


@pytest.fixture()
def plugins(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("proof_plugins", None)
    import proof_plugins

    return proof_plugins


def test_a_stateful_rule_with_a_real_ratio_is_proved(plugins: ModuleType, setting: Setting, budget: Budget) -> None:
    # "admit if used + first + ratio·Σ remaining ≤ M", ratio a real in [0.1, 1]:
    # non-linear (real × integer), answered with the product bounds
    rep = prove(plugins.RATIO_RESERVE, K=3, Q=2, setting=setting, budget=budget)
    assert isinstance(rep.verdict, Proved), rep.verdict
    bounds = [o for o in rep.obligations if o.conjunct == "state ratio ∈ [0.1, 1.0]′"]
    assert {o.branch for o in bounds} == {"holds", "preempts", "admits"}
    assert all(isinstance(o.verdict, Proved) for o in bounds)
    # the initial state is within its bounds too (initiation)
    assert any(o.name == "init" and o.conjunct == "state ratio ∈ [0.1, 1.0]" for o in rep.obligations)


def test_a_stateful_overflow_is_refuted_by_a_replayed_run(
    plugins: ModuleType, setting: Setting, budget: Budget
) -> None:
    rep = prove(plugins.TOGGLE_UNCHECKED, K=2, Q=2, setting=setting, budget=budget)
    v = rep.verdict
    assert isinstance(v, Refuted) and v.trace is not None, v
    tr = v.trace
    assert tr.kind == "reachable" and tr.replayed, tr.describe()
    # the run starts at the declared initial state and overflows in the slot whose state is 1
    assert tr.slots[0].state == (0,) and tr.slots[-1].state == (1,)
    assert tr.violation_memory > tr.M and not tr.broken_state


def test_a_counterexample_to_induction_replays_from_its_scheduler_state(
    plugins: ModuleType, setting: Setting, budget: Budget
) -> None:
    res = check_inductive(plugins.TOGGLE_UNCHECKED, setting, 2, 2, budget=budget)
    v = res.verdict
    assert isinstance(v, Refuted) and v.trace is not None and v.trace.kind == "cti"
    # only a state with odd = 1 skips the memory test: the engine is loaded with it
    assert v.trace.initial_state == (1,) and v.trace.replayed, v.trace.describe()
    assert "sched_state=(1,)" in v.trace.replay_command


def test_a_rule_that_leaves_its_bounds_is_refuted(plugins: ModuleType, setting: Setting, budget: Budget) -> None:
    res = check_inductive(plugins.COUNTS_ADMISSIONS, setting, 2, 2, budget=budget)
    broken = [o for o in res.obligations if o.conjunct == "state admitted ∈ [0, 1]′"]
    assert [o.branch for o in broken if isinstance(o.verdict, Refuted)] == ["admits"]
    cti = next(o.verdict for o in broken if isinstance(o.verdict, Refuted))
    assert isinstance(cti, Refuted) and cti.trace is not None
    assert cti.trace.broken_state == "admitted" and cti.trace.replayed, cti.trace.describe()
    assert cti.trace.slots[0].next_state[0] > 1
    # and the whole flow finds it reachable from the empty system
    rep = prove(plugins.COUNTS_ADMISSIONS, K=2, Q=2, setting=setting, budget=budget)
    v = rep.verdict
    assert isinstance(v, Refuted) and v.trace is not None
    assert v.trace.kind == "reachable" and v.trace.broken_state == "admitted" and v.trace.replayed
    assert "InvalidScheduler" in v.trace.replay_message


@dataclass(frozen=True, slots=True)
class RealIntoInt:
    """Gives an integer state variable a real-valued next value (the engine rejects it)."""

    name: str = "real-into-int"
    description: str = "an integer state computed with a real factor"
    traits: Traits = Traits()
    state_vars: tuple[StateVar, ...] = (StateVar("n", initial=0, lo=0, hi=10),)

    def decide(self, view: View, ops: Ops) -> Decision:
        (n,) = view.state
        return Decision(
            admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active), state=(n * 0.5,)
        )


def test_a_real_next_value_of_an_integer_variable_is_one_clear_error(setting: Setting) -> None:
    rule = RealIntoInt()
    with pytest.raises(InvalidScheduler, match="state variable 'n' is an integer but the rule gives it a real"):
        encode_step(rule, fresh_state("pre", 1, 1, rule.state_vars), setting, "post")


def test_real_floor_division_is_python_s() -> None:
    r = Sym(z3.Real("r"))
    ops = Z3Ops()
    for value, b in ((2.5, 2), (-2.5, 2), (7.0, 3)):
        sub = [(r.z, z3.RealVal(value))]
        assert z3.simplify(z3.substitute((r // b).z, *sub)).as_long() == value // b
        assert z3.simplify(z3.substitute(ops.ceil_div(r, b).z, *sub)).as_long() == -(-value // b)
        assert float(z3.simplify(z3.substitute((r % b).z, *sub)).as_fraction()) == value % b


def test_product_bounds_are_conditioned_on_the_declared_bounds() -> None:
    x = z3.Int("x")
    (ratio,) = fresh_state("pb", 0, 0, (StateVar("ratio", initial=0.5, lo=0.1, hi=1.0, real=True),)).sched
    goal = ratio * x
    facts = product_bounds([goal >= 0])
    assert len(facts) == 1
    # valid: no model of r·x with r in bounds breaks it, and outside the bounds it says nothing
    assert z3.Solver().check(z3.Not(facts[0])) == z3.unsat
    s = z3.Solver()
    s.add(facts[0], ratio == 5, x == 1, goal == 5)
    assert s.check() == z3.sat


#: reals drawn as multiples of 1/64, exact in floats, so the engine's float
#: arithmetic and z3's rationals agree on every comparison
@pytest.mark.parametrize("rule", ["RATIO_RESERVE", "TOGGLE_UNCHECKED", "COUNTS_ADMISSIONS"])
def test_the_encoding_of_a_stateful_slot_matches_the_engine(plugins: ModuleType, rule: str) -> None:
    sched = getattr(plugins, rule)
    (var,) = sched.state_vars
    setting = Setting(M=None, chunk=4, block=1)
    step = CompiledStep(sched, setting, 3, 3)
    lo, hi = int(var.lo * 64) + 1, int(var.hi * 64)

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(
        M=st.integers(10, 40),
        active=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(0, 40)), max_size=3),
        waiting=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), max_size=3),
        k=st.integers(0, 10**6),
    )
    def check(M: int, active: list[tuple[int, int, int]], waiting: list[tuple[int, int]], k: int) -> None:
        act = tuple((s, o, 1 + p % (s + o - 1)) if s + o > 1 else (1, 1, 1) for s, o, p in active)
        value: int | float = (lo + k % (hi - lo + 1)) / 64 if var.real else var.lo + k % (var.hi - var.lo + 1)
        state = (M, act, tuple(waiting), (value,))
        try:
            expected = engine_step(sched, setting, state)
        except InvalidScheduler:
            # the engine rejects a next state outside the bounds; the encoding
            # gives it (the bounds are an obligation, not part of the step)
            assert not var.lo <= step(state).sched[0] <= var.hi
            return
        diff = compare(step(state), expected)
        assert not diff, f"{rule} on {state}: " + "; ".join(diff)
        assert compare(step.by_z3(state), expected) == []

    check()


def test_claims_of_a_stateful_rule(plugins: ModuleType, setting: Setting, budget: Budget) -> None:
    # non-clairvoyance by two copies that share the scheduler state
    res = prove_claims(plugins.TOGGLE_UNCHECKED, setting, K=2, Q=2, budget=budget, only=["non-clairvoyant", "fcfs"])
    assert isinstance(res.verdict, Proved), res.claims


def test_the_cli_proves_a_stateful_plugin(plugins: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prove", "--scheduler", "proof_plugins:RATIO_RESERVE", "--K", "2", "--Q", "2"]) == 0
    out = capsys.readouterr().out
    assert "state ratio ∈ [0.1, 1.0]′" in out and "verdict: Proved (1-induction)" in out
    # why it is not the unbounded theorem: it iterates the preempt flags itself (ops.or_(*preempt))
    assert "note: not proved for every number of requests (outside the prefix-fold class" in out
    assert main(["prove", "--scheduler", "proof_plugins:COUNTS_ADMISSIONS", "--K", "2", "--Q", "2"]) == 1
    out = capsys.readouterr().out
    assert "state variable 'admitted' leaves its declared bounds" in out and "reproduced" in out
