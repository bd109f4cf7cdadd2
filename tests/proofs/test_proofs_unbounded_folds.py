"""The prefix-fold class: the contract's folds, the run on a view of unknown length, purity,
and the projection theorem's argument checked on concrete states."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstab.contract import (
    ActiveEntry,
    Decision,
    View,
    WaitingEntry,
    any_of,
    count_of,
    fcfs_admit,
    held_first,
    no_preemption,
    preempt_newest,
    scan,
    sum_of,
    zipped,
)
from kvstab.model import progress_after, tokens_held
from kvstab.ops import CONCRETE, Ops
from kvstab.proofs.encoding import Setting
from kvstab.proofs.folds import NotAFold, impurity, run_abstract
from kvstab.proofs.unbounded import classify
from kvstab.registry import load_scheduler
from kvstab.schedulers.lookahead import Lookahead, Projection

ints = st.lists(st.integers(-50, 50), max_size=8)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(ints, st.integers(-5, 5))
def test_scan_is_the_loop_it_stands_for(xs: list[int], init: int) -> None:
    outs, final = scan(xs, lambda x, acc: (acc + x > 3, acc + x), init)
    acc, want = init, []
    for x in xs:
        acc += x
        want.append(acc > 3)
    assert outs == tuple(want) and final == acc
    (flags, doubled), _ = scan(xs, lambda x, acc: ((x > 0, 2 * x), acc), None, width=2)
    assert flags == tuple(x > 0 for x in xs) and doubled == tuple(2 * x for x in xs)
    assert sum_of(xs, abs, CONCRETE) == sum(abs(x) for x in xs)
    assert count_of(xs, lambda x: x % 2 == 0, CONCRETE) == sum(1 for x in xs if x % 2 == 0)
    assert any_of(tuple(x > 40 for x in xs), CONCRETE) == any(x > 40 for x in xs)
    assert zipped(xs, outs) == tuple(zip(xs, outs))


def test_an_empty_list_folds_to_its_start_with_every_output_component() -> None:
    assert scan((), lambda x, acc: ((x, x), acc), 7, width=2) == (((), ()), 7)
    assert no_preemption(View(active=(), waiting=(), M=5, chunk=2)) == ()


def _view(active: tuple[tuple[int, int, int], ...], waiting: tuple[tuple[int, int], ...], M: int, chunk: int) -> View:
    return View(
        active=tuple(ActiveEntry(i, s, o, p) for i, (s, o, p) in enumerate(active)),
        waiting=tuple(WaitingEntry(len(active) + j, s, o) for j, (s, o) in enumerate(waiting)),
        M=M,
        chunk=chunk,
        n_waiting=len(waiting),
    )


@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("measures", lambda v, ops: len(v.active)),
        ("iterates", lambda v, ops: ops.sum(a.s for a in v.active)),
        ("indexes", lambda v, ops: v.waiting[0]),
        ("tests the truth of", lambda v, ops: ops.ite(bool(v.waiting), 1, 0)),
    ],
)
def test_the_view_of_unknown_length_refuses_everything_but_the_folds(how: str, code) -> None:  # type: ignore[no-untyped-def]
    @dataclass(frozen=True)
    class Peeks:
        name: str = "peeks"
        description: str = "reads the view's length"

        def decide(self, view: View, ops: Ops) -> Decision:
            code(view, ops)
            return Decision(admit=(), preempt=())

    with pytest.raises(NotAFold, match=f"test_proofs_unbounded_folds.py:.*{how} view"):
        run_abstract(Peeks(), Setting())


def test_a_rule_that_swallows_the_refusal_is_still_outside() -> None:
    @dataclass(frozen=True)
    class Swallows:
        name: str = "swallows"
        description: str = "catches the refusal and carries on"

        def decide(self, view: View, ops: Ops) -> Decision:
            try:
                len(view.active)
            except Exception:  # noqa: BLE001 - the point of the test
                pass
            preempt, kept = preempt_newest(view, ops)
            admit = fcfs_admit(view, ops, lambda w, acc: (ops.le(acc + held_first(view, w, ops), view.M), acc), kept)
            return Decision(admit=admit, preempt=preempt)

    check = classify(Swallows(), Setting())
    assert not check.member and "measures view.active" in check.reason


_SEEN: list[int] = []


@dataclass(frozen=True)
class _Counts:
    """current-fit whose preemption step counts its calls (four ways to keep state between calls)."""

    name: str = "counts"
    description: str = "preempts from the fifth entry on"
    how: str = "list"

    def decide(self, view: View, ops: Ops) -> Decision:
        calls = [0]
        n = 0

        def in_a_list(a: ActiveEntry, acc: int) -> tuple[bool, int]:
            calls[0] += 1
            return calls[0] > 4, acc

        def in_a_global(a: ActiveEntry, acc: int) -> tuple[bool, int]:
            _SEEN.append(1)
            return len(_SEEN) > 4, acc

        def in_a_nonlocal(a: ActiveEntry, acc: int) -> tuple[bool, int]:
            nonlocal n
            n += 1
            return n > 4, acc

        step = {"list": in_a_list, "global": in_a_global, "nonlocal": in_a_nonlocal}[self.how]
        preempt, _ = scan(view.active, step, 0)
        admit = fcfs_admit(view, ops, lambda w, acc: (ops.le(acc + held_first(view, w, ops), view.M), acc), 0)
        return Decision(admit=admit, preempt=preempt)


@pytest.mark.parametrize(
    ("how", "why"),
    [("list", "captures 'calls', a mutable list"), ("global", "reads the global '_SEEN', a mutable list"),
     ("nonlocal", "assigns 'n' of an enclosing function")],
)
def test_a_step_that_keeps_state_between_calls_is_outside(how: str, why: str) -> None:
    check = classify(_Counts(how=how), Setting())
    assert not check.member and "may not be a pure function" in check.reason and why in check.reason


def test_the_built_ins_steps_are_pure() -> None:
    prog = run_abstract(load_scheduler("vllm-v1"), Setting(token_budget=64, max_num_seqs=4))
    assert all(f.where for f in prog.folds)
    from kvstab.schedulers.vllm_v1 import VllmV1

    assert impurity(VllmV1().decide) is None


def test_current_fit_is_four_folds_with_its_own_names() -> None:
    prog = run_abstract(load_scheduler("current-fit"), Setting())
    kinds = [(f.base, f.where.split(" ")[0]) for f in prog.folds]
    assert kinds == [
        ("active", "preempt_newest.<locals>.step"),
        ("active", "any_of.<locals>.<lambda>"),
        ("active", "count_of.<locals>.<lambda>"),
        ("waiting", "_fcfs.<locals>.step"),
    ]
    assert prog.folds[0].names == ("prefix", "kept")
    assert prog.folds[3].names == ("acc", "blocked", "running")


def test_a_scan_inside_a_step_is_outside() -> None:
    @dataclass(frozen=True)
    class Nested:
        name: str = "nested"
        description: str = "sums the active list once per queued request"

        def decide(self, view: View, ops: Ops) -> Decision:
            def fits(w: WaitingEntry, acc: int) -> tuple[object, int]:
                return ops.le(sum_of(view.active, lambda a: a.progress, ops), view.M), acc

            return Decision(admit=fcfs_admit(view, ops, fits, 0), preempt=no_preemption(view))

    check = classify(Nested(), Setting())
    assert not check.member and "a scan inside another scan's step" in check.reason


# --- the projection theorem's argument, on concrete states


def _projections(view: View, reqs: list[tuple[int, int, int]]) -> list[Projection]:
    return [Projection.of(view, s, o, p, True, CONCRETE) for s, o, p in reqs]


def _total(view: View, ps: list[Projection], tau: int) -> int:
    return sum(int(q.held_at(view, tau, CONCRETE)) for q in ps)


@st.composite
def projected_states(draw: st.DrawFn) -> tuple[View, list[tuple[int, int, int]]]:
    chunk = draw(st.integers(1, 4))
    M = draw(st.integers(4, 40))
    lengths = st.tuples(st.integers(1, 8), st.integers(1, 6)).filter(lambda r: r[0] + r[1] <= M)
    active = []
    for s, o in draw(st.lists(lengths, max_size=4)):
        # a reachable progress: whole chunks of the prompt, then decoded tokens
        steps = [min(s, k * chunk) for k in range(1, -(-s // chunk) + 1)] + list(range(s + 1, s + o))
        active.append((s, o, draw(st.sampled_from(steps))))
    waiting = draw(st.lists(lengths, max_size=4))
    return _view(tuple(active), tuple(waiting), M, chunk), active


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(projected_states())
def test_lookahead_keeps_the_projected_invariant_and_charges_at_most_M(case) -> None:  # type: ignore[no-untyped-def]
    """From any state with Σ_active P(τ) ≤ M at every τ (INV), lookahead's slot charges at most M
    and the next state has INV again — the projection theorem, checked by brute force over τ."""
    view, active = case
    ps = _projections(view, active)
    horizon = 2 + max([int(q.f) for q in ps] + [sum(w.s + w.o for w in view.waiting)])
    if any(_total(view, ps, tau) > view.M for tau in range(1, horizon)):
        return  # INV does not hold: not a state the theorem speaks about
    d = Lookahead().decide(view, CONCRETE)
    admitted = [(w.s, w.o, 0) for w, take in zip(view.waiting, d.admit) if take]
    everyone = active + admitted
    charge = sum(int(tokens_held(progress_after(s, p, view.chunk))) for s, o, p in everyone)
    assert charge <= view.M
    after = [(s, o, int(progress_after(s, p, view.chunk))) for s, o, p in everyone]
    staying = [(s, o, p) for s, o, p in after if p < s + o]
    nxt = _projections(view, staying)
    assert all(_total(view, nxt, tau) <= view.M for tau in range(1, horizon))
