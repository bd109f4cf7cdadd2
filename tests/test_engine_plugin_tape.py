"""The plug-in path's tape and compiled loop against the reference engine.

Every run is done twice — on ``engine="fast"`` (the taped rule in the compiled
loop, or the rule asked directly for shapes met only a few times) and on the
reference engine — and must agree on every SimResult array and count, or raise
the same error with the same message.  The rules cover what the loop must carry:
grants (vllm-v1's rule), scheduler state (a token bucket), a rule that is not
monotone in progress, checked arithmetic that leaves the 64-bit registers,
division by zero, negative grants and next states out of bounds (the loop hands
those over to the reference engine, which reports them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.contract import (
    Decision,
    Scheduler,
    StateVar,
    Traits,
    View,
    WaitingEntry,
    fcfs_admit,
    held_first,
    held_now,
    preempt_newest,
)
from kvstab.engine import plugin, run
from kvstab.engine.tape import BOOL, EITHER, EXACT, LIMIT, OP, STORE, TapeOps, Untraceable, trace_tape
from kvstab.errors import InvalidScheduler, InvariantViolation
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE, BoolLike, IntLike, Ops
from kvstab.registry import load_scheduler
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import SimResult

FIELDS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "s o arrival first_admit finish preemptions served request_wasted"
).split()


@dataclass(frozen=True, slots=True)
class Outside:
    """A built-in rule behind a class kvstab does not know (so no compiled built-in path)."""

    inner: Scheduler
    name: str = "outside"
    description: str = "a built-in rule behind an unknown class"

    def decide(self, view: View, ops: Ops) -> Decision:
        """The wrapped rule's decision."""
        return self.inner.decide(view, ops)


class PluginSglang(Sglang):
    """sglang's rule in a subclass: not the built-in class itself, so it has no compiled engine
    and the plug-in path tapes it (real-valued state, float reservations, retraction)."""


#: sglang's rule on the plug-in path (the built-in ``sglang`` runs on its own compiled engine)
SGLANG = PluginSglang()


@dataclass(frozen=True, slots=True)
class Bucket:
    """A stateful rule: current fit, admissions paid from a credit that refills by one per slot."""

    name: str = "bucket"
    description: str = "current fit, admitting only while a credit bucket holds 3"
    state_vars: tuple[StateVar, ...] = (StateVar("credit", 2, 0, 10),)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Preempt the newest that do not fit; admit by current fit when the bucket allows."""
        credit = view.state[0]
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        allowed = ops.and_(ops.not_(ops.or_(*preempt)), ops.le(3, credit))
        admit = fcfs_admit(view, ops, fits, kept, allowed=allowed)
        paid = ops.ite(ops.lt(0, ops.count(admit)), 3, 0)
        return Decision(admit=admit, preempt=preempt, state=(ops.min(10, ops.max(0, credit + 1 - paid)),))


@dataclass(frozen=True, slots=True)
class Parity:
    """Not monotone in progress: admits the head only while the memory held is even,
    preempts the newest whenever the memory held is 3 mod 5 (and when it must)."""

    name: str = "parity"
    description: str = "admission and preemption by the parity of the memory held"

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admission and preemption by arithmetic on the memory held, not by monotone tests."""
        used = ops.sum(held_now(view, a, ops) for a in view.active)
        must, kept = preempt_newest(view, ops)
        odd = ops.eq(used % 5, 3)
        k = len(view.active)
        preempt = tuple(ops.or_(m, ops.and_(odd, i == k - 1)) for i, m in enumerate(must))

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        allowed = ops.and_(ops.not_(ops.or_(*preempt)), ops.eq(used % 2, 0))
        return Decision(admit=fcfs_admit(view, ops, fits, kept, allowed=allowed), preempt=preempt)


@dataclass(frozen=True, slots=True)
class Granting:
    """Grants of its own: the oldest active request gets two chunks' worth (clamped to one
    unit by the engine), the others a rotating 0 or 1 by request id; admission by current fit."""

    name: str = "granting"
    description: str = "grants by request id parity"

    def decide(self, view: View, ops: Ops) -> Decision:
        """Current fit; grants that leave some requests idle."""
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        grants = [2 * view.chunk if i == 0 else a.rid % 2 + ops.ite(a.present, 0, 0) for i, a in enumerate(view.active)]
        grants += [ops.max(0, w.s - w.s + 1) for w in view.waiting]
        return Decision(admit=admit, preempt=preempt, grants=tuple(grants))


@dataclass(frozen=True, slots=True)
class Huge:
    """Arithmetic past ±2⁶¹ once a long prompt waits: Python's integers are exact, the tape hands over."""

    name: str = "huge"
    description: str = "admits by comparing a product beyond 64 bits"

    def decide(self, view: View, ops: Ops) -> Decision:
        """FCFS admission while s·2⁵⁸ (which overflows int64 for s ≥ 32) is positive."""
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.and_(ops.le(after, view.M), ops.lt(0, w.s * (1 << 58))), after

        return Decision(admit=fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt))), preempt=preempt)


@dataclass(frozen=True, slots=True)
class Divides:
    """Divides by the progress of the oldest request minus its prompt: zero once it decodes its first token."""

    name: str = "divides"
    description: str = "a division that is by zero in some views"

    def decide(self, view: View, ops: Ops) -> Decision:
        """Current fit, with a division the reference engine reports as the plug-in's fault."""
        preempt, kept = preempt_newest(view, ops)
        extra: IntLike = 0
        if view.active:
            a = view.active[0]
            extra = ops.div(a.s, a.progress - a.s) * 0
        admit = fcfs_admit(
            view, ops, lambda w, acc: (ops.le(acc + held_first(view, w, ops) + extra, view.M), acc), kept,
            allowed=ops.not_(ops.or_(*preempt)),
        )  # fmt: skip
        return Decision(admit=admit, preempt=preempt)


@dataclass(frozen=True, slots=True)
class Overdraws:
    """Its state leaves the declared bounds after a few admissions (the reference refuses)."""

    name: str = "overdraws"
    description: str = "a next state outside its bounds"
    state_vars: tuple[StateVar, ...] = (StateVar("n", 0, 0, 3),)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Current fit, counting admissions without a cap."""
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt)))
        return Decision(admit=admit, preempt=preempt, state=(view.state[0] + ops.count(admit),))


@dataclass(frozen=True, slots=True)
class Negative:
    """Grants −1 to a waiting request whose prompt is odd (the reference refuses)."""

    name: str = "negative"
    description: str = "a negative grant in some views"
    traits: Traits = Traits(clairvoyant=False)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admit nobody; grants 1, or −1 for an odd prompt waiting."""
        grants = tuple(1 for _ in view.active) + tuple(ops.ite(ops.eq(w.s % 2, 1), -1, 1) for w in view.waiting)
        return Decision(
            admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active), grants=grants
        )


@dataclass(frozen=True, slots=True)
class Smooth:
    """A real-valued state: an exponentially smoothed queue length (floats: ``0.9·ewma + 0.1·n``),
    admitting by current fit only while the smoothed queue is below 2.5; the state may be an int
    (its initial 0) or a float, and its bound 30.0 is reached by long queues (the reference refuses)."""

    name: str = "smooth"
    description: str = "current fit gated by a smoothed queue length"
    state_vars: tuple[StateVar, ...] = (StateVar("ewma", 0, 0.0, 30.0, real=True),)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Current fit while the smoothed queue is short; the smoothing in float arithmetic."""
        ewma = view.state[0]
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        calm = ops.or_(ops.lt(ewma, 2.5), ops.eq(view.n_waiting, ewma))  # an int compared with a float
        admit = fcfs_admit(view, ops, fits, kept, allowed=ops.and_(ops.not_(ops.or_(*preempt)), calm))
        nxt = ops.ite(ops.eq(view.n_waiting, 0), ops.min(ewma, 0), 0.9 * ewma + 0.1 * view.n_waiting)
        return Decision(admit=admit, preempt=preempt, state=(nxt,))


RULES: list[Scheduler] = [
    SGLANG,
    Smooth(),
    Outside(load_scheduler("current-fit")),
    Outside(load_scheduler("vllm-v1")),
    Outside(load_scheduler("lookahead")),
    Outside(load_scheduler("current-fit-no-preempt")),
    Bucket(),
    Parity(),
    Granting(),
    Huge(),
    Divides(),
    Overdraws(),
    Negative(),
]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ModelParams, ArrivalPlan, int, int, bool]:
    """Small servers, packed or spread arrivals, windows, budgets, caps, blocks."""
    M = draw(st.integers(8, 120))
    chunk = draw(st.one_of(st.integers(1, min(32, M)), st.just(M)))
    block = draw(st.sampled_from([b for b in (1, 1, 2, 4) if 2 * b <= M]))
    budget = draw(st.none() | st.integers(1, 48))
    seqs = draw(st.none() | st.integers(1, 5))
    params = ModelParams(M=M, chunk=chunk, block=block, token_budget=budget, max_num_seqs=seqs)
    horizon = draw(st.integers(1, 80))
    cap = M // block * block
    packed = draw(st.booleans())  # all at once: preemption storms and window widening
    rows = []
    for _ in range(draw(st.integers(1, 20))):
        s = draw(st.integers(1, max(1, cap - 1)))
        rows.append((0 if packed else draw(st.integers(0, horizon // 2)), s, draw(st.integers(1, max(1, cap - s)))))
    return params, fixed_arrivals(rows), horizon, draw(st.sampled_from([1, 2, 8])), draw(st.booleans())


def _outcome(sched: Scheduler, scenario: tuple[ModelParams, ArrivalPlan, int, int, bool], engine: str) -> object:
    params, plan, horizon, window, drain = scenario
    try:
        out = run(
            sched, params, plan, horizon, drain=drain, window=window, engine=engine,  # type: ignore[arg-type]
            max_slots=2000,
        )  # fmt: skip
    except InvariantViolation as exc:
        return ("violation", exc.slot, exc.requests, str(exc))
    except InvalidScheduler as exc:
        return ("invalid", str(exc))
    except ValueError as exc:  # did not drain within max_slots
        return ("refused", str(exc))
    if engine == "fast" and out.engine == "reference":  # every rule here tapes: only a hand-over may fall back
        assert "handed over" in out.reason, out.reason
    return out.result


def _same(ref: object, fast: object) -> None:
    if isinstance(ref, SimResult):
        assert isinstance(fast, SimResult), fast
        assert ref.slots == fast.slots
        assert (ref.window, ref.window_hid_slots, ref.dropped) == (fast.window, fast.window_hid_slots, fast.dropped)
        for f in FIELDS:
            assert np.array_equal(getattr(ref, f), getattr(fast, f)), f
    else:
        assert fast == ref


@contextmanager
def trace_after(n: int | None) -> Iterator[None]:
    """Tape every shape at once (0), or ask the rule directly for every shape (huge); ``None``: the
    rental policy, which the runs use by default."""
    old = plugin.TRACE_AFTER
    plugin.TRACE_AFTER = n
    plugin._TAPES.clear()
    try:
        yield
    finally:
        plugin.TRACE_AFTER = old


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), k=st.integers(0, len(RULES) - 1), taped=st.sampled_from([0, 10**9, 3]))
def test_plugin_loop_matches_reference(
    scenario: tuple[ModelParams, ArrivalPlan, int, int, bool], k: int, taped: int
) -> None:
    sched = RULES[k]
    ref = _outcome(sched, scenario, "reference")
    with trace_after(taped):
        fast = _outcome(sched, scenario, "fast")
    _same(ref, fast)


def test_stateful_rule_carries_its_state_in_the_loop() -> None:
    params = ModelParams(M=400, chunk=16)
    plan = fixed_arrivals([(t // 3, 10 + t % 7, 5 + t % 11) for t in range(60)])
    out = run(Bucket(), params, plan, 200, engine="fast")
    assert out.engine == "fast-plugin", out.reason
    _same(run(Bucket(), params, plan, 200, engine="reference").result, out.result)
    # the state matters: without the bucket, current fit admits in other slots
    plain = run(Outside(load_scheduler("current-fit")), params, plan, 200, engine="fast").result
    assert out.result is not None and plain is not None
    assert not np.array_equal(out.result.admitted, plain.admitted)


def test_real_state_runs_in_the_loop() -> None:
    """A float state (int at first, float later) in the compiled loop: the reference's outcome,
    and the state matters (without it the rule admits in other slots)."""
    params = ModelParams(M=400, chunk=16)
    plan = fixed_arrivals([(t // 2, 10 + t % 7, 5 + t % 11) for t in range(80)])
    with trace_after(0):
        out = run(Smooth(), params, plan, 300, engine="fast")
    assert out.engine == "fast-plugin", out.reason
    _same(run(Smooth(), params, plan, 300, engine="reference").result, out.result)
    plain = run(Outside(load_scheduler("current-fit")), params, plan, 300, engine="fast").result
    assert out.result is not None and plain is not None
    assert not np.array_equal(out.result.admitted, plain.admitted)


def test_sglang_runs_on_the_plugin_path() -> None:
    """sglang's rule (real-valued state, float reservations, retraction) is taped and run
    by the compiled loop, with the reference's outcome, retractions included."""
    params = ModelParams(M=160, chunk=16)
    plan = fixed_arrivals([(t, 4 + t % 5, 60 + 13 * (t % 3)) for t in range(40)])  # long outputs: a retraction
    for taped in (0, 10**9):
        with trace_after(taped):
            out = run(SGLANG, params, plan, 1500, engine="fast")
        assert out.engine == "fast-plugin", out.reason
        ref = run(SGLANG, params, plan, 1500, engine="reference").result
        assert ref is not None and ref.preemptions.sum() > 0  # the scenario retracts
        _same(ref, out.result)


def test_handing_over_names_itself_and_still_matches() -> None:
    params = ModelParams(M=200, chunk=8)
    plan = fixed_arrivals([(0, 40, 5), (1, 3, 2), (2, 50, 9)])  # s = 40 makes s·2⁵⁸ leave the registers
    with trace_after(0):  # taped from the first slot (a rule asked directly computes with Python's integers)
        fast = run(Huge(), params, plan, 60, engine="fast")
    assert fast.engine == "reference" and "handed over" in fast.reason
    _same(run(Huge(), params, plan, 60, engine="reference").result, fast.result)


def _eval(tr: TapeOps, leaves: list[int | float]) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray]:
    """Run ``tr``'s rows with input register ``i`` holding ``leaves[i]`` (a float in ``F``, tagged)."""
    from kvstab.engine._plugin_kernel import eval_tape

    code = tr.code()
    R = np.zeros(tr.n_regs, dtype=np.int64)
    F = np.zeros(tr.n_regs, dtype=np.float64)
    T = np.zeros(tr.n_regs, dtype=np.int64)
    for i, v in enumerate(leaves):
        if isinstance(v, float):
            F[i], T[i] = v, 1
        else:
            R[i] = v
    ok = eval_tape(code, code.view(np.float64), 0, code.shape[0], R, F, T)
    return ok, R, F, T


def _read(v: object, R: np.ndarray, F: np.ndarray, T: np.ndarray) -> object:
    """A register's value as the Python object it stands for."""
    if not hasattr(v, "reg"):
        return v  # folded by the tracer
    store = STORE[v.kind]  # type: ignore[attr-defined]
    if store == 1 or (store == 2 and T[v.reg]):  # type: ignore[attr-defined]
        return float(F[v.reg])  # type: ignore[attr-defined]
    x = int(R[v.reg])  # type: ignore[attr-defined]
    return bool(x) if v.kind == BOOL else x  # type: ignore[attr-defined]


def _identical(got: object, want: object, kind: str) -> bool:
    """Same value and same Python type (a float bit for bit: -0.0 is not 0.0; NaN is NaN)."""
    if kind == EITHER:  # the tape knows only "bool or int" here
        return not isinstance(got, float) and int(got) == int(want)  # type: ignore[call-overload]
    if type(got) is not type(want):
        return False
    if isinstance(got, float):
        return got.hex() == want.hex() or (math.isnan(got) and math.isnan(want))  # type: ignore[attr-defined]
    return got == want


def test_tape_arithmetic_is_pythons() -> None:
    """Floor division and modulo of negative numbers, min's first-of-equals, bool sums."""
    tr = TapeOps(2)
    a, b = tr.leaf(0, "i", -100, 100), tr.leaf(1, "i", -100, 100)
    exprs = [a // b, a % b, tr.ceil_div(a, b), -a, a * b - a, tr.min(a, b), tr.max(a, b), tr.sum([a < b, a <= b])]
    exprs += [tr.ite(a < b, a, b), tr.and_(a, b), tr.or_(a < 0, b < 0), tr.not_(a), tr.count([a, b, True])]
    for x, y in [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (5, 5), (-1, 100)]:
        ok, R, _, _ = _eval(tr, [x, y])
        assert ok
        want = [x // y, x % y, -(-x // y), -x, x * y - x, min(x, y), max(x, y), (x < y) + (x <= y)]
        want += [x if x < y else y, all((x, y)), any((x < 0, y < 0)), not x, sum(1 for v in (x, y, True) if v)]
        assert [int(R[e.reg]) for e in exprs] == [int(w) for w in want]
    assert not _eval(tr, [3, 0])[0]  # division by zero stops the tape


#: expressions over x, y (each an int or a float, known only at run time), i (an int) and f (a float)
_FLOAT_EXPRS = {
    "x + y": lambda o, x, y, i, f: x + y,
    "x - y": lambda o, x, y, i, f: x - y,
    "x * y": lambda o, x, y, i, f: x * y,
    "x / y": lambda o, x, y, i, f: x / y,
    "x // y": lambda o, x, y, i, f: x // y,
    "x % y": lambda o, x, y, i, f: x % y,
    "f // i": lambda o, x, y, i, f: f // i,
    "f % i": lambda o, x, y, i, f: f % i,
    "i / (i + 1)": lambda o, x, y, i, f: i / (i + 1),
    "-x": lambda o, x, y, i, f: -x,
    "x < y": lambda o, x, y, i, f: o.lt(x, y),
    "x <= y": lambda o, x, y, i, f: o.le(x, y),
    "x == y": lambda o, x, y, i, f: o.eq(x, y),
    "x > f": lambda o, x, y, i, f: x > f,
    "x != i": lambda o, x, y, i, f: x != i,
    "x >= i": lambda o, x, y, i, f: x >= i,
    "min(x, y)": lambda o, x, y, i, f: o.min(x, y),
    "max(x, y, i)": lambda o, x, y, i, f: o.max(x, y, i),
    "min(i, f)": lambda o, x, y, i, f: o.min(i, f),
    "max(1.0, f)": lambda o, x, y, i, f: o.max(1.0, f),
    "ite(x, y, i)": lambda o, x, y, i, f: o.ite(x, y, i),
    "ite(i < 0, f, i)": lambda o, x, y, i, f: o.ite(o.lt(i, 0), f, i),
    "sum(x, i, y, f)": lambda o, x, y, i, f: o.sum([x, i, y, f]),
    "sum(ite(x < y, f, 0), i)": lambda o, x, y, i, f: o.sum([o.ite(o.lt(x, y), f, 0), i]),
    "and(x, f)": lambda o, x, y, i, f: o.and_(x, f),
    "or(y, f)": lambda o, x, y, i, f: o.or_(y, f),
    "not(f)": lambda o, x, y, i, f: o.not_(f),
    "count(x, f, i)": lambda o, x, y, i, f: o.count([x, f, i]),
    "ceil_div(x, y)": lambda o, x, y, i, f: o.ceil_div(x, y),
    "floor(x)": lambda o, x, y, i, f: o.floor(x),
    "floor(f)": lambda o, x, y, i, f: o.floor(f),
    "floor(x - i)": lambda o, x, y, i, f: o.floor(x - i),
    "x * f + y": lambda o, x, y, i, f: x * f + y,
    "(x + i) * 0.5 - f": lambda o, x, y, i, f: (x + i) * 0.5 - f,
}

_ints = st.integers(-(2**53), 2**53)
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 0.1, 0.5, 1.0, 3.0, -2.5, 1e300])
_small = st.integers(-(2**20), 2**20) | st.sampled_from([0, 1, -1, 2, 3])


@settings(max_examples=300, deadline=None)
@given(x=_ints | _floats, y=_ints | _floats, i=_small, f=_floats, name=st.sampled_from(sorted(_FLOAT_EXPRS)))
def test_float_arithmetic_is_pythons(x: int | float, y: int | float, i: int, f: float, name: str) -> None:
    """Every float and mixed operation gives Python's value and type (bit for bit), or stops the
    run exactly where Python raises (a zero divisor) or an int result leaves ±2⁶¹."""
    expr = _FLOAT_EXPRS[name]
    try:
        want: object = expr(CONCRETE, x, y, i, f)
        raised = False
    except (ZeroDivisionError, OverflowError, ValueError):  # math.floor(inf), math.floor(nan)
        want, raised = None, True
    tr = TapeOps(4)
    num = (-(2**53), 2**53)
    leaves = [tr.leaf(0, "n", *num), tr.leaf(1, "n", *num), tr.leaf(2, "i", -(2**20), 2**20), tr.leaf(3, "f", *num)]
    got_v = expr(tr, *leaves)
    ok, R, F, T = _eval(tr, [x, y, i, f])
    if raised or (isinstance(want, int) and abs(want) > LIMIT):
        assert not ok, name  # the reference engine then computes (or raises) it
        return
    assert ok, name
    got = _read(got_v, R, F, T)
    assert _identical(got, want, getattr(got_v, "kind", "")), (name, got, want)


def test_no_fused_multiply_add() -> None:
    """``a * b + c`` rounds twice in Python; an FMA (one rounding) would differ: 0.1·10 − 1."""
    tr = TapeOps(3)
    a, b, c = (tr.leaf(n, "f", -LIMIT, LIMIT) for n in range(3))
    e = a * b + c
    ok, _, F, _ = _eval(tr, [0.1, 10.0, -1.0])
    fused = float(Fraction(0.1) * 10 - 1)  # what one rounding of the exact a·b + c gives
    assert ok and F[e.reg] == 0.1 * 10.0 - 1.0 == 0.0 and fused != 0.0


def test_ints_beyond_two_to_the_53_meeting_floats_stop_the_run() -> None:
    """float64 cannot hold such an int exactly, so a comparison or sum with a float is left to Python."""
    tr = TapeOps(2)
    x, f = tr.leaf(0, "n", -LIMIT, LIMIT), tr.leaf(1, "f", -LIMIT, LIMIT)
    tr.lt(x, f)
    assert _eval(tr, [EXACT, 1.5])[0]
    assert not _eval(tr, [EXACT + 1, 1.5])[0]
    tr2 = TapeOps(2)
    y = tr2.leaf(0, "n", -LIMIT, LIMIT)
    tr2.arith(OP["ADD"], y, tr2.leaf(1, "i", -LIMIT, LIMIT))  # int + int stays exact, whatever its size
    ok, R, _, T = _eval(tr2, [EXACT + 1, 1])
    assert ok and R[tr2.n_regs - 1] == EXACT + 2 and T[tr2.n_regs - 1] == 0


def test_checked_operations_where_bounds_could_overflow() -> None:
    tr = TapeOps(1)
    s = tr.leaf(0, "i", 1, 2**40)
    big = s * s  # 2^80 possible: a checked product
    small = s + 1
    rows = tr.code()
    ops_used = {int(r[0]) for r in rows}
    assert OP["MULC"] in ops_used and OP["ADD"] in ops_used and big.hi == LIMIT and small.hi == 2**40 + 1


def test_untapeable_decisions_are_refused() -> None:
    @dataclass(frozen=True, slots=True)
    class IntAdmit:
        name: str = "int-admit"
        description: str = "admits with an int, not a bool"

        def decide(self, view: View, ops: Ops) -> Decision:
            return Decision(admit=tuple(w.s - w.s for w in view.waiting), preempt=tuple(False for _ in view.active))

    with pytest.raises(Untraceable, match="not surely bool"):
        trace_tape(IntAdmit(), ModelParams(M=64, chunk=8), 1, 1)
    with pytest.raises(Untraceable, match="str"):
        TapeOps(0).val("0.5")

    @dataclass(frozen=True, slots=True)
    class FloatGrant:
        name: str = "float-grant"
        description: str = "a grant that may be a float"

        def decide(self, view: View, ops: Ops) -> Decision:
            grants = tuple(ops.ite(ops.lt(a.progress, 3), 1, 0.5) for a in view.active) + tuple(1 for _ in view.waiting)
            return Decision(
                admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active), grants=grants
            )

    with pytest.raises(Untraceable, match="not surely int"):
        trace_tape(FloatGrant(), ModelParams(M=64, chunk=8), 1, 1)


def test_guarded_rows_are_skipped_exactly() -> None:
    """Rows whose value matters only when a condition holds sit behind a ``JZ``: with the
    condition false the outputs are still Python's, and far fewer rows run (sglang's O(K²)
    retraction order matters only in a retracting step)."""
    from kvstab.engine._guards import with_guards

    tr = TapeOps(3)
    a, b, c = (tr.leaf(n, "i", -100, 100) for n in range(3))
    g = tr.lt(a, b)
    heavy = tr.sum(tr.ite(tr.lt(x * y, c), 1, 0) for x in (a, b, c) for y in (a, b, c))
    out = tr.and_(g, tr.lt(heavy, 5))
    plain = tr.code()
    code = with_guards(plain, 3, np.array([out.reg]))
    jz = [r for r in code if r[0] == OP["JZ"]]
    assert len(jz) == 1 and jz[0][2] == g.reg and jz[0][3] > 10
    from kvstab.engine._plugin_kernel import eval_tape

    for x, y, z in [(1, 2, 3), (2, 1, 3), (-5, 7, 0), (7, -5, 100)]:
        R = np.zeros(tr.n_regs, dtype=np.int64)
        R[:3] = x, y, z
        F, T = np.zeros(tr.n_regs), np.zeros(tr.n_regs, dtype=np.int64)
        assert eval_tape(code, code.view(np.float64), 0, code.shape[0], R, F, T)
        want = x < y and sum(1 for p in (x, y, z) for q in (x, y, z) if p * q < z) < 5
        assert bool(R[out.reg]) == want
    # a division is never skipped: Python raises on a zero divisor whether or not its value matters
    tr2 = TapeOps(2)
    p, q = tr2.leaf(0, "i", -100, 100), tr2.leaf(1, "i", -100, 100)
    o2 = tr2.and_(tr2.lt(p, 0), tr2.lt(p // q, 3))
    code2 = with_guards(tr2.code(), 2, np.array([o2.reg]))
    R = np.array([5, 0] + [0] * (tr2.n_regs - 2), dtype=np.int64)  # the guard p < 0 is false, q = 0
    F, T = np.zeros(tr2.n_regs), np.zeros(tr2.n_regs, dtype=np.int64)
    assert not eval_tape(code2, code2.view(np.float64), 0, code2.shape[0], R, F, T)
    # sglang: the retraction order (O(K²) rows, needed only in a retracting step) sits behind JZ rows
    sg = trace_tape(load_scheduler("sglang"), ModelParams(M=4096, chunk=256), 24, 1)
    guarded = sum(int(r[3]) for r in sg.code if r[0] == OP["JZ"])
    assert guarded > 0.8 * sg.code.shape[0]


def test_ask_rows_leave_the_slot_to_the_rule() -> None:
    """With every guarded run left to the rule (``ASK``, the kernel then asks the rule for the slot) or
    all kept behind ``JZ`` (the default), sglang's runs agree with the reference engine, retractions
    included."""
    from kvstab.engine import _guards

    params = ModelParams(M=160, chunk=16)
    plan = fixed_arrivals([(t, 4 + t % 5, 60 + 13 * (t % 3)) for t in range(40)])
    ref = run(SGLANG, params, plan, 1500, engine="reference").result
    assert ref is not None and ref.preemptions.sum() > 0
    old = _guards.ASK_MIN
    try:
        for ask_min in (1, 10**9):
            _guards.ASK_MIN = ask_min
            with trace_after(0):
                out = run(SGLANG, params, plan, 1500, engine="fast")
            assert out.engine == "fast-plugin", out.reason
            _same(ref, out.result)
    finally:
        _guards.ASK_MIN = old


# --- the bank, the rental policy, eviction, the tracer's identities (2026-12 rewrite of the cold path)


@dataclass(frozen=True, slots=True)
class ShapeBound:
    """Branches in Python on the view's *shape* (allowed: a shape is taped on its own): preempts
    the newest request whenever exactly three run, and admits the head only while the window
    shows an odd number of entries — a rule whose tape for one shape says nothing of another."""

    name: str = "shape-bound"
    description: str = "decisions that depend on len(view.active) and len(view.waiting)"

    def decide(self, view: View, ops: Ops) -> Decision:
        """Current fit, plus a preemption at K = 3 and admission only for an odd Q."""
        must, kept = preempt_newest(view, ops)
        k = len(view.active)
        preempt = tuple(ops.or_(m, k == 3 and i == k - 1) for i, m in enumerate(must))

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        allowed = ops.and_(ops.not_(ops.or_(*preempt)), len(view.waiting) % 2 == 1)
        return Decision(admit=fcfs_admit(view, ops, fits, kept, allowed=allowed), preempt=preempt)


@contextmanager
def bank_budget(nbytes: int) -> Iterator[None]:
    """Hold the tapes to ``nbytes`` (a few rows: eviction in most runs), then restore."""
    old = plugin.TAPE_BYTES
    plugin.TAPE_BYTES = nbytes
    try:
        yield
    finally:
        plugin.TAPE_BYTES = old


#: rules with small tapes (sglang's O(K²) tapes would make a budget of a few rows re-tape every slot); Parity is
#: not monotone in progress
SHARED_RULES: list[Scheduler] = [
    ShapeBound(),
    Outside(load_scheduler("current-fit")),
    Bucket(),
    Smooth(),
    Granting(),
    Parity(),
]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=scenarios(),
    second=scenarios(),
    k=st.integers(0, len(SHARED_RULES) - 1),
    policy=st.sampled_from([None, 0, 2]),
    budget=st.sampled_from([1 << 30, 4096]),
)
def test_tapes_shared_by_runs_and_evicted_match_reference(
    first: tuple[ModelParams, ArrivalPlan, int, int, bool],
    second: tuple[ModelParams, ArrivalPlan, int, int, bool],
    k: int,
    policy: int | None,
    budget: int,
) -> None:
    """Two runs on one bank (the second on the first's server, so it reuses and extends its
    tapes), under the rental policy or a count, with a tape budget of a few tapes (evicting in
    most runs): each run is the reference's."""
    sched = SHARED_RULES[k]
    second = (first[0],) + second[1:]  # type: ignore[assignment]
    with trace_after(policy), bank_budget(budget):
        for scenario in (first, second):
            _same(_outcome(sched, scenario, "reference"), _outcome(sched, scenario, "fast"))


def test_eviction_keeps_the_bank_within_its_budget() -> None:
    """Under a budget far below the tapes a run meets, the least recently used go, the bank stays
    within it (and taping goes on), and the outcome is the reference's."""
    params = ModelParams(M=400, chunk=16)
    plan = fixed_arrivals([(t // 2, 10 + t % 7, 5 + t % 11) for t in range(120)])
    sched = Outside(load_scheduler("current-fit"))
    with trace_after(0), bank_budget(64 * 1024):
        out = run(sched, params, plan, 300, engine="fast")
        bank = plugin._bank(sched, params)
        assert bank.evicted > 0 and bank.nbytes <= 64 * 1024
    assert out.engine == "fast-plugin", out.reason
    _same(run(sched, params, plan, 300, engine="reference").result, out.result)


def test_rental_tapes_recurring_shapes_and_classes() -> None:
    """Ski rental on injected costs: a shape is taped once its asks cost what its tape is expected
    to; a class of shapes (one Q) that mostly came to be taped is taped at first sight, but one
    new shape in EAGER_SAMPLE is still rented."""
    rental = plugin._Rental()
    with trace_after(None):
        for _ in range(plugin.FIRST_TRACE_AFTER):  # no tape yet: a count
            assert not rental.tape_now((5, 8))
        assert rental.tape_now((5, 8))
        rental.taped((5, 8), 14, 0.014)  # 1 ms per entry
        assert rental.expected(30) == pytest.approx(0.014 / 30 * 46)  # one tape: a fixed part worth 16 entries
        rental.taped((9, 8), 18, 0.018)
        assert rental.expected(100) == pytest.approx(0.1)  # a line through both
        for K in range(20, 20 + plugin.EAGER_AFTER):  # a class rented shape by shape
            assert not rental.tape_now((K, 4))
            rental.asked((K, 4), rental.expected(K + 5) or 0.0)
            assert rental.tape_now((K, 4))
            rental.taped((K, 4), K + 5, 0.001)
        firsts = [rental.tape_now((K, 4)) for K in range(40, 40 + 2 * plugin.EAGER_SAMPLE)]
        assert firsts.count(False) == 2 and firsts.count(True) == 2 * plugin.EAGER_SAMPLE - 2
        assert not rental.tape_now((60, 3))  # another class is rented


def test_tracer_identities_are_pythons() -> None:
    """``x + 0``, ``x * 1``, ``x // 1``, ``and_(True, b)``, ``ite(c, x, x)``, a count with plain
    entries: no row where Python's value is an operand's (as an int: ``True + 0`` is 1), and the
    value and type of every expression are Python's."""
    tr = TapeOps(3)
    x, b, c = tr.leaf(0, "i", -50, 50), tr.leaf(1, BOOL, 0, 1), tr.leaf(2, BOOL, 0, 1)
    rows = tr.code().shape[0]
    same = [x + 0, 0 + x, x - 0, x * 1, 1 * x, x // 1, b + 0, 1 * b, tr.and_(True, b), tr.ite(c, x, x), tr.sum([x])]
    assert tr.code().shape[0] == rows and all(v.reg in (x.reg, b.reg) for v in same)
    assert tr.and_(False, b) is False and tr.or_(True, b) is True
    exprs = {
        "x + 0": (x + 0, lambda x, b, c: x + 0),
        "b + 0": (b + 0, lambda x, b, c: b + 0),
        "1 * b": (1 * b, lambda x, b, c: 1 * b),
        "b // 1": (b // 1, lambda x, b, c: b // 1),
        "and(True, b)": (tr.and_(True, b), lambda x, b, c: all((True, b))),
        "and(b, c)": (tr.and_(b, c), lambda x, b, c: all((b, c))),
        "and(x)": (tr.and_(x), lambda x, b, c: all((x,))),
        "count": (tr.count([True, b, False, x, True]), lambda x, b, c: sum(1 for v in (True, b, False, x, True) if v)),
        "sum": (tr.sum([True, x, 2, b]), lambda x, b, c: sum((True, x, 2, b))),
        "x % 1": (x % 1, lambda x, b, c: x % 1),
    }
    for xv, bv, cv in [(7, True, False), (-3, False, True), (0, True, True), (0, False, False)]:
        ok, R, F, T = _eval(tr, [xv, int(bv), int(cv)])
        assert ok
        for name, (v, f) in exprs.items():
            want = f(xv, bv, cv)
            got = _read(v, R, F, T)
            assert _identical(got, want, getattr(v, "kind", "")), (name, got, want)


def test_fast_entries_are_the_dataclass_entries() -> None:
    """The plug-in path builds view entries by setting their slots: equal to (and of the type of)
    what the dataclass's constructor builds, defaults included."""
    from kvstab.contract import ActiveEntry
    from kvstab.engine.tape import active_entry, waiting_entry

    a, b = active_entry(3, 10, 4, 7), ActiveEntry(3, 10, 4, 7)
    assert type(a) is ActiveEntry and a == b and hash(a) == hash(b) and (a.present, a.prior) == (True, 0)
    w, v = waiting_entry(5, 9, 2), WaitingEntry(5, 9, 2)
    assert type(w) is WaitingEntry and w == v and hash(w) == hash(v)


def test_ask_rows_for_a_dominant_guard_and_taped_again_when_they_fire_often() -> None:
    """A guard covering most of a tape leaves its rows to the rule (``ASK``): kept so for sglang's
    ``retracting``, true in one slot; with every guarded run left to the rule (``ASK_MIN = 1``:
    the prefill walk's guards too, true in most slots) the shapes are taped again with their rows.
    Both runs are the reference's."""
    from kvstab.engine import _guards

    params = ModelParams(M=500, chunk=16)
    plan = fixed_arrivals([(t // 2, 4 + t % 5, 80 + 13 * (t % 3)) for t in range(60)])  # retracts at K = 6
    ref = run(SGLANG, params, plan, 800, engine="reference").result
    assert ref is not None and ref.preemptions.sum() > 0
    old = _guards.ASK_ROWS, _guards.ASK_SHARE, _guards.ASK_MIN
    try:
        # small servers: the retraction order is a fifth of a tape here (most of it at paper scale)
        for rows, share, run_min, often in ((8, 0.2, 1 << 62, False), (1 << 62, 1.0, 1, True)):
            _guards.ASK_ROWS, _guards.ASK_SHARE, _guards.ASK_MIN = rows, share, run_min
            with trace_after(0):
                out = run(SGLANG, params, plan, 800, engine="fast")
                bank = plugin._bank(SGLANG, params)
            assert out.engine == "fast-plugin", out.reason
            asked = int(bank.tcount[1 : 2 * bank.count : 2].sum())
            assert (asked > 0 or often) and bool(bank.no_ask) == often, (asked, bank.no_ask)
            _same(ref, out.result)
    finally:
        _guards.ASK_ROWS, _guards.ASK_SHARE, _guards.ASK_MIN = old


def test_runs_in_threads_keep_their_own_tapes() -> None:
    """Runs of one rule on one server in several threads at once (a thread pool of a sweep): each
    thread has its own bank, each run is the reference's."""
    from concurrent.futures import ThreadPoolExecutor

    params = ModelParams(M=300, chunk=16)
    sched = Outside(load_scheduler("current-fit"))
    plans = [fixed_arrivals([(t // (2 + k), 5 + (t * k) % 9, 4 + t % (7 + k)) for t in range(90)]) for k in range(4)]
    with trace_after(None), bank_budget(32 * 1024), ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda plan: run(sched, params, plan, 250, engine="fast"), plans))
    for plan, out in zip(plans, outs):
        assert out.engine == "fast-plugin", out.reason
        _same(run(sched, params, plan, 250, engine="reference").result, out.result)
