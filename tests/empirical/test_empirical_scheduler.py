"""The ``vllm-v1`` rule and vLLM's request lifecycle in kvstab's engine (no vLLM needed).

The cases are traced by hand from vLLM 0.33.0's ``Scheduler.schedule`` (running
list first under one token budget, tail preemption, no admission after a
preemption, whole-prompt admission check); the cross-check against vLLM
itself is ``test_empirical_vllm.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import z3

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import ActiveEntry, View, WaitingEntry
from kvstab.empirical.replay import replay_model
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.vllm import VllmEngine, kvstab_lengths, resumed_lengths
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE
from kvstab.registry import load_scheduler
from kvstab.schedulers.vllm_v1 import SCHEDULER
from kvstab.simulator import simulate
from kvstab.steplog import ReplayConfig
from kvstab.symbolic import Z3Ops, unwrap


def view(active, waiting, M, chunk=512, block=1, budget=None, seqs=None) -> View:
    return View(
        active=tuple(ActiveEntry(i, s, o, p) for i, (s, o, p) in enumerate(active)),
        waiting=tuple(WaitingEntry(100 + j, s, o) for j, (s, o) in enumerate(waiting)),
        M=M,
        chunk=chunk,
        block=block,
        token_budget=budget,
        max_num_seqs=seqs,
        n_waiting=len(waiting),
    )


def test_loads_by_module_attr() -> None:
    assert load_scheduler("kvstab.schedulers.vllm_v1:SCHEDULER").name == "vllm-v1"


def test_running_first_then_prefill_chunks_share_the_budget() -> None:
    # two decodes take 1 token each, the prefilling request gets min(rest, 510 - ...)
    v = view([(100, 50, 100), (100, 50, 120), (900, 10, 300)], [(700, 5), (300, 5)], M=100_000, budget=512)
    d = SCHEDULER.decide(v, CONCRETE)
    assert d.preempt == (False, False, False)
    # 1 + 1 + min(600, 510) = 512: the budget is spent, nobody is admitted
    assert d.grants == (1, 1, 510, 0, 0)
    assert d.admit == (False, False)


def test_admission_gets_what_is_left_of_the_budget() -> None:
    v = view([(100, 50, 100)], [(700, 5), (300, 5)], M=100_000, budget=512)
    d = SCHEDULER.decide(v, CONCRETE)
    # decode 1, then the head gets 511 of its 700, and the budget is spent
    assert d.admit == (True, False)
    assert d.grants == (1, 511, 0)


def test_whole_prompt_must_fit_not_just_the_first_chunk() -> None:
    # 1000 tokens in use; the head's first chunk (512) fits in the 600 free, its prompt (700) does not
    v = view([(999, 50, 999)], [(700, 5)], M=1_600, budget=512)
    d = SCHEDULER.decide(v, CONCRETE)
    assert d.admit == (False,)
    v = view([(999, 50, 999)], [(600, 5)], M=1_600, budget=512)
    assert SCHEDULER.decide(v, CONCRETE).admit == (True,)


def test_head_of_line_blocks_a_smaller_request_behind_it() -> None:
    v = view([], [(900, 5), (10, 5)], M=800, budget=2048)
    assert SCHEDULER.decide(v, CONCRETE).admit == (False, False)


def test_overflow_preempts_the_newest_and_stops_admission() -> None:
    # blocks of 16: each decode at a block boundary needs a new block
    v = view([(32, 10, 32), (32, 10, 32), (32, 10, 32)], [(1, 1)], M=96 + 16, block=16, budget=512)
    d = SCHEDULER.decide(v, CONCRETE)
    # after the step each holds 48 tokens: 48 + 48 fits in 112, the third does not
    assert d.preempt == (False, False, True)
    assert d.admit == (False,)


def test_unscheduled_requests_keep_their_blocks_and_can_be_preempted() -> None:
    # budget 1: only the oldest decodes; the others hold their blocks without work
    v = view([(16, 10, 16), (16, 10, 16), (16, 10, 16)], [], M=48, block=16, budget=1)
    d = SCHEDULER.decide(v, CONCRETE)
    assert d.grants is not None
    # oldest grows to 32: 32 + 16 fits, 32 + 16 + 16 does not -> the newest goes
    assert d.preempt == (False, False, True)
    assert d.grants[:2] == (1, 0)


def test_max_num_seqs_caps_admission() -> None:
    v = view([(10, 5, 10)], [(10, 5), (10, 5), (10, 5)], M=10_000, budget=512, seqs=3)
    assert SCHEDULER.decide(v, CONCRETE).admit == (True, True, False)


def test_rule_runs_symbolically_and_agrees_with_the_concrete_run() -> None:
    ops = Z3Ops()
    n_act, n_wait = 3, 2
    a = [(z3.Int(f"s{i}"), z3.Int(f"o{i}"), z3.Int(f"p{i}"), z3.Bool(f"a{i}")) for i in range(n_act)]
    w = [(z3.Int(f"ws{j}"), z3.Int(f"wo{j}"), z3.Bool(f"w{j}")) for j in range(n_wait)]
    from kvstab.symbolic import wrap

    sym = View(
        active=tuple(ActiveEntry(i, wrap(s), wrap(o), wrap(p), wrap(pr)) for i, (s, o, p, pr) in enumerate(a)),
        waiting=tuple(WaitingEntry(10 + j, wrap(s), wrap(o), wrap(pr)) for j, (s, o, pr) in enumerate(w)),
        M=200,
        chunk=64,
        block=8,
        token_budget=64,
        max_num_seqs=4,
        n_waiting=n_wait,
    )
    d = SCHEDULER.decide(sym, ops)
    rng = np.random.default_rng(3)
    for _ in range(40):
        lens = [(int(rng.integers(1, 90)), int(rng.integers(1, 40))) for _ in range(n_act)]
        act = [(s, o, int(rng.integers(1, s + o))) for s, o in lens]
        wai = [(int(rng.integers(1, 120)), int(rng.integers(1, 40))) for _ in range(n_wait)]
        conc = SCHEDULER.decide(view(act, wai, M=200, chunk=64, block=8, budget=64, seqs=4), CONCRETE)
        subst = []
        for (s, o, p, pr), (cs, co, cp) in zip(a, act):
            subst += [(s, z3.IntVal(cs)), (o, z3.IntVal(co)), (p, z3.IntVal(cp)), (pr, z3.BoolVal(True))]
        for (s, o, pr), (cs, co) in zip(w, wai):
            subst += [(s, z3.IntVal(cs)), (o, z3.IntVal(co)), (pr, z3.BoolVal(True))]

        def val(x: object, subst: list = subst) -> object:  # this iteration's substitution
            e = z3.simplify(z3.substitute(unwrap(x), *subst))
            return z3.is_true(e) if z3.is_bool(e) else e.as_long()

        assert tuple(val(x) for x in d.admit) == conc.admit
        assert tuple(val(x) for x in d.preempt) == conc.preempt
        assert d.grants is not None
        assert tuple(val(x) for x in d.grants) == conc.grants


def test_engine_enforces_memory_budget_and_cap_with_the_rule() -> None:
    rng = np.random.default_rng(7)
    reqs = [(int(t), int(rng.integers(1, 300)), int(rng.integers(1, 200))) for t in sorted(rng.integers(0, 400, 150))]
    params = ModelParams(M=1024, chunk=64, block=16, token_budget=64, max_num_seqs=6)
    res = simulate(load_scheduler("kvstab.schedulers.vllm_v1:SCHEDULER"), params, fixed_arrivals(reqs), 3000)  # the engine raises on any violation
    assert res.memory.max() <= params.M
    assert res.tokens.max() <= 64
    assert res.running.max() <= 6
    assert res.preempted.sum() > 0  # the case exercises preemption
    assert (res.finish >= 0).sum() > 50


def test_lengths_map() -> None:
    assert kvstab_lengths(10, 1) == (10, 0)
    assert kvstab_lengths(10, 5) == (10, 4)
    with pytest.raises(InvalidArgument):
        kvstab_lengths(0, 3)
    # preempted during prefill: unchanged; in decode at p: (p + 1, s + o - p - 1), same peak
    assert resumed_lengths(100, 20, 50) == (100, 20)
    assert resumed_lengths(100, 20, 100) == (101, 19)
    assert resumed_lengths(100, 20, 110) == (111, 9)
    assert resumed_lengths(100, 20, 119) == (120, 0)
    for p in range(100, 120):
        s2, o2 = resumed_lengths(100, 20, p)
        assert s2 + o2 == 120


def test_vllm_lifecycle_steps_and_peak() -> None:
    # alone on the server: n(s) + o - 1 steps, peak s + o - 1 tokens
    params = ModelParams(M=10_000, chunk=64, block=1, token_budget=64, max_num_seqs=8)
    for s, o in [(1, 1), (64, 1), (65, 1), (100, 2), (130, 7)]:
        eng = VllmEngine(SCHEDULER, params)
        eng.arrive(s, o)
        recs = []
        while not eng.idle:
            recs.append(eng.step())
        n = -(-s // 64)
        assert len(recs) == n + o - 1, (s, o)
        assert max(r.memory for r in recs) == s + o - 1


def test_resumed_request_recomputes_its_outputs_as_a_prompt() -> None:
    # two requests on a pool that cannot hold both peaks: the newer is preempted in decode
    cfg = ReplayConfig(num_blocks=9, block_size=4, max_num_batched_tokens=16, max_num_seqs=4)
    plan = fixed_arrivals([(0, 8, 12), (0, 8, 12)])
    log = replay_model(plan, cfg, 80)
    assert log.preempted.sum() >= 1
    assert (log.finish >= 0).all()
    # each preemption recomputes what it threw away, and never more than s + o - 1 tokens
    assert log.request_recomputed.sum() == log.recomputed.sum() > 0
    assert (log.request_recomputed <= log.preemptions * (8 + 12 - 1)).all()
    # every token is computed once, plus once more for each token a preemption threw away
    assert log.tokens.sum() == int((plan.s + plan.o - 1).sum()) + log.recomputed.sum()
    # the outputs of a request preempted in decode come back as prompt tokens
    assert log.prefill_tokens.sum() > plan.s.sum() + log.recomputed.sum() - log.decode_tokens.sum()


def test_bad_replay_input_is_named() -> None:
    cfg = ReplayConfig(num_blocks=5, block_size=16, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=60)
    with pytest.raises(InvalidArgument, match="max_model_len=60"):
        replay_model(fixed_arrivals([(0, 50, 20)]), cfg, 10)
    with pytest.raises(InvalidArgument, match=r"needs 80 tokens .* M=\(num_blocks-1\)·B=64"):
        replay_model(fixed_arrivals([(0, 60, 10)]), ReplayConfig(num_blocks=5, block_size=16), 10)
    with pytest.raises(InvalidArgument, match="num_blocks must be >= 2"):
        ReplayConfig(num_blocks=1)
    assert ReplayConfig.for_capacity(16_384).M == 16_384
    assert ReplayConfig.for_capacity(131_000).M == 130_992
