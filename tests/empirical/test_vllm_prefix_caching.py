"""vLLM 0.33's own scheduler with automatic prefix caching on, fed the plan's real prefixes,
and kvstab's ``vllm-v1`` model with its prefix cache against it, step for step.

The oracle the prefix-caching model is checked against step for step
(``docs/MODEL.md``, "Prefix caching (vLLM 0.33)"): with caching on, requests
that share a system prompt hit its cached blocks (their prefill starts past
it, and the shared blocks count once against ``M``), so the flooded server
completes several times more requests per step than with caching off; a plan
with no shared prefix gives the same steps either way.  Skipped without vLLM
unless ``KVSTAB_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.data import trace_path
from kvstab.empirical.replay import replay_model, replay_vllm
from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, PromptSet, content_id
from kvstab.schedulers.vllm_v1 import SCHEDULER
from kvstab.steplog import ReplayConfig, StepLog
from kvstab.traces import load_trace
from kvstab.workload import parse_workload

STEPS = 900
PER_STEP = ModelParams(bbar=1.0)  # rates per step


@pytest.fixture(scope="module", autouse=True)
def vllm() -> None:
    """vLLM 0.33.0, or a skip (a failure under ``KVSTAB_REQUIRE_VLLM=1``)."""
    try:
        load_vllm()
    except VllmUnavailable as exc:
        if os.environ.get("KVSTAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVSTAB_REQUIRE_VLLM=1 but {exc}", pytrace=False)
        pytest.skip(f"{exc} (KVSTAB_REQUIRE_VLLM=1 turns this skip into a failure)")


def _config(caching: bool) -> ReplayConfig:
    return ReplayConfig.for_capacity(16_384, 16, max_num_batched_tokens=512, enable_prefix_caching=caching)


def _rate(log: StepLog) -> float:
    """Completions per step over the second half (the queue is flooded throughout)."""
    return float(log.completed[STEPS // 2 :].mean())


def test_a_shared_system_prompt_hits_with_caching_on() -> None:
    """Every request: 1,024 shared tokens + 256 own, 64 out; M = 16,384 (1,024 blocks of 16)."""
    w = parse_workload("s=const(1280),o=const(64),prefix=shared(1024)")
    plan = poisson_arrivals(w, 3.0, PER_STEP, STEPS, seed=1)
    off = replay_vllm(plan, _config(False), STEPS)
    on = replay_vllm(plan, _config(True), STEPS)
    assert off.queue[-1] > 100 and on.queue[-1] > 100, "the queue must stay flooded for a saturated rate"
    # caching off holds each request's copy of the prompt; on, the 64 shared blocks are held once and
    # prefilled once, so far more requests run and finish per step
    assert _rate(on) > 2.0 * _rate(off), (_rate(on), _rate(off))
    # a request whose prompt hits computes only its own 256 tokens (+ its outputs): fewer prefill tokens per
    # completion than the whole 1,280-token prompt
    done = int(on.completed.sum())
    assert done > 0 and on.tokens.sum() < done * (1280 + 64)


def test_no_shared_prefix_gives_the_same_steps_either_way() -> None:
    """A plan without prompts gets each request its own token ids: with no preemption (a preempted
    request would find its own blocks again), caching changes nothing."""
    w = parse_workload("s=U(10,600),o=U(10,200)")
    plan = poisson_arrivals(w, 0.05, PER_STEP, 400, seed=2)
    assert plan.prompts is None and len(plan) > 10
    off = replay_vllm(plan, _config(False), 400)
    on = replay_vllm(plan, _config(True), 400)
    assert off.preempted.sum() == 0
    for name in ("admitted", "preempted", "completed", "memory", "tokens", "queue"):
        assert np.array_equal(getattr(on, name), getattr(off, name)), name


# ---- the model with caching on, step for step against vLLM's scheduler with caching on ----


def assert_same_with_caching(plan: ArrivalPlan, cfg: ReplayConfig, steps: int) -> StepLog:
    """vLLM 0.33's scheduler and kvstab's ``vllm-v1`` model, both with prefix caching on:
    every step and every request identical (``StepLog.first_difference``)."""
    assert cfg.enable_prefix_caching
    real = replay_vllm(plan, cfg, steps)
    model = replay_model(plan, cfg, steps)
    diff = real.first_difference(model)
    assert diff is None, diff
    return real


@pytest.mark.parametrize(
    "spec,rate,M",
    [
        ("s=const(1280),o=const(64),prefix=shared(1024)", 3.0, 16_384),  # the shared system prompt
        ("s=const(1280),o=const(256),prefix=shared(1024)", 3.0, 4_096),  # a preemption storm, eviction
        ("s=U(900,1500),o=U(10,200),prefix=tenants(6,U(200,800),0.5)", 3.0, 6_144),  # tenants, small pool
        ("s=U(600,1200),o=U(20,120),prefix=fewshot(3,256,200,1.0)", 2.0, 16_384),
        ("s=U(20,300),o=U(20,200),prefix=chat(U(2,6),2)", 3.0, 4_096),  # conversations: answers hit
        ("s=U(100,900),o=U(50,400)", 1.5, 8_192),  # no shared prefix: preempted requests find their blocks
    ],
)
def test_the_model_with_caching_is_vllm_with_caching(spec: str, rate: float, M: int) -> None:
    plan = poisson_arrivals(parse_workload(spec), rate, PER_STEP, 400, seed=1)
    real = assert_same_with_caching(plan, _config_at(M), 400)
    assert real.completed.sum() > 0


def _config_at(M: int) -> ReplayConfig:
    return ReplayConfig.for_capacity(M, 16, max_num_batched_tokens=512, enable_prefix_caching=True)


def test_a_mooncake_hash_chain_trace_is_replayed_identically() -> None:
    """The published Mooncake conversation trace, its hash_ids as prompt content (512-token blocks,
    B = 16 inside them), flooded: two requests a step, those with s + o <= 4,000, on a pool small
    enough to preempt."""
    trace = load_trace(trace_path("mooncake-conversation"))
    keep = np.flatnonzero(trace.s + trace.o <= 4_000)[:300]
    assert trace.prompts is not None
    plan = ArrivalPlan(np.arange(keep.size, dtype=np.int64) // 2, trace.s[keep], trace.o[keep],
                       prompts=trace.prompts.take(keep))
    cfg = ReplayConfig.for_capacity(16_384, 16, max_num_batched_tokens=2_048, enable_prefix_caching=True)
    real = assert_same_with_caching(plan, cfg, 500)
    assert real.completed.sum() > 5 and real.preempted.sum() > 0


def _random_prompts(rng: np.random.Generator, n: int, most: int) -> PromptSet:
    """Prompts from a small library of segments, so prefixes collide at every depth: a system
    prompt (one of three), maybe a template (one of four), then the request's own tokens."""
    system = [(content_id("shared", 9_000 + k), int(rng.integers(1, most // 3))) for k in range(3)]
    template = [(content_id("fewshot", 9_000 + k), int(rng.integers(1, most // 3))) for k in range(4)]
    prompts = []
    for i in range(n):
        segs = [system[int(rng.integers(0, 3))]]
        if rng.random() < 0.6:
            segs.append(template[int(rng.integers(0, 4))])
        if rng.random() < 0.7:  # else the whole prompt is shared with others
            segs.append((content_id("message", 9_000 + i), int(rng.integers(1, most // 3))))
        prompts.append(Prompt(tuple(segs)))
    return PromptSet.from_prompts(prompts)


def _random_case(seed: int) -> tuple[ArrivalPlan, ReplayConfig]:
    rng = np.random.default_rng(100 + seed)
    B = int(rng.choice([1, 4, 16]))
    nb = int(rng.integers(24, 120))
    budget = int(rng.choice([16, 64, 256]))
    seqs = min(budget, int(rng.integers(2, 12)))
    M = (nb - 1) * B
    n = 60
    prompts = _random_prompts(rng, n, max(6, M // 2))
    s = prompts.lengths()
    o = np.array([int(rng.integers(1, max(2, M - int(x)))) for x in s], dtype=np.int64)
    slot = np.sort(rng.integers(0, 150, n)).astype(np.int64)
    plan = ArrivalPlan(slot, s, o, prompts=prompts)
    cfg = ReplayConfig(num_blocks=nb, block_size=B, max_num_batched_tokens=budget, max_num_seqs=seqs,
                       enable_prefix_caching=True)
    return plan, cfg


@pytest.mark.parametrize("seed", range(4))
def test_random_small_servers_with_shared_prefixes_match_step_for_step(seed: int) -> None:
    """Cases no test names: small pools (eviction and preemption all the time), block sizes 1 to
    16, tiny budgets, prompts drawn from a few shared segments, whole prompts shared too."""
    plan, cfg = _random_case(seed)
    real = assert_same_with_caching(plan, cfg, 1_000)
    assert real.completed.sum() > 0


def test_the_random_cases_exercise_every_mechanism() -> None:
    """The random cases above check something only if hits, preemptions and evictions occur in them."""
    hits = preempted = evicted = 0
    for seed in range(4):
        plan, cfg = _random_case(seed)
        eng = VllmEngine(SCHEDULER, cfg.params())
        assert eng.cache is not None
        eng.cache.kv.pool._record = True  # count the evictions
        eng.run(plan, 1_000)
        hits += sum(1 for r in eng.requests if r.cached > 0)
        preempted += sum(r.preemptions for r in eng.requests)
        evicted += len(eng.cache.kv.pool.take_evicted())
    assert hits > 20 and preempted > 5 and evicted > 20, (hits, preempted, evicted)
