"""The reference simulator: accounting, conservation, served area, invariants, determinism."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import fixed_arrivals, poisson_arrivals
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams, progress_after
from kvstab.ops import CONCRETE
from kvstab.registry import builtin_names, load_scheduler
from kvstab.simulator import Engine, SimResult, simulate
from kvstab.theory import lifetime_area
from kvstab.workload import Uniform, Workload

BUILTINS = builtin_names()  # the negative control is excluded


def brute_force_memory(s: int, o: int, chunk: int, block: int) -> list[int]:
    """Per-slot memory of a lone request, straight from MODEL.md's lifecycle."""
    n = -(-s // chunk)
    held = [min(c * chunk, s) for c in range(1, n + 1)] + [s + j for j in range(1, o + 1)]
    return [-(-h // block) * block for h in held]


@pytest.mark.parametrize("name", BUILTINS)
@given(s=st.integers(1, 300), o=st.integers(1, 60), chunk=st.integers(1, 128), block=st.sampled_from([1, 4, 16]))
@settings(max_examples=25, deadline=None)
def test_lone_request_memory_matches_brute_force(name: str, s: int, o: int, chunk: int, block: int) -> None:
    params = ModelParams(M=4096, chunk=chunk, block=block)
    res = simulate(load_scheduler(name), params, fixed_arrivals([(0, s, o)]), drain=True)
    expected = brute_force_memory(s, o, chunk, block)
    assert list(res.memory) == expected
    assert res.finish[0] == len(expected) - 1  # in service exactly n(s) + o slots
    assert res.served[0] == sum(expected) == lifetime_area(np.array([s]), np.array([o]), params)[0]


def _workloads() -> st.SearchStrategy[list[tuple[int, int, int]]]:
    req = st.tuples(st.integers(0, 40), st.integers(1, 120), st.integers(1, 80))
    return st.lists(req, min_size=1, max_size=25)


def _drained_with_full_units(
    name: str, rows: list[tuple[int, int, int]], params: ModelParams
) -> tuple[SimResult, npt.NDArray[np.bool_]]:
    """``simulate(..., drain=True)`` on the reference engine, plus which requests
    did less than one full unit (a chunk of ``ŝ``, or one token) in some slot
    they ran in: SGLang's prefill-only steps stall running requests and its
    chunk budget cuts chunks short, so their lifetime area is not ``g``."""
    eng = Engine(load_scheduler(name), params)
    plan = fixed_arrivals(rows)
    irregular = np.zeros(len(plan), dtype=bool)
    i = 0
    while i < len(plan) or not eng.idle:
        while i < len(plan) and plan.slot[i] <= eng.slot:
            eng.arrive(int(plan.s[i]), int(plan.o[i]))
            i += 1
        before = {r.rid: (r.s, r.progress) for r in list(eng.active) + list(eng.waiting)}
        rec = eng.step()  # raises on a violation
        for rid in {r.rid for r in eng.active} | set(rec.completed):
            s, p = before[rid] if rid not in rec.preempted else (before[rid][0], 0)
            full = int(progress_after(s, p, params.chunk, None, CONCRETE))
            if eng.requests[rid].progress != full:
                irregular[rid] = True
        assert eng.slot < 100_000, "the run did not drain"
    return eng.result(), irregular


@pytest.mark.parametrize("name", BUILTINS)
@given(rows=_workloads(), chunk=st.integers(1, 64), block=st.sampled_from([1, 8]), M=st.integers(200, 800))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_builtins_keep_invariants_and_conserve(
    name: str, rows: list[tuple[int, int, int]], chunk: int, block: int, M: int
) -> None:
    """No built-in breaks the memory invariant; requests are conserved in every
    slot; a request that always did a full unit of work is served exactly
    g(s, o) plus what the simulator reports as wasted by its preemptions.  Only
    a rule declaring ``stalls_running`` may give a running request less than a
    full unit here (no token budget is set)."""
    params = ModelParams(M=M, chunk=chunk, block=block)
    res, irregular = _drained_with_full_units(name, rows, params)
    if not load_scheduler(name).traits.stalls_running:
        assert not irregular.any(), "a rule that does not declare stalls_running gave a running request less than a unit"
    assert (res.memory <= M).all()
    arrived = np.cumsum(res.arrived)
    completed = np.cumsum(res.completed)
    running_after = arrived - completed - res.queue  # active at the end of each slot
    assert (running_after >= 0).all()
    assert arrived[-1] == len(rows) == completed[-1]
    g = lifetime_area(res.s, res.o, params).astype(np.int64)
    full = ~irregular
    assert np.array_equal(res.served[full], (g + res.request_wasted)[full])
    assert np.array_equal(res.request_wasted[res.preemptions == 0], np.zeros((res.preemptions == 0).sum()))
    assert res.wasted.sum() == res.request_wasted.sum()
    assert res.memory.sum() == res.served.sum()  # area used per slot adds up to area served


def test_engine_conservation_every_slot() -> None:
    """arrived = completed + waiting + active, checked slot by slot on the engine itself."""
    params = ModelParams(M=600, chunk=32)
    eng = Engine(load_scheduler("current-fit"), params)
    rng = np.random.default_rng(7)
    arrived = completed = 0
    for t in range(400):
        for _ in range(rng.poisson(0.3) if t < 300 else 0):
            eng.arrive(int(rng.integers(1, 200)), int(rng.integers(1, 150)))
            arrived += 1
        rec = eng.step()
        completed += len(rec.completed)
        assert arrived == completed + len(eng.waiting) + len(eng.active)
        assert rec.queue == len(eng.waiting) and rec.active_after == len(eng.active)


def test_negative_control_is_caught() -> None:
    params = ModelParams(M=20, chunk=4)
    with pytest.raises(InvariantViolation) as exc:
        simulate(load_scheduler("current-fit-no-preempt"), params, fixed_arrivals([(0, 4, 8), (0, 4, 8)]), drain=True)
    v = exc.value
    assert (v.slot, v.memory, v.capacity, v.requests) == (7, 22, 20, (0, 1))
    assert "slot 7" in str(v) and "M=20" in str(v)


def test_current_fit_preempts_newest_and_requeues_at_head() -> None:
    """Two requests that fit at admission but not at their peaks: the newer is
    preempted, loses its progress, goes back to the head, and nobody is admitted
    in that slot."""
    params = ModelParams(M=20, chunk=4)
    eng = Engine(load_scheduler("current-fit"), params)
    eng.arrive(4, 8)
    eng.arrive(4, 8)
    eng.arrive(1, 1)
    recs = [eng.step() for _ in range(8)]
    pre = [r for r in recs if r.preempted]
    assert pre and pre[0].preempted == (1,) and pre[0].admitted == ()
    assert eng.requests[1].progress == 0 or eng.requests[1].first_admit >= 0
    assert eng.waiting[0].rid == 1  # back at the head, ahead of request 2
    assert eng.requests[1].wasted > 0


def test_same_seed_same_trace_byte_for_byte() -> None:
    w = Workload(s=Uniform(10, 400), o=Uniform(10, 300))
    a = poisson_arrivals(w, 5.0, ModelParams(), 500, seed=3)
    b = poisson_arrivals(w, 5.0, ModelParams(), 500, seed=3)
    c = poisson_arrivals(w, 5.0, ModelParams(), 500, seed=4)
    assert a.slot.tobytes() == b.slot.tobytes() and a.s.tobytes() == b.s.tobytes() and a.o.tobytes() == b.o.tobytes()
    assert a.s.tobytes() != c.s.tobytes()
    params = ModelParams(M=4000, chunk=64)
    r1 = simulate(load_scheduler("current-fit"), params, a, 500)
    r2 = simulate(load_scheduler("current-fit"), params, b, 500)
    for field in ("memory", "queue", "completed", "preempted", "finish", "first_admit"):
        assert getattr(r1, field).tobytes() == getattr(r2, field).tobytes()


def test_window_widens_until_the_rule_stops_admitting() -> None:
    """A burst larger than the initial window is admitted in one slot."""
    params = ModelParams(M=10_000, chunk=8)
    plan = fixed_arrivals([(0, 2, 2)] * 100)
    res = simulate(load_scheduler("current-fit"), params, plan, 1, window=4)
    assert res.admitted[0] == 100


def test_request_that_can_never_fit_is_named() -> None:
    params = ModelParams(M=100, chunk=8)
    plan = fixed_arrivals([(0, 10, 10), (1, 60, 50)])
    with pytest.raises(InvalidArgument, match=r"request 1 \(s=60, o=50\).*M=100"):
        simulate(load_scheduler("current-fit"), params, plan, drain=True)
    dropped = plan.fit_to(params, drop_oversize=True)
    assert len(dropped) == 1 and dropped.dropped == 1


def test_load_state_replays_from_a_given_state() -> None:
    params = ModelParams(M=30, chunk=4)
    eng = Engine(load_scheduler("current-fit-no-preempt"), params)
    eng.load_state(active=[(4, 20, 12), (4, 20, 12)], waiting=[])
    assert [eng.step().memory for _ in range(3)] == [26, 28, 30]
    with pytest.raises(InvariantViolation) as exc:
        eng.step()
    assert exc.value.memory == 32 and exc.value.slot == 3
    with pytest.raises(InvalidArgument, match="progress"):
        Engine(load_scheduler("current-fit"), params).load_state(active=[(4, 4, 8)])


@pytest.mark.parametrize("name", BUILTINS)
def test_area_served_per_slot_never_exceeds_M(name: str) -> None:
    """Per slot, area served (memory used) ≤ M — the instability lemma, on a busy
    run, checked on the records (the engine's own check is off here)."""
    params = ModelParams(M=3000, chunk=64)
    w = Workload(s=Uniform(1, 300), o=Uniform(1, 200))
    res = simulate(load_scheduler(name), params, poisson_arrivals(w, 40.0, ModelParams(), 1500, seed=1), 1500, check=False)
    assert res.memory.max() <= params.M
    assert res.completed.sum() > 0


def test_engine_extension_points() -> None:
    """``on_preempt`` sees a victim's progress before it is lost and may change
    its lengths; ``min_output`` admits requests without a decode unit."""
    seen: list[tuple[int, int]] = []

    class KeepsOutputs(Engine):
        min_output = 0

        def on_preempt(self, r) -> None:  # type: ignore[no-untyped-def]
            seen.append((r.rid, r.progress))
            r.s, r.o = r.s + 1, r.o - 1  # a made-up lifecycle: one output moves into the prompt

    eng = KeepsOutputs(load_scheduler("current-fit"), ModelParams(M=20, chunk=4))
    eng.arrive(4, 8)
    eng.arrive(4, 8)
    eng.arrive(3, 0)  # no decode unit: finishes with its prefill
    for _ in range(40):
        eng.step()
    assert seen and all(p > 0 for _, p in seen)
    victim = eng.requests[seen[0][0]]
    assert (victim.s, victim.o) == (5, 7) and victim.finish >= 0
    assert eng.requests[2].finish >= 0
    with pytest.raises(InvalidArgument, match="o must be an integer >= 1"):
        Engine(load_scheduler("current-fit"), ModelParams(M=20, chunk=4)).arrive(3, 0)
