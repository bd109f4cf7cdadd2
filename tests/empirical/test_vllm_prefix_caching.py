"""vLLM 0.33's own scheduler with automatic prefix caching on, fed the plan's real prefixes.

The oracle the prefix-caching model will be checked against step for step
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

from kvstab.arrivals import poisson_arrivals
from kvstab.empirical.replay import replay_vllm
from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
from kvstab.model import ModelParams
from kvstab.steplog import ReplayConfig, StepLog
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
