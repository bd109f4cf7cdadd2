"""The compiled engine with prefix caching against the reference engine: identical outcomes.

``kvstab.engine.cached`` runs vLLM's block pool in numba; the reference engine
(``kvstab/prefix_cache.py``) is the definition.  Every per-slot column and every
per-request outcome must agree, for every rule the compiled path carries, under kvstab's
and vLLM's lifecycles, on random small servers (eviction and preemption all the time) with
prompts drawn from a few shared segments.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.engine import run as engine_run
from kvstab.engine.cached import run_cached
from kvstab.errors import InvariantViolation
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, PromptSet, block_hashes, chain_constants, content_id, segment_digests
from kvstab.registry import load_scheduler
from kvstab.simulator import SimResult, simulate
from kvstab.workload import parse_workload

FIELDS = (
    "arrived", "admitted", "preempted", "completed", "running", "memory", "wasted", "tokens", "queue",
    "s", "o", "arrival", "first_admit", "finish", "preemptions", "served", "request_wasted",
)  # fmt: skip


def _same(ref: SimResult, fast: SimResult) -> None:
    assert ref.slots == fast.slots, (ref.slots, fast.slots)
    for f in FIELDS:
        a, b = getattr(ref, f), getattr(fast, f)
        if a.shape != b.shape or not np.array_equal(a, b):
            i = int(np.flatnonzero(a != b)[0]) if a.shape == b.shape else -1
            raise AssertionError(f"{f} differs first at {i}: reference {a[max(i, 0):i + 4]}, fast {b[max(i, 0):i + 4]}")


def _prompts(rng: np.random.Generator, n: int, most: int) -> PromptSet:
    """A few shared segments at every depth, whole prompts shared too."""
    system = [(content_id("shared", 7_000 + k), int(rng.integers(1, most))) for k in range(3)]
    template = [(content_id("fewshot", 7_000 + k), int(rng.integers(1, most))) for k in range(3)]
    out = []
    for i in range(n):
        segs = [system[int(rng.integers(0, 3))]]
        if rng.random() < 0.6:
            segs.append(template[int(rng.integers(0, 3))])
        if rng.random() < 0.7:
            segs.append((content_id("message", 7_000 + i), int(rng.integers(1, most))))
        out.append(Prompt(tuple(segs)))
    return PromptSet.from_prompts(out, output=None if rng.random() < 0.5 else
                                  [content_id("answer", int(k)) for k in rng.integers(0, 4, n)])


def _case(seed: int, rule: str, life: str) -> tuple[ModelParams, ArrivalPlan]:
    rng = np.random.default_rng(seed)
    B = int(rng.choice([1, 2, 4, 16]))
    blocks = int(rng.integers(12, 90))
    vllm = rule == "vllm-v1"
    budget = int(rng.choice([8, 32, 128])) if vllm else None
    seqs = int(rng.integers(2, 10)) if vllm or rng.random() < 0.5 else None
    chunk = budget if vllm else int(rng.choice([4, 16, 64]))
    params = ModelParams(M=blocks * B, chunk=chunk or 16, block=B, token_budget=budget, max_num_seqs=seqs,
                         bbar=1.0, prefix_caching=True)
    n = int(rng.integers(5, 40))
    prompts = _prompts(rng, n, max(2, blocks * B // 6))
    s = prompts.lengths()
    least = 1 if life == "vllm" else 1
    o = np.array([int(rng.integers(least, max(least + 1, blocks * B - int(x) + 1))) for x in s], dtype=np.int64)
    o = np.minimum(o, blocks * B - s - (0 if life == "vllm" else 0))
    o = np.maximum(o, 1)
    keep = s + o - (1 if life == "vllm" else 0) <= blocks * B
    slot = np.sort(rng.integers(0, 60, n)).astype(np.int64)
    return params, ArrivalPlan(slot[keep], s[keep], o[keep], prompts=prompts.take(keep))


def _reference(rule: str, params: ModelParams, plan: ArrivalPlan, life: str, slots: int | None) -> SimResult:
    if life == "vllm":
        eng = VllmEngine(load_scheduler(rule), params)
        eng.run(plan, slots, drain=slots is None)
        return eng.result(dropped=plan.dropped)
    return simulate(load_scheduler(rule), params, plan, slots, drain=slots is None)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    case=st.sampled_from([("vllm-v1", "kvstab"), ("vllm-v1", "vllm"), ("current-fit", "kvstab"), ("reserve", "kvstab")]),
    drain=st.booleans(),
)
def test_the_compiled_pool_is_the_reference_pool(seed: int, case: tuple[str, str], drain: bool) -> None:
    rule, life = case
    params, plan = _case(seed, rule, life)
    slots = None if drain else 150
    try:
        ref = _reference(rule, params, plan, life, slots)
    except InvariantViolation:
        # a rule that never preempts may meet a full pool: the compiled loop must hand over, not guess
        assert run_cached(load_scheduler(rule), params, plan, slots, drain=drain, lifecycle=life,
                          max_slots=100_000) is None
        return
    out = run_cached(load_scheduler(rule), params, plan, slots, drain=drain, lifecycle=life, max_slots=100_000)
    assert out is not None and out[1] is not None
    _same(ref, out[1])
    # streamed (no rows kept): the same summary as the recorded run's
    streamed = run_cached(load_scheduler(rule), params, plan, slots, drain=drain, lifecycle=life,
                          max_slots=100_000, record=False)
    assert streamed is not None and streamed[1] is None
    assert (streamed[0].completed, streamed[0].preemptions) == (out[0].completed, out[0].preemptions)


@pytest.mark.parametrize("rule", ["vllm-v1", "current-fit", "reserve"])
def test_a_shared_prompt_workload_is_identical_and_hits(rule: str) -> None:
    server = ModelParams(M=4096, chunk=256, block=16, token_budget=256 if rule == "vllm-v1" else None,
                         max_num_seqs=64 if rule == "vllm-v1" else None, bbar=1.0, prefix_caching=True)
    plan = poisson_arrivals(parse_workload("s=U(300,700),o=U(10,200),prefix=shared(256)"), 0.5, server, 600, seed=4)
    ref = simulate(load_scheduler(rule), server, plan, 600)
    out = engine_run(load_scheduler(rule), server, plan, 600)
    assert out.engine == "fast" and out.result is not None
    _same(ref, out.result)
    off = simulate(load_scheduler(rule), replace(server, prefix_caching=False), plan, 600)
    assert ref.tokens.sum() < off.tokens.sum() or ref.completed.sum() > off.completed.sum()


def test_the_compiled_hash_chain_is_the_prefix_modules() -> None:
    """The kernel hashes blocks itself from segment digests and the chain constants; the chain it
    builds is :func:`kvstab.prefix.block_hashes` (a lookup of a cached chain finds every block)."""
    from kvstab.engine import _kernel_cache as KC

    rng = np.random.default_rng(3)
    for B in (1, 3, 16):
        p = Prompt(tuple((int(rng.integers(-2**62, 2**62)), int(rng.integers(1, 40))) for _ in range(5)))
        want = block_hashes(p, B)
        d = segment_digests([c for c, _ in p.segments])
        lens = np.array([n for _, n in p.segments], dtype=np.int64)
        R, SEED, K1, K2 = (np.uint64(x) for x in chain_constants())
        seg, off, P = 0, 0, SEED
        got = []
        for _ in want:
            # numba hands a uint64 back as a Python int: keep it uint64 (as the kernel's arrays do)
            h, P, seg, off = KC._block_hash(d, lens, seg, off, np.uint64(P), B, R, K1, K2)
            got.append(int(h))
        assert tuple(got) == want
