"""The ``sglang`` rule on hand-computed states, its lifecycle adapter, and long random runs."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from kvstab import Engine, ModelParams
from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang import SglangEngine, clip_max_new
from kvstab.registry import load_scheduler
from kvstab.schedulers.sglang import SCHEDULER, Sglang
from kvstab.testing.checks import PropertyViolation, audit_plan


def _probe_requests(n: int) -> list[tuple[int, int]]:
    """The probe's workload: prompts U(20, 150), max_new U(10, 80), seeded."""
    rng = random.Random(0)
    return [(rng.randint(20, 150), rng.randint(10, 80)) for _ in range(n)]


def test_registered_with_sglangs_defaults() -> None:
    rule = load_scheduler("sglang")
    assert rule is SCHEDULER and rule.traits.preempts and rule.traits.clairvoyant and rule.traits.fcfs
    assert rule.ratio_init == 0.7 and rule.ratio_min == pytest.approx(0.098)
    assert [v.name for v in rule.state_vars] == ["new_token_ratio", "batch_is_full"]
    # the server is the ModelParams passed alongside the rule, not one of its knobs
    assert {f.name for f in dataclasses.fields(rule)}.isdisjoint(f.name for f in dataclasses.fields(ModelParams))


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("max_prefill_tokens", 0, "positive integer"),
        ("context_len", 0, "positive integer or None"),
        ("init_new_token_ratio", -1.0, "positive"),
    ],
)
def test_bad_knobs_are_one_line_errors(field: str, value: object, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        Sglang(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("server", "needle"),
    [
        (ModelParams(M=256, chunk=10, block=4), "multiple of the page size"),
        (ModelParams(M=256, chunk=64, token_budget=64), "no token budget"),
    ],
)
def test_sglangs_lifecycle_refuses_a_server_sglang_refuses(server: ModelParams, needle: str) -> None:
    """SGLang's own constraints on the server, checked where its lifecycle takes one."""
    with pytest.raises(InvalidArgument, match=needle):
        SglangEngine(Sglang(), server)
    with pytest.raises(InvalidArgument, match=needle):
        replay_sglang_model(fixed_arrivals([(0, 20, 10)]), Sglang(), server, engine="reference")


def test_admission_is_blocked_by_the_reservation_while_memory_is_free() -> None:
    """The probe's trace (KV 256, chunk 64): a chunked first request, a second one,
    then decode with 108 tokens free and ten requests waiting."""
    eng = SglangEngine(Sglang(max_prefill_tokens=128), ModelParams(M=256, chunk=64, max_num_seqs=16))
    reqs = _probe_requests(12)
    for s, o in reqs:
        eng.arrive(s, o)
    recs = [eng.step() for _ in range(4)]
    assert [r.tokens for r in recs] == [64, 54, 30, 2]
    assert [r.admitted for r in recs] == [(0,), (), (1,), ()]
    assert recs[2].memory == 148 and recs[2].queue == 10
    assert recs[3].admitted == () and recs[3].state[1] == 1  # batch_is_full: no prefill is tried


def test_the_reservation_blocks_a_request_whose_whole_peak_fits() -> None:
    """90 tokens free and the head's peak s + o = 50 fits them, but 20 + 31 + 1 ≥ 90 − 0.7 · 90:
    the running request's remaining 90 outputs are reserved at the ratio."""
    rule, params = Sglang(), ModelParams(M=120, chunk=64)
    eng = Engine(rule, params)
    eng.load_state(active=[(20, 100, 30)], waiting=[(20, 30)])
    rec = eng.step()
    assert rec.admitted == () and rec.tokens == 1 and rec.state[1] == 1
    roomy = Engine(rule, dataclasses.replace(params, M=200))  # 170 free: 52 < 170 − 63
    roomy.load_state(active=[(20, 100, 30)], waiting=[(20, 30)])
    assert roomy.step().admitted == (1,)


def test_the_ratio_decays_on_decode_steps_to_its_floor() -> None:
    rule, params = Sglang(), ModelParams(M=10_000, chunk=512)
    eng = Engine(rule, params)
    eng.arrive(10, 50)
    ratio = rule.ratio_init
    eng.step()  # prefill: no decay
    assert eng.sched_state[0] == ratio
    for _ in range(5):
        eng.step()
        ratio = max(ratio - rule.ratio_decay, rule.ratio_min)
        assert eng.sched_state[0] == ratio
    floor = Engine(rule, params)
    floor.load_state(active=[(10, 50, 20)], sched_state=(rule.ratio_min + rule.ratio_decay / 2, 0))
    floor.step()
    assert floor.sched_state[0] == rule.ratio_min


def test_an_idle_step_resets_the_ratio() -> None:
    rule, params = Sglang(), ModelParams(M=1000, chunk=64)
    eng = Engine(rule, params)
    eng.load_state(sched_state=(0.3, 0))
    eng.step()
    assert eng.sched_state == (rule.ratio_init, 0)


def test_retraction_order_and_the_ratio_jump() -> None:
    """Memory full (100 of 100), three decoding requests need one token each.
    A has the fewest outputs (11): it goes first, and the rest then fits."""
    rule, params = Sglang(), ModelParams(M=100, chunk=64)
    eng = Engine(rule, params)
    # (s, o, progress): outputs so far = progress − s + 1
    eng.load_state(active=[(30, 40, 40), (20, 40, 31), (18, 40, 29)], sched_state=(0.1, 1))
    rec = eng.step()
    assert rec.preempted == (0,)
    assert rec.tokens == 2  # the kept two still decode
    # (Σ outputs + 20·kept) / (Σ max_new + 1), max_new = o + 1
    assert eng.sched_state == ((12 + 12 + 20 * 2) / (41 + 41 + 1), 0)


def test_retraction_ties_go_to_the_longer_prompt_then_the_later_request() -> None:
    rule, params = Sglang(), ModelParams(M=60, chunk=64)
    # equal outputs (11): the longer prompt (B, s=21) is retracted first
    eng = Engine(rule, params)
    eng.load_state(active=[(20, 30, 30), (21, 30, 31)], sched_state=(0.1, 0))
    assert eng.step().preempted == (1,)
    # equal outputs and prompts: the later one in the batch goes
    eng = Engine(rule, params)
    eng.load_state(active=[(20, 30, 30), (20, 30, 30)], sched_state=(0.1, 0))
    assert eng.step().preempted == (1,)


def test_a_lone_request_is_never_retracted() -> None:
    rule, params = Sglang(), ModelParams(M=40, chunk=64)
    eng = Engine(rule, params)
    eng.load_state(active=[(20, 20, 39)], sched_state=(0.1, 0))
    rec = eng.step()
    assert rec.preempted == () and rec.completed == (0,)


def test_prefill_steps_stall_decoding_requests() -> None:
    rule, params = Sglang(), ModelParams(M=10_000, chunk=512)
    eng = Engine(rule, params)
    eng.load_state(active=[(10, 20, 15)], waiting=[(30, 5)])
    rec = eng.step()
    assert rec.admitted == (1,) and rec.tokens == 30  # the running request got nothing
    assert eng.requests[0].progress == 15
    rec = eng.step()
    assert rec.tokens == 2  # a decode step for both


def test_the_chunk_budget_is_shared_and_one_request_is_mid_chunk() -> None:
    rule, params = Sglang(), ModelParams(M=100_000, chunk=100)
    eng = Engine(rule, params)
    for s in (60, 70, 80):
        eng.arrive(s, 3)
    rec = eng.step()
    assert rec.admitted == (0, 1) and rec.tokens == 100  # 60 whole, then 40 of the second
    assert [r.progress for r in eng.active] == [60, 40]
    rec = eng.step()
    assert rec.admitted == (2,) and [r.progress for r in eng.active] == [60, 70, 70]


CONFIGS = [
    (Sglang(max_prefill_tokens=128, init_new_token_ratio=0.1), ModelParams(M=300, chunk=64)),
    (Sglang(), ModelParams(M=400, chunk=32, block=16, max_num_seqs=6)),
    (Sglang(max_prefill_tokens=150, init_new_token_ratio=0.05), ModelParams(M=900, chunk=128)),
    (Sglang(schedule_conservativeness=0.3), ModelParams(M=500, chunk=64, block=4, max_num_seqs=3)),
]


@pytest.mark.parametrize(
    ("rule", "params"), CONFIGS, ids=[f"M{p.M}-c{p.chunk}-B{p.block}-n{p.max_num_seqs}" for _, p in CONFIGS]
)
@pytest.mark.parametrize("lifecycle", ["kvstab", "sglang"])
def test_long_random_runs_keep_memory_and_one_chunk(rule: Sglang, params: ModelParams, lifecycle: str) -> None:
    """The engine checks Σ held ≤ M, the running cap and the state's bounds every
    slot; here also: at most one request mid-prefill, and every request finishes."""
    rng = np.random.default_rng(7)
    n = 150
    slot = np.sort(rng.integers(0, 400, n))
    s = rng.integers(1, params.M // 3, n)
    o = rng.integers(1, params.M // 3, n)
    eng: Engine = SglangEngine(rule, params) if lifecycle == "sglang" else Engine(rule, params)
    i = 0
    retracted = 0
    while i < n or not eng.idle:
        while i < n and slot[i] <= eng.slot:
            eng.arrive(int(s[i]), int(o[i]))
            i += 1
        rec = eng.step()
        retracted += len(rec.preempted)
        assert sum(r.progress < r.s for r in eng.active) <= 1
        assert eng.slot < 200_000
    assert all(r.finish >= 0 for r in eng.requests)
    assert retracted > 0  # these servers are tight: retraction is exercised


def test_the_lifecycle_adapter_clips_refuses_and_requeues_at_the_tail() -> None:
    rule, params = Sglang(), ModelParams(M=100, chunk=64)
    assert clip_max_new(rule, params, 50, 80) == 48  # min(80, 99 − 50 − 1, 100 − 50 − 1 − 1)
    with pytest.raises(InvalidArgument, match="refused by SGLang"):
        clip_max_new(rule, params, 94, 1)
    eng = SglangEngine(rule, params)
    eng.arrive(10, 5)
    assert eng.requests[0].o == 4  # the first output token comes with the prefill
    # a retracted request resumes with its outputs as prompt, behind the queue
    rule, params = Sglang(init_new_token_ratio=0.1), ModelParams(M=60, chunk=64)
    eng = SglangEngine(rule, params)
    eng.load_state(active=[(20, 30, 30), (21, 30, 31)], waiting=[(5, 5)], sched_state=(0.1, 0))
    rec = eng.step()
    assert rec.preempted == (1,)
    assert [r.rid for r in eng.waiting] == [2, 1]
    assert (eng.requests[1].s, eng.requests[1].o, eng.prior[1]) == (32, 18, 11)  # max_new 30 is kvstab o = 29


def test_replay_log_matches_the_probe_trace() -> None:
    rule = Sglang(max_prefill_tokens=128, init_new_token_ratio=0.1)
    params = ModelParams(M=300, chunk=64, max_num_seqs=16)
    log = replay_sglang_model(fixed_arrivals([(0, s, o) for s, o in _probe_requests(12)]), rule, params)
    assert len(log.steps) == 449 and sum(log.retractions) == 1
    step = next(st for st in log.steps if st.retracted)
    assert (step.step, step.retracted, step.kv_used) == (234, (4,), 117)
    assert step.new_token_ratio == pytest.approx(0.8267, abs=1e-4)
    assert log.steps[-1].kv_used == 0 and {st.kind for st in log.steps} == {"prefill", "decode"}


def _stress(rule: Sglang, params: ModelParams, seed: int) -> int:
    """Retractions of a heavy burst on SGLang's lifecycle."""
    rng = np.random.default_rng(seed)
    n = 80
    plan = ArrivalPlan(slot=np.sort(rng.integers(0, 50, n)), s=rng.integers(10, 200, n), o=rng.integers(10, 400, n))
    return sum(replay_sglang_model(plan, rule, params).retractions)


def test_retraction_needs_a_ratio_below_one() -> None:
    """With outputs known (o = max_new), a ratio of 1 reserves every running request's
    remaining outputs, so check_decode_mem always passes; below 1 it can fail."""
    base, params = Sglang(), ModelParams(M=1000, chunk=128)
    ratio_one = dataclasses.replace(base, schedule_conservativeness=2.0, min_new_token_ratio_factor=1.0)
    assert ratio_one.ratio_init == ratio_one.ratio_min == 1.0
    assert sum(_stress(base, params, seed) for seed in range(3)) > 0
    assert sum(_stress(ratio_one, params, seed) for seed in range(3)) == 0


@pytest.mark.parametrize("seed", range(4))
def test_properties_one_to_seven_hold(seed: int) -> None:
    rng = np.random.default_rng(seed)
    params = ModelParams(M=int(rng.integers(40, 400)), chunk=int(rng.integers(4, 64)), block=int(rng.choice([1, 4])))
    n = 40
    plan = ArrivalPlan(
        slot=np.sort(rng.integers(0, 60, n)),
        s=rng.integers(1, params.M // 3, n),
        o=rng.integers(1, params.M // 3, n),
    )
    audit_plan(SCHEDULER, params, plan, select={1, 2, 3, 4, 5, 6})


def test_sglang_declares_stalls_and_property_8_holds_with_the_work_bound() -> None:
    """SGLang stalls running requests in prefill steps, so the drain bound
    Σ(n(s) + o) is not one it keeps (a copy of the rule without the trait fails
    property 8 on the workload below); it declares ``stalls_running``, and
    property 8 checks the bound it does keep: the work left, Σ(s + o), plus the
    progress its retractions throw away."""
    assert SCHEDULER.traits.stalls_running
    params = ModelParams(M=23, chunk=23)
    plan = fixed_arrivals([(0, 1, 11), (0, 1, 11)])
    undeclared = dataclasses.replace(SCHEDULER, traits=dataclasses.replace(SCHEDULER.traits, stalls_running=False))
    with pytest.raises(PropertyViolation, match=r"property 8.*bound Σ\(n\(s\)\+o\) = 24"):
        audit_plan(undeclared, params, plan, select={8})
    aud = audit_plan(SCHEDULER, params, plan, select={8})
    assert aud.exercised[8] == 1
