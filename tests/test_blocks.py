"""Unit tests of :mod:`kvstab.blocks`, the vLLM 0.33 block pool with prefix caching.

No vLLM needed: each test states one rule of ``docs/MODEL.md`` ("Prefix caching
(vLLM 0.33)") on a pool small enough to read.  The same pool is checked against
vLLM's own in ``tests/empirical/test_blockpool_vs_vllm.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.blocks import NO_HIT, NULL_BLOCK, BlockPool, CacheHit, KVCacheManager, PoolConfig
from kvstab.errors import InvalidArgument


def test_config_is_frozen_and_validated() -> None:
    cfg = PoolConfig(num_blocks=8, block_size=4)
    assert cfg.enable_caching and cfg.usable_blocks == 7
    with pytest.raises(AttributeError):
        cfg.num_blocks = 9  # type: ignore[misc]
    for bad in ({"num_blocks": 1, "block_size": 4}, {"num_blocks": 8, "block_size": 0},
                {"num_blocks": 8, "block_size": 4, "enable_caching": 1}):
        with pytest.raises(InvalidArgument):
            PoolConfig(**bad)  # type: ignore[arg-type]


def test_a_fresh_pool_reserves_the_null_block() -> None:
    pool = BlockPool(PoolConfig(num_blocks=5, block_size=2))
    assert pool.free_queue() == (1, 2, 3, 4)
    assert pool.num_free_blocks == 4 and pool.usage == 0.0
    assert pool.get_new_blocks(2) == [1, 2]
    assert pool.usage == pytest.approx(0.5)
    pool.free_blocks([NULL_BLOCK])  # ignored, as vLLM does
    assert pool.num_free_blocks == 2


def test_freed_uncached_blocks_go_to_the_head_cached_ones_to_the_tail() -> None:
    pool = BlockPool(PoolConfig(num_blocks=7, block_size=1))
    a = pool.get_new_blocks(3)  # 1, 2, 3
    pool.cache_full_blocks(a, [10, 11], 0, 2)  # 1 and 2 full and cached, 3 not
    pool.free_blocks(reversed(a))  # what KVCacheManager.free does
    # 3 (no hash) is reused first; 2 then 1 are evicted last, the tail of the chain first
    assert pool.free_queue() == (3, 4, 5, 6, 2, 1)


def test_with_caching_off_every_freed_block_goes_to_the_head() -> None:
    pool = BlockPool(PoolConfig(num_blocks=5, block_size=1, enable_caching=False))
    a = pool.get_new_blocks(2)
    pool.free_blocks(a)
    assert pool.free_queue() == (1, 2, 3, 4)


def test_allocation_evicts_lru_only_when_it_takes_a_cached_block() -> None:
    pool = BlockPool(PoolConfig(num_blocks=4, block_size=1), record_evictions=True)
    a = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, [7, 8, 9], 0, 3)
    pool.free_blocks(reversed(a))
    assert pool.free_queue() == (3, 2, 1)
    assert pool.cached() == {7: (1,), 8: (2,), 9: (3,)}
    assert pool.get_new_blocks(1) == [3]  # the head: the chain's last block
    assert pool.take_evicted() == (9,) and pool.take_evicted() == ()
    assert pool.cached() == {7: (1,), 8: (2,)}
    assert pool.block_hash(3) is None and pool.ref_count(3) == 1


def test_touch_takes_a_free_cached_block_back_and_shares_a_held_one() -> None:
    pool = BlockPool(PoolConfig(num_blocks=4, block_size=1))
    a = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [5, 6], 0, 2)
    pool.touch([a[0]])  # a second request shares block 1
    assert pool.ref_count(a[0]) == 2 and pool.num_free_blocks == 1  # counted once
    pool.free_blocks(reversed(a))
    assert pool.free_queue() == (3, 2)  # block 1 still held
    pool.touch([2])  # a hit on a free cached block takes it out of the queue
    assert pool.free_queue() == (3,) and pool.ref_count(2) == 1


def test_duplicates_are_cached_side_by_side_and_the_oldest_is_found() -> None:
    pool = BlockPool(PoolConfig(num_blocks=4, block_size=1))
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [5], 0, 1)
    pool.cache_full_blocks(b, [5], 0, 1)
    assert pool.cached() == {5: (1, 2)}
    assert pool.get_cached_block(5) == 1
    pool.free_blocks(a)
    pool.get_new_blocks(2)  # 3, then 1 (evicting one copy)
    assert pool.cached() == {5: (2,)} and pool.get_cached_block(5) == 2


def test_longest_hit_stops_at_the_first_miss_and_at_the_cap() -> None:
    pool = BlockPool(PoolConfig(num_blocks=6, block_size=2))
    a = pool.get_new_blocks(3)
    pool.cache_full_blocks(a, [1, 2, 3], 0, 3)
    assert pool.find_longest_cache_hit([1, 2, 3], 6) == a
    assert pool.find_longest_cache_hit([1, 2, 3], 5) == a[:2]  # whole blocks within 5 tokens
    assert pool.find_longest_cache_hit([1, 9, 3], 6) == a[:1]
    assert pool.find_longest_cache_hit([9, 2, 3], 6) == []


def test_full_prompt_hit_recomputes_its_last_token_rounded_to_a_block() -> None:
    m = KVCacheManager(PoolConfig(num_blocks=8, block_size=4))
    m.allocate_slots("a", block_hashes=(1, 2), num_tokens=8, num_computed_tokens=0, num_new_tokens=8)
    # 8 tokens, both blocks cached: the hit is capped at 7 tokens, i.e. one block
    assert m.get_computed_blocks((1, 2), 8) == CacheHit((1,), 4)
    # 9 tokens (8 cached + 1 more): both blocks hit, one token to compute
    assert m.get_computed_blocks((1, 2), 9) == CacheHit((1, 2), 8)
    assert m.get_computed_blocks((1, 2), 0) == NO_HIT


def test_blocks_are_cached_when_scheduled_and_only_when_full() -> None:
    m = KVCacheManager(PoolConfig(num_blocks=8, block_size=4))
    new = m.allocate_slots("a", block_hashes=(1, 2), num_tokens=10, num_computed_tokens=0, num_new_tokens=6)
    assert new == (1, 2)
    assert m.pool.cached() == {1: (1,)}  # 6 tokens scheduled: one full block
    m.allocate_slots("a", block_hashes=(1, 2), num_tokens=10, num_computed_tokens=6, num_new_tokens=4)
    assert m.pool.cached() == {1: (1,), 2: (2,)}
    assert m.get_blocks("a") == (1, 2, 3)  # block 3 holds tokens 9-10, not full: no hash
    assert m.pool.block_hash(3) is None


def test_a_hit_is_shared_and_counted_once() -> None:
    m = KVCacheManager(PoolConfig(num_blocks=8, block_size=2))
    m.allocate_slots("a", block_hashes=(1, 2), num_tokens=5, num_computed_tokens=0, num_new_tokens=5)
    hit = m.get_computed_blocks((1, 2, 3), 7)
    assert hit == CacheHit((1, 2), 4)
    assert m.num_blocks_to_allocate("b", 7, hit.blocks) == 2  # two blocks beyond the hit
    new = m.allocate_slots("b", block_hashes=(1, 2, 3), num_tokens=7, num_computed_tokens=0, num_new_tokens=3, hit=hit)
    assert m.get_blocks("b") == (1, 2, *new)
    assert m.pool.ref_count(1) == 2 and m.pool.num_used_blocks == 5  # 3 + 2, shared blocks once


def test_admission_counts_free_cached_hit_blocks_as_blocks_to_take() -> None:
    m = KVCacheManager(PoolConfig(num_blocks=5, block_size=2))
    m.allocate_slots("a", block_hashes=(1, 2), num_tokens=4, num_computed_tokens=0, num_new_tokens=4)
    m.free("a")  # blocks 1, 2 free but cached
    assert m.num_free_blocks == 4
    hit = m.get_computed_blocks((1, 2, 3, 4), 9)
    assert hit.blocks == (1, 2)
    # 9 tokens = 5 blocks: 3 beyond the hit + the 2 hit blocks it takes from the free queue
    assert m.num_blocks_to_allocate("b", 9, hit.blocks) == 5
    assert m.allocate_slots("b", block_hashes=(1, 2, 3, 4), num_tokens=9, num_computed_tokens=0,
                            num_new_tokens=1, hit=hit, full_sequence_must_fit=True) is None
    assert m.num_free_blocks == 4 and m.get_blocks("b") == ()  # a refusal changes nothing
    # without the full-sequence test only this chunk's slots must fit
    assert m.allocate_slots("b", block_hashes=(1, 2, 3, 4), num_tokens=9, num_computed_tokens=0,
                            num_new_tokens=1, hit=hit) == (3,)


def test_a_preempted_request_finds_its_own_blocks_unless_evicted() -> None:
    m = KVCacheManager(PoolConfig(num_blocks=6, block_size=2))
    hashes = (1, 2, 3)
    m.allocate_slots("a", block_hashes=hashes, num_tokens=7, num_computed_tokens=0, num_new_tokens=7)
    m.free("a")  # preempted
    assert m.get_computed_blocks(hashes, 7) == CacheHit((1, 2, 3), 6)
    m.allocate_slots("x", block_hashes=(), num_tokens=4, num_computed_tokens=0, num_new_tokens=4)
    # a's uncached last block 4 went to the head, its cached 3, 2, 1 to the tail: 4 5 3 2 1
    assert m.get_blocks("x") == (4, 5)
    m.allocate_slots("y", block_hashes=(), num_tokens=2, num_computed_tokens=0, num_new_tokens=2)
    assert m.get_blocks("y") == (3,)  # the chain's last block is evicted first
    assert m.get_computed_blocks(hashes, 7) == CacheHit((1, 2), 4)


def test_running_requests_get_no_new_hit_and_bad_calls_are_refused() -> None:
    m = KVCacheManager(PoolConfig(num_blocks=6, block_size=2))
    m.allocate_slots("a", block_hashes=(1,), num_tokens=3, num_computed_tokens=0, num_new_tokens=3)
    with pytest.raises(InvalidArgument):
        m.allocate_slots("a", block_hashes=(1,), num_tokens=3, num_computed_tokens=3, num_new_tokens=1,
                         hit=CacheHit((1,), 2))
    with pytest.raises(InvalidArgument):
        m.allocate_slots("b", block_hashes=(), num_tokens=3, num_computed_tokens=0, num_new_tokens=0)
    with pytest.raises(InvalidArgument):  # a hash for a block that is not full
        m.allocate_slots("b", block_hashes=(1, 2), num_tokens=3, num_computed_tokens=0, num_new_tokens=3)
    with pytest.raises(InvalidArgument):
        m.pool.get_new_blocks(99)
    m.free("nobody")  # a request with no blocks: nothing to do


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_pool_conserves_blocks(data: st.DataObject) -> None:
    # every usable block is either free or held; a block is free iff no request holds it;
    # a cached hash always points at a block that carries it
    nb = data.draw(st.integers(2, 10))
    m = KVCacheManager(PoolConfig(num_blocks=nb, block_size=2))
    live: dict[str, tuple[int, ...]] = {}
    for step in range(data.draw(st.integers(1, 30))):
        if live and data.draw(st.booleans()):
            rid = data.draw(st.sampled_from(sorted(live)))
            m.free(rid)
            del live[rid]
        else:
            n = data.draw(st.integers(1, 2 * (nb - 1)))
            family = data.draw(st.integers(0, 2))
            hashes = tuple(100 * family + i for i in range(n // 2))
            hit = m.get_computed_blocks(hashes, n)
            rid = f"r{step}"
            if m.allocate_slots(rid, block_hashes=hashes, num_tokens=n, num_computed_tokens=0,
                                num_new_tokens=n - hit.num_tokens, hit=hit, full_sequence_must_fit=True) is not None:
                live[rid] = hashes
        pool = m.pool
        held = {b for rid in live for b in m.get_blocks(rid)}
        assert set(pool.free_queue()) | held == set(range(1, nb))
        assert not set(pool.free_queue()) & held
        for b in range(1, nb):
            assert pool.ref_count(b) == sum(m.get_blocks(rid).count(b) for rid in live)
        for h, blocks in pool.cached().items():
            assert all(pool.block_hash(b) == h for b in blocks)
        assert pool.num_used_blocks == len(held)
