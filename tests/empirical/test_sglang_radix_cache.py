"""SGLang 0.5.23's radix cache: kvstab's tree and model against SGLang's own, step for step.

Two layers (``docs/MODEL.md``, "SGLang with its radix cache"):

* the tree (:mod:`kvstab.radix_cache`) against SGLang's ``UnifiedRadixCache`` with the
  cache on: random inserts, capped matches, locks, unlocks and evictions give the same hit
  lengths, the same duplicates, the same evicted tokens and the same evictable, locked and
  total sizes after every operation;
* the model (:mod:`kvstab.lifecycles.sglang_radix`) against SGLang's own scheduler with
  ``disable_radix_cache=False`` (:mod:`kvstab.empirical.sglang_driver`), both fed the same
  real token ids built from the plan's prefix structure: every step field and every
  request's outcome agree on shared prompts, tenants, multi-turn chat, Mooncake hash
  chains, a flooded queue past the 128 that LPM matches, and pools small enough that
  eviction and retraction happen.

Skipped without SGLang unless ``KVSTAB_REQUIRE_SGLANG=1``.
"""

from __future__ import annotations

import os
import random
from array import array

import numpy as np
import pytest

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.data import trace_path
from kvstab.empirical.sglang_driver import SglangUnavailable, load_sglang, replay_sglang
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang_radix import replay_radix
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, PromptSet, content_id
from kvstab.radix_cache import RadixCache
from kvstab.schedulers.sglang import Sglang
from kvstab.steplog import SglangModelLog
from kvstab.traces import load_trace
from kvstab.workload import parse_workload


@pytest.fixture(scope="module", autouse=True)
def sglang() -> None:
    """SGLang 0.5.23, or a skip (a failure under ``KVSTAB_REQUIRE_SGLANG=1``)."""
    try:
        load_sglang()
    except SglangUnavailable as exc:
        if os.environ.get("KVSTAB_REQUIRE_SGLANG") == "1":
            pytest.fail(f"KVSTAB_REQUIRE_SGLANG=1 but {exc}", pytrace=False)
        pytest.skip(f"{exc} (KVSTAB_REQUIRE_SGLANG=1 turns this skip into a failure)")


def _server(M: int, chunk: int, **kw: int) -> ModelParams:
    return ModelParams(M=M, chunk=chunk, block=1, bbar=1.0, prefix_caching=True, **kw)  # type: ignore[arg-type]


def assert_same(plan: ArrivalPlan, rule: Sglang, params: ModelParams) -> SglangModelLog:
    """Both replays to the end; the model's log equals SGLang's. SGLang's log is returned."""
    real = replay_sglang(plan, rule, params)
    model = replay_radix(plan, rule, params)
    diff = model.first_difference(real)
    assert diff is None, diff
    return real


def _evicted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count what the model's tree evicts (a case must exercise eviction to be worth its time)."""
    total = [0]
    real = RadixCache.evict

    def counted(self: RadixCache, tokens: int) -> int:
        freed = real(self, tokens)
        total[0] += freed
        return freed

    monkeypatch.setattr(RadixCache, "evict", counted)
    return total


@pytest.mark.parametrize("page", [1, 2])
def test_the_tree_is_sglangs_operation_for_operation(page: int) -> None:
    """Random operations over a three-letter alphabet (prefixes collide at every depth)."""
    g = load_sglang()
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    g.runtime_context.publish(g.ServerArgs(model_path="dummy", device="cpu", page_size=page), role="scheduler")
    for seed in range(4):
        rng = random.Random(seed)
        M = 4000
        pool = g.ReqToTokenPool(4, 64, "cpu", False)
        if page == 1:
            alloc = g.TokenToKVPoolAllocator(M, g.torch.int64, "cpu", None, False)
        else:
            alloc = g.PagedTokenToKVPoolAllocator(M, page, g.torch.int64, "cpu", None, False)
        params = g.CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                   page_size=page)
        params.tree_components = (g.ComponentType.FULL,)
        real = g.UnifiedRadixCache(params)
        mine = RadixCache(page)
        locks: list[tuple[object, object]] = []
        for op in range(250):
            toks = [rng.randint(1, 3) for _ in range(rng.randint(0, 14))]
            u = rng.random()
            where = f"seed {seed}, operation {op}"
            if u < 0.4:
                n = len(toks) // page * page
                values = alloc.alloc(n) if n else g.torch.empty((0,), dtype=g.torch.int64)
                got = real.insert(InsertParams(key=RadixKey(token_ids=array("q", toks)), value=values))
                assert mine.insert(toks)[0] == got.prefix_len, where
            elif u < 0.7:
                limit = max(len(toks) - 1, 0)
                got = real.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=array("q", toks), limit=limit)))
                m = mine.match(toks, limit)
                assert m.length == got.device_prefix_len, where
                if rng.random() < 0.5:
                    locks.append((real.lock(got.last_device_node), m.node))
                    mine.lock(m.node)
            elif u < 0.85 and locks:
                a, b = locks.pop(rng.randrange(len(locks)))
                real.unlock(a)
                mine.unlock(b)  # type: ignore[arg-type]
            else:
                n = rng.randint(1, 10)
                assert mine.evict(n) == real.evict(EvictParams(num_tokens=n)).num_tokens_evicted, where
            assert (mine.evictable_size, mine.protected_size) == (real.evictable_size(), real.protected_size()), where
            # the allocator's count is the tree's: an insert's duplicates were freed, evictions freed
            assert M - alloc.available_size() == mine.total_size, where


def test_a_shared_system_prompt_under_lpm_and_fcfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """One 64-token system prompt on a pool that evicts, under both policies: the prompt is computed
    far fewer times than it is sent (prefills start past the hit)."""
    evicted = _evicted(monkeypatch)
    plan = poisson_arrivals(parse_workload("s=const(100),o=const(8),prefix=shared(64)"), 2.0, _server(600, 64), 60,
                            seed=1)
    lpm = assert_same(plan, Sglang(), _server(600, 64))
    fcfs = assert_same(plan, Sglang(schedule_policy="fcfs"), _server(600, 64))
    assert evicted[0] > 0
    for log in (lpm, fcfs):
        assert sum(st.prefill_tokens for st in log.steps) < sum(log.s) - 30 * len(log.s)


def test_tenants_and_chat_with_retraction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Zipf tenants and multi-turn conversations (a turn's prompt holds the last answer) at a low
    starting ratio: SGLang retracts, and the victim matches its own published prompt again."""
    evicted = _evicted(monkeypatch)
    params = _server(500, 64)
    rule = Sglang(init_new_token_ratio=0.1)
    tenants = poisson_arrivals(parse_workload("s=uniform(40,120),o=uniform(10,60),prefix=tenants(3,32,1.0)"), 1.0,
                               params, 40, seed=3)
    real = assert_same(tenants, rule, params)
    chat = poisson_arrivals(parse_workload("s=uniform(10,40),o=uniform(5,40),prefix=chat(4,2)"), 1.5, params, 40,
                            seed=4)
    real_chat = assert_same(chat, rule, params)
    assert sum(real.retractions) + sum(real_chat.retractions) > 0 and evicted[0] > 0


def test_a_mooncake_hash_chain_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Mooncake conversation trace, its hash_ids as content, lengths scaled by 1/8 (a 512-token
    block becomes 64 tokens) and outputs by 1/4, two requests a step, on a pool that evicts and retracts."""
    evicted = _evicted(monkeypatch)
    trace = load_trace(trace_path("mooncake-conversation"))
    assert trace.prompts is not None
    keep = np.flatnonzero(trace.s + trace.o <= 4_000)[:60]
    p = trace.prompts.take(keep)
    scaled = PromptSet(p.offsets, p.content, np.maximum(1, p.length // 8), p.output)
    plan = ArrivalPlan(np.arange(keep.size, dtype=np.int64) // 2, scaled.lengths(),
                       np.maximum(1, trace.o[keep] // 4), prompts=scaled)
    assert_same(plan, Sglang(), _server(1_000, 128))
    assert evicted[0] > 0


def test_a_flooded_queue_past_lpms_128_with_a_row_cap() -> None:
    """135 requests at once from a small library of segments: LPM matches nobody past 128 waiting
    (FCFS, with SGLang's periodic refresh of the waiting prefixes), then sorts once the queue is shorter."""
    rng = np.random.default_rng(5)
    n = 135
    prompts = []
    for i in range(n):
        segs = [(content_id("tenant", int(rng.integers(3))), int(rng.integers(20, 60)))]
        if rng.random() < 0.6:
            segs.append((content_id("fewshot", int(rng.integers(4))), int(rng.integers(5, 40))))
        segs.append((content_id("own", i), int(rng.integers(1, 30))))
        prompts.append(Prompt(tuple(segs)))
    ps = PromptSet.from_prompts(prompts)
    plan = ArrivalPlan(np.zeros(n, dtype=np.int64), ps.lengths(), rng.integers(1, 10, n), prompts=ps)
    assert_same(plan, Sglang(max_prefill_tokens=100), _server(1_500, 64, max_num_seqs=16))


def test_the_no_cache_engines_refuse_caching_and_the_replay_names_the_radix_model() -> None:
    """With caching on, the sglang replay runs the radix-cache model on the reference engine and says
    so; the compiled engine is never run with the cache silently off."""
    plan = poisson_arrivals(parse_workload("s=const(40),o=const(4),prefix=shared(32)"), 1.0, _server(400, 32), 10,
                            seed=2)
    log = replay_sglang_model(plan, Sglang(), _server(400, 32))
    assert log.engine == "reference (radix cache)"
    with pytest.raises(InvalidArgument, match="radix"):
        replay_sglang_model(plan, Sglang(), _server(400, 32), engine="fast")
