"""The projection walk compiled to one native row (``PROJ``) against the unrolled rows and the rule.

:func:`kvstab.contract.fcfs_admit_projected` over lookahead's projection is taped as a block of
``PJV`` rows, one ``PROJ`` row and a ``PJO`` row per admit flag (``kvstab.engine.tape``,
``_TapeQueue``).  Here the same rule is taped both ways on random views and evaluated on random
values: the native walk, the unrolled rows (``native_walk=False``) and the rule itself under
``CONCRETE`` must give the same admit flags — also with a cap on running requests, blocks, a
headroom that makes ``M`` a register, absent candidates and the hint left by earlier slots.
The differential run of the whole loop against the reference engine is
``tests/test_engine_plugin_tape.py`` (``Outside(lookahead)``) and the plug-in below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import (
    ActiveEntry,
    Decision,
    Traits,
    View,
    WaitingEntry,
    count_of,
    fcfs_admit_projected,
    no_preemption,
)
from kvstab.engine import plugin, run
from kvstab.engine._plugin_kernel import eval_tape
from kvstab.engine.tape import OP, Tape, trace_tape
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE, BoolLike, IntLike, Ops
from kvstab.registry import load_scheduler
from kvstab.schedulers.lookahead import Projection


@dataclass(frozen=True, slots=True)
class Headroom:
    """Lookahead against ``M − M/8`` while anything runs (``M`` on an empty server): the walk's
    ``M`` is then a register of the tape, not a constant."""

    name: str = "headroom"
    description: str = "lookahead with M/8 kept free while anything runs"
    traits: Traits = Traits(fcfs=True, work_conserving=False, clairvoyant=True, preempts=False)

    def decide(self, view: View, ops: Ops) -> Decision:
        running = count_of(view.active, lambda a: a.present, ops)
        tight = dataclasses.replace(view, M=ops.ite(ops.le(running, 0), view.M, view.M - view.M // 8))

        def project(s: IntLike, o: IntLike, p: IntLike, present: BoolLike) -> Projection:
            return Projection.of(tight, s, o, p, present, ops)

        return Decision(admit=fcfs_admit_projected(tight, ops, project), preempt=no_preemption(view))


@dataclass(frozen=True, slots=True)
class Outside:
    """lookahead behind a class the engine does not know (so it runs on the plug-in path)."""

    name: str = "outside-lookahead"
    description: str = "lookahead as a plug-in"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=True, preempts=False)

    def decide(self, view: View, ops: Ops) -> Decision:
        return load_scheduler("lookahead").decide(view, ops)


def _evaluate(tape: Tape, act: list[tuple[int, int, int]], wait: list[tuple[int, int]], R: np.ndarray) -> list[bool]:
    K, Q = len(act), len(wait)
    for k, (s, o, p) in enumerate(act):
        R[4 * k : 4 * k + 4] = (k, s, o, p)
    for j, (s, o) in enumerate(wait):
        R[4 * K + 3 * j : 4 * K + 3 * j + 3] = (K + j, s, o)
    R[4 * K + 3 * Q] = Q
    F, T = np.zeros(R.shape[0]), np.zeros(R.shape[0], dtype=np.int64)
    assert eval_tape(tape.code, tape.code.view(np.float64), 0, tape.code.shape[0], R, F, T) == 1
    return [bool(R[r]) for r in tape.outputs[:Q]]


def _concrete(rule: object, params: ModelParams, act: list[tuple[int, int, int]], wait: list[tuple[int, int]]) -> list[bool]:
    view = View(
        active=tuple(ActiveEntry(k, s, o, p) for k, (s, o, p) in enumerate(act)),
        waiting=tuple(WaitingEntry(len(act) + j, s, o) for j, (s, o) in enumerate(wait)),
        M=params.M, chunk=params.chunk, block=params.block, token_budget=params.token_budget,
        max_num_seqs=params.max_num_seqs, n_waiting=len(wait),
    )  # fmt: skip
    return [bool(x) for x in rule.decide(view, CONCRETE).admit]  # type: ignore[attr-defined]


@st.composite
def views(draw: st.DrawFn) -> tuple[ModelParams, list[tuple[int, int, int]], list[list[tuple[int, int]]]]:
    """A server, the active requests, and several queues to evaluate one after another (the hint
    that one slot leaves must not change the next slot's flags)."""
    M = draw(st.integers(16, 3000))
    params = ModelParams(
        M=M, chunk=draw(st.integers(1, 64)), block=draw(st.sampled_from([1, 2, 4, 16])),
        max_num_seqs=draw(st.none() | st.integers(1, 12)),
    )  # fmt: skip
    req = st.tuples(st.integers(1, M // 3 + 1), st.integers(1, M // 3 + 1))
    act = [(s, o, draw(st.integers(0, s + o - 1))) for s, o in draw(st.lists(req, max_size=10))]
    queues = draw(st.lists(st.lists(req, min_size=1, max_size=6), min_size=1, max_size=4))
    return params, act, queues


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=views(), rule=st.sampled_from([Headroom(), Outside()]))
def test_native_walk_is_the_unrolled_walk_and_the_rule(
    case: tuple[ModelParams, list[tuple[int, int, int]], list[list[tuple[int, int]]]], rule: object
) -> None:
    params, act, queues = case
    for wait in queues:
        native = trace_tape(rule, params, len(act), len(wait))  # type: ignore[arg-type]
        unrolled = trace_tape(rule, params, len(act), len(wait), native_walk=False)  # type: ignore[arg-type]
        assert (native.code[:, 0] == OP["PROJ"]).sum() == 1
        assert (unrolled.code[:, 0] == OP["PROJ"]).sum() == 0
        want = _concrete(rule, params, act, wait)
        R = np.zeros(max(native.n_regs, unrolled.n_regs), dtype=np.int64)
        assert _evaluate(native, act, wait, R) == want
        assert _evaluate(unrolled, act, wait, np.zeros_like(R)) == want
        # again with the hint the first evaluation left, on a shifted copy of the state
        later = [(s, o, min(p + 1, s + o - 1)) for s, o, p in act]
        assert _evaluate(native, later, wait, R) == _concrete(rule, params, later, wait)


def test_the_walk_tape_is_linear_in_the_view() -> None:
    """At ``K = 100`` the unrolled walk is ~10⁵ rows; the native one a few per entry."""
    params = ModelParams(M=131_000, chunk=512, block=16)
    native = trace_tape(Headroom(), params, 100, 8)
    unrolled = trace_tape(Headroom(), params, 100, 8, native_walk=False)
    assert native.code.shape[0] < 20 * 108 < 100_000 < unrolled.code.shape[0]


def test_plugin_runs_with_the_native_walk_match_the_reference() -> None:
    """A saturated run of the headroom rule on the plug-in path (every shape taped at once) is the
    reference engine's, array for array."""
    params = ModelParams(M=600, chunk=16, block=4, max_num_seqs=9)
    rng = np.random.default_rng(3)
    rows = [(int(t), int(s), int(o)) for t, s, o in zip(np.sort(rng.integers(0, 300, 160)),
                                                       rng.integers(1, 120, 160), rng.integers(1, 80, 160))]
    plan = fixed_arrivals(rows)
    old = plugin.TRACE_AFTER
    plugin.TRACE_AFTER = 0
    plugin._TAPES.clear()
    try:
        fast = run(Headroom(), params, plan, 400, engine="fast")
    finally:
        plugin.TRACE_AFTER = old
    ref = run(Headroom(), params, plan, 400, engine="reference")
    assert fast.engine != "reference"
    assert fast.result is not None and ref.result is not None
    for f in ("admitted", "completed", "running", "memory", "queue", "first_admit", "finish"):
        assert np.array_equal(getattr(fast.result, f), getattr(ref.result, f)), f
