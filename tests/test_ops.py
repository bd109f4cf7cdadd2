"""The operations interface: the same rule gives the same decision on ints and on z3 terms."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.contract import ActiveEntry, View, WaitingEntry
from kvstab.errors import InvalidScheduler
from kvstab.ops import CONCRETE
from kvstab.registry import builtin_names, load_scheduler
from kvstab.symbolic import Sym, Z3Ops, unwrap


@given(x=st.integers(-(2**70), 2**70) | st.floats(-1e18, 1e18) | st.sampled_from([0.5, -0.5, -0.0, 2.0, -3.0]))
def test_floor_is_math_floor_concretely_and_in_z3(x: int | float) -> None:
    """``ops.floor``: an int (``x // 1`` would stay a float), z3's ``ToInt`` on a real."""
    want = math.floor(x)
    assert type(CONCRETE.floor(x)) is int and CONCRETE.floor(x) == want
    z = z3.Real("x") if isinstance(x, float) else z3.Int("x")
    term = unwrap(Z3Ops().floor(Sym(z)))
    value = z3.RealVal(Fraction(x)) if isinstance(x, float) else z3.IntVal(x)
    assert z3.simplify(z3.substitute(term, (z, value))).as_long() == want


@st.composite
def views(draw: st.DrawFn) -> View:
    chunk = draw(st.integers(1, 16))
    block = draw(st.sampled_from([1, 4]))
    M = draw(st.integers(20, 200))
    active = []
    for i in range(draw(st.integers(0, 4))):
        s = draw(st.integers(1, 40))
        o = draw(st.integers(1, 40))
        active.append(ActiveEntry(i, s, o, draw(st.integers(1, s + o - 1))))
    waiting = [
        WaitingEntry(10 + j, draw(st.integers(1, 40)), draw(st.integers(1, 40))) for j in range(draw(st.integers(0, 3)))
    ]
    return View(tuple(active), tuple(waiting), M=M, chunk=chunk, block=block, n_waiting=len(waiting))


def _lift(v: View) -> tuple[View, list[z3.BoolRef]]:
    """The same view with every value a fresh z3 constant, plus equations pinning them."""
    eqs: list[z3.BoolRef] = []

    def c(name: str, val: int) -> Sym:
        x = z3.Int(name)
        eqs.append(x == val)
        return Sym(x)

    def b(name: str) -> Sym:
        x = z3.Bool(name)
        eqs.append(x)
        return Sym(x)

    act = tuple(
        ActiveEntry(a.rid, c(f"s{i}", a.s), c(f"o{i}", a.o), c(f"p{i}", a.progress), b(f"a{i}"))
        for i, a in enumerate(v.active)
    )
    wait = tuple(WaitingEntry(w.rid, c(f"ws{j}", w.s), c(f"wo{j}", w.o), b(f"w{j}")) for j, w in enumerate(v.waiting))
    return View(act, wait, M=c("M", v.M), chunk=v.chunk, block=v.block, n_waiting=v.n_waiting), eqs


def _value(term: object, eqs: list[z3.BoolRef]) -> bool:
    s = z3.Solver()
    s.add(*eqs)
    assert s.check() == z3.sat
    return z3.is_true(s.model().eval(unwrap(term), model_completion=True))


@pytest.mark.parametrize("name", builtin_names(include_negative=True))
@given(v=views())
@settings(max_examples=30, deadline=None)
def test_concrete_and_symbolic_runs_agree(name: str, v: View) -> None:
    rule = load_scheduler(name)
    concrete = rule.decide(v, CONCRETE)
    sv, eqs = _lift(v)
    symbolic = rule.decide(sv, Z3Ops())
    assert [_value(x, eqs) for x in symbolic.admit] == list(concrete.admit)
    assert [_value(x, eqs) for x in symbolic.preempt] == list(concrete.preempt)


@given(a=st.integers(0, 500), b=st.integers(1, 40), c=st.integers(-50, 50))
def test_ops_agree_on_arithmetic(a: int, b: int, c: int) -> None:
    ops = Z3Ops()
    x, y, w = Sym(z3.IntVal(a)), Sym(z3.IntVal(b)), Sym(z3.IntVal(c))
    pairs = [
        (ops.min(x, y, w), CONCRETE.min(a, b, c)),
        (ops.max(x, y, w), CONCRETE.max(a, b, c)),
        (ops.div(x, y), CONCRETE.div(a, b)),
        (ops.ceil_div(x, y), CONCRETE.ceil_div(a, b)),
        (ops.sum([x, y, w]), CONCRETE.sum([a, b, c])),
        (ops.ite(ops.lt(x, y), x, y), CONCRETE.ite(a < b, a, b)),
        (ops.count([ops.lt(x, y), ops.le(y, w), ops.eq(x, x)]), CONCRETE.count([a < b, b <= c, True])),
    ]
    for sym, conc in pairs:
        assert z3.simplify(unwrap(sym)).as_long() == conc


@pytest.mark.parametrize(
    "snippet",
    ["bool(x < 3)", "x < 3 and True", "min(x, 3)", "int(x)", "range(x)", "float(x)", "not x"],
)
def test_every_concretisation_of_a_symbol_is_refused(snippet: str) -> None:
    x = Sym(z3.Int("x"))
    with pytest.raises(InvalidScheduler, match="<string>:1"):  # eval names its frame <string>
        eval(snippet, {"x": x})
