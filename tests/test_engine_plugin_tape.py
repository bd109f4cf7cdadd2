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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
from kvstab.engine.tape import LIMIT, OP, TapeOps, Untraceable, trace_tape
from kvstab.errors import InvalidScheduler, InvariantViolation
from kvstab.model import ModelParams
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.registry import load_scheduler
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


RULES: list[Scheduler] = [
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
    if engine == "fast" and out.engine == "reference":
        assert "handed over" in out.reason or "cannot be traced" in out.reason, out.reason
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
def trace_after(n: int) -> Iterator[None]:
    """Tape every shape at once (0), or ask the rule directly for every shape (huge)."""
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


def test_real_state_falls_back_to_the_reference_engine() -> None:
    @dataclass(frozen=True, slots=True)
    class Ratio:
        name: str = "ratio"
        description: str = "a real-valued state"
        state_vars: tuple[StateVar, ...] = (StateVar("r", 0.5, 0.0, 1.0, real=True),)

        def decide(self, view: View, ops: Ops) -> Decision:
            return Decision(admit=tuple(True for _ in view.waiting), preempt=tuple(False for _ in view.active))

    params = ModelParams(M=400, chunk=16)
    plan = fixed_arrivals([(0, 10, 5)])
    out = run(Ratio(), params, plan, 30_000, engine="auto")
    assert out.engine == "reference" and "cannot be traced" in out.reason and "real" in out.reason


def test_handing_over_names_itself_and_still_matches() -> None:
    params = ModelParams(M=200, chunk=8)
    plan = fixed_arrivals([(0, 40, 5), (1, 3, 2), (2, 50, 9)])  # s = 40 makes s·2⁵⁸ leave the registers
    with trace_after(0):  # taped from the first slot (a rule asked directly computes with Python's integers)
        fast = run(Huge(), params, plan, 60, engine="fast")
    assert fast.engine == "reference" and "handed over" in fast.reason
    _same(run(Huge(), params, plan, 60, engine="reference").result, fast.result)


def test_tape_arithmetic_is_pythons() -> None:
    """Floor division and modulo of negative numbers, min's first-of-equals, bool sums."""
    from kvstab.engine._plugin_kernel import eval_tape

    tr = TapeOps(2)
    a, b = tr.leaf(0, "i", -100, 100), tr.leaf(1, "i", -100, 100)
    exprs = [a // b, a % b, tr.ceil_div(a, b), -a, a * b - a, tr.min(a, b), tr.max(a, b), tr.sum([a < b, a <= b])]
    exprs += [tr.ite(a < b, a, b), tr.and_(a, b), tr.or_(a < 0, b < 0), tr.not_(a), tr.count([a, b, True])]
    code = np.array(tr.flat, dtype=np.int64).reshape(-1, 5)
    for x, y in [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 3), (5, 5), (-1, 100)]:
        R = np.zeros(tr.n_regs, dtype=np.int64)
        R[0], R[1] = x, y
        assert eval_tape(code, 0, code.shape[0], R)
        want = [x // y, x % y, -(-x // y), -x, x * y - x, min(x, y), max(x, y), (x < y) + (x <= y)]
        want += [x if x < y else y, all((x, y)), any((x < 0, y < 0)), not x, sum(1 for v in (x, y, True) if v)]
        assert [int(R[e.reg]) for e in exprs] == [int(w) for w in want]
    R = np.zeros(tr.n_regs, dtype=np.int64)
    R[0], R[1] = 3, 0
    assert not eval_tape(code, 0, code.shape[0], R)  # division by zero stops the tape


def test_checked_operations_where_bounds_could_overflow() -> None:
    tr = TapeOps(1)
    s = tr.leaf(0, "i", 1, 2**40)
    big = s * s  # 2^80 possible: a checked product
    small = s + 1
    rows = np.array(tr.flat, dtype=np.int64).reshape(-1, 5)
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
    with pytest.raises(Untraceable, match="float"):
        TapeOps(0).val(0.5)
