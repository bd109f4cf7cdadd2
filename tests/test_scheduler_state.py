"""Scheduler state in the contract: declared once, carried by the engine, checked every slot."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvstab import Decision, Engine, ModelParams, StateVar, Traits, View
from kvstab.contract import check_next_state, check_scheduler_shape, initial_state, state_vars_of
from kvstab.errors import InvalidArgument, InvalidScheduler
from kvstab.ops import Ops


@dataclass(frozen=True)
class Spaced:
    """Admits the queue head only once every ``gap`` slots (a countdown in its state)."""

    gap: int = 3
    name: str = "spaced"
    description: str = "admit the head every gap slots"
    traits: Traits = Traits(fcfs=True)
    bad_next: object = None

    @property
    def state_vars(self) -> tuple[StateVar, ...]:
        return (StateVar("wait", initial=0, lo=0, hi=self.gap, help="slots until the next admission"),)

    def decide(self, view: View, ops: Ops) -> Decision:
        (wait,) = view.state
        ready = ops.eq(wait, 0)
        admit = tuple(ops.and_(ready, w.present, j == 0) for j, w in enumerate(view.waiting))
        any_admit = ops.or_(*admit) if admit else False
        nxt = ops.ite(any_admit, self.gap, ops.max(wait - 1, 0))
        state = (nxt,) if self.bad_next is None else self.bad_next
        return Decision(admit=admit, preempt=tuple(False for _ in view.active), state=state)  # type: ignore[arg-type]


def _params() -> ModelParams:
    return ModelParams(M=10_000, chunk=512)


def test_state_is_carried_from_slot_to_slot() -> None:
    eng = Engine(Spaced(), _params())
    for _ in range(6):
        eng.arrive(10, 50)
    admitted_at = []
    states = []
    for _ in range(12):
        rec = eng.step()
        states.append(rec.state)
        if rec.admitted:
            admitted_at.append(rec.slot)
    # admits at 0, then waits 3 slots: 0, 4, 8
    assert admitted_at == [0, 4, 8]
    assert states[:5] == [(3,), (2,), (1,), (0,), (3,)]
    assert eng.sched_state == states[-1]


def test_stateless_rules_have_empty_state() -> None:
    from kvstab.registry import load_scheduler

    eng = Engine(load_scheduler("current-fit"), _params())
    eng.arrive(10, 5)
    assert eng.view().state == ()
    assert eng.step().state == ()


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ((7,), "outside its declared bounds [0, 3]"),
        ((1.5,), "not an integer"),
        ((1, 2), "tuple of 1 values"),
        ([1], "tuple of 1 values"),
    ],
)
def test_a_bad_next_state_names_the_variable_and_the_slot(bad: object, needle: str) -> None:
    eng = Engine(Spaced(bad_next=bad), _params(), spec="spaced")
    eng.arrive(10, 5)
    with pytest.raises(InvalidScheduler) as err:
        eng.step()
    assert "slot 0" in str(err.value) and needle in str(err.value)


def test_real_state_must_be_finite() -> None:
    var = StateVar("ratio", initial=0.7, lo=0.0, hi=1.0, real=True)
    d = Decision(admit=(), preempt=(), state=(float("nan"),))
    with pytest.raises(InvalidScheduler, match="not finite"):
        check_next_state(d, (0.7,), (var,), "x")
    assert check_next_state(Decision(admit=(), preempt=(), state=(0.25,)), (0.7,), (var,), "x") == (0.25,)
    assert initial_state((var,)) == (0.7,)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": "not an id", "initial": 0, "lo": 0, "hi": 1}, "identifier"),
        ({"name": "x", "initial": 5, "lo": 0, "hi": 1}, "outside its bounds"),
        ({"name": "x", "initial": 0.5, "lo": 0, "hi": 1}, "not an integer"),
        ({"name": "x", "initial": 0, "lo": float("-inf"), "hi": 1, "real": True}, "not finite"),
    ],
)
def test_bad_declarations_are_refused(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidScheduler, match=needle):
        StateVar(**kwargs)  # type: ignore[arg-type]


def test_registry_checks_state_vars() -> None:
    @dataclass(frozen=True)
    class Dup(Spaced):
        @property
        def state_vars(self) -> tuple[StateVar, ...]:
            v = StateVar("a", initial=0, lo=0, hi=1)
            return (v, v)

    @dataclass(frozen=True)
    class NotVars(Spaced):
        state_vars: object = ("a",)

    assert check_scheduler_shape(Spaced()) is None
    assert "distinct" in (check_scheduler_shape(Dup()) or "")
    assert "tuple of kvstab.StateVar" in (check_scheduler_shape(NotVars()) or "")
    assert state_vars_of(Spaced())[0].name == "wait"


def test_load_state_sets_and_checks_the_scheduler_state() -> None:
    eng = Engine(Spaced(), _params())
    eng.load_state(waiting=[(10, 5)], sched_state=(2,))
    assert eng.view().state == (2,)
    assert not eng.step().admitted
    with pytest.raises(InvalidArgument, match="outside its declared bounds"):
        Engine(Spaced(), _params()).load_state(sched_state=(9,))


def test_idle_gaps_are_skipped_only_once_the_state_is_still() -> None:
    """A countdown keeps counting while the system is idle: those slots are stepped,
    and the gap is skipped only once the state stops changing."""
    from kvstab.arrivals import fixed_arrivals

    plan = fixed_arrivals([(0, 10, 1), (100, 10, 1)])
    eng = Engine(Spaced(), _params())
    eng.run(plan, drain=True, skip_idle=True)
    slots = [r.slot for r in eng.records]
    # slot 0 admits and prefills (wait := 3), slot 1 decodes the last token (wait 2) and frees the
    # server; the countdown runs 1, 0 in idle slots 2 and 3, then nothing changes until slot 100
    assert slots == [0, 1, 2, 3, 100, 101]  # the drain ends once the second request is done
    assert [r.state for r in eng.records[:4]] == [(3,), (2,), (1,), (0,)]
    assert eng.records[slots.index(100)].admitted == (1,)
