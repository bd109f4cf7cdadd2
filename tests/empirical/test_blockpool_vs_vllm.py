"""Differential test: :mod:`kvstab.blocks` against vLLM 0.33.0's own ``BlockPool`` and
``KVCacheManager``, built on the CPU with no model, driven by the same random operations.

After every operation both sides must agree on everything observable: the cache hit
(blocks and tokens), the blocks each allocation returns (or its refusal), every request's
block table, the free count and usage, the free queue in eviction order, each block's
reference count, which hashes are cached in which blocks, and the hashes evicted.

Needs the vLLM extra (``scripts/install-vllm.sh``).  Without it these tests skip with the
reason — unless ``KVSTAB_REQUIRE_VLLM=1``, when a missing vLLM is a failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvstab.blocks import NULL_BLOCK, BlockPool, CacheHit, KVCacheManager, PoolConfig
from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module", autouse=True)
def vllm() -> SimpleNamespace:
    """vLLM 0.33.0, or a skip (a failure under ``KVSTAB_REQUIRE_VLLM=1``)."""
    try:
        v = load_vllm()
    except VllmUnavailable as exc:
        if os.environ.get("KVSTAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVSTAB_REQUIRE_VLLM=1 but {exc}", pytrace=False)
        pytest.skip(f"{exc} (KVSTAB_REQUIRE_VLLM=1 turns this skip into a failure)")
    return v


def _vllm_parts() -> SimpleNamespace:
    """The vLLM classes this test drives (imported only once vLLM is known to be there)."""
    from vllm.distributed.kv_events import BlockRemoved
    from vllm.v1.core.block_pool import BlockPool as VBlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VKVCacheManager
    from vllm.v1.core.kv_cache_utils import get_block_hash, make_block_hash_with_group_id
    from vllm.v1.request import RequestStatus

    return SimpleNamespace(
        BlockRemoved=BlockRemoved,
        BlockPool=VBlockPool,
        KVCacheManager=VKVCacheManager,
        get_block_hash=get_block_hash,
        make_key=make_block_hash_with_group_id,
        RequestStatus=RequestStatus,
    )


def _pool_state(ours: BlockPool, theirs: Any, hash_of: dict[bytes, int]) -> None:
    """Assert both pools hold the same state (hashes of vLLM mapped through ``hash_of``)."""
    p = _vllm_parts()
    assert ours.num_free_blocks == theirs.get_num_free_blocks()
    assert ours.usage == pytest.approx(theirs.get_usage(), abs=0.0)
    assert ours.free_queue() == tuple(b.block_id for b in theirs.free_block_queue.get_all_free_blocks())
    for blk in theirs.blocks:
        if blk.block_id == NULL_BLOCK:
            assert blk.is_null
            continue
        assert ours.ref_count(blk.block_id) == blk.ref_cnt, f"block {blk.block_id}"
        mine = ours.block_hash(blk.block_id)
        theirs_hash = None if blk.block_hash is None else hash_of[p.get_block_hash(blk.block_hash)]
        assert mine == theirs_hash, f"block {blk.block_id}"
    cache = theirs.cached_block_hash_to_block._cache
    mapped: dict[int, tuple[int, ...]] = {}
    for key, val in cache.items():
        ids = (val.block_id,) if hasattr(val, "block_id") else tuple(val)
        mapped[hash_of[p.get_block_hash(key)]] = ids
    assert ours.cached() == mapped


# ---------------------------------------------------------------------------------------
# The KV manager, driven as vLLM's scheduler drives it
# ---------------------------------------------------------------------------------------


@dataclass
class _Req:
    """One request on both sides: vLLM's ``Request`` and kvstab's view of it."""

    rid: str
    vreq: Any
    computed: int = 0
    running: bool = False
    hashes: list[int] = field(default_factory=list)


class _World:
    """kvstab's manager and vLLM's, fed the same operations; hashes interned so that equal
    prefixes (and only those) get equal kvstab hashes."""

    def __init__(self, v: SimpleNamespace, cfg: PoolConfig) -> None:
        p = _vllm_parts()
        self.v, self.p, self.cfg = v, p, cfg
        B = cfg.block_size
        spec = v.FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=8, dtype=v.torch.float16)
        kv = v.KVCacheConfig(
            num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=[v.KVCacheGroupSpec(["l0"], spec)]
        )
        self.theirs = p.KVCacheManager(
            kv,
            max_model_len=1 << 20,
            scheduler_block_size=B,
            hash_block_size=B,
            enable_caching=cfg.enable_caching,
            enable_kv_cache_events=True,
        )
        self.ours = KVCacheManager(cfg, record_evictions=True)
        self.hasher = v.get_request_block_hasher(B, v.sha256)
        self.intern: dict[tuple[int, tuple[int, ...]], int] = {}
        self.hash_of: dict[bytes, int] = {}
        self.reqs: dict[str, _Req] = {}
        self.arrived = 0
        self.evicted = 0  # hashes evicted so far (both sides agree, see check)
        self.shared = 0  # allocations that adopted a cache hit
        self.refused = 0  # allocations refused

    # kvstab's chained hashes, from the same tokens vLLM hashes
    def _sync_hashes(self, r: _Req) -> None:
        B = self.cfg.block_size
        toks = r.vreq.all_token_ids
        while len(r.hashes) < len(toks) // B:
            i = len(r.hashes)
            parent = r.hashes[-1] if r.hashes else 0
            h = self.intern.setdefault((parent, tuple(toks[i * B : (i + 1) * B])), len(self.intern) + 1)
            r.hashes.append(h)
        assert len(r.hashes) == len(r.vreq.block_hashes)
        for vb, h in zip(r.vreq.block_hashes, r.hashes):
            assert self.hash_of.setdefault(vb, h) == h, "vLLM's hash is not a function of the prefix"

    def arrive(self, tokens: list[int]) -> None:
        rid = str(self.arrived)
        self.arrived += 1
        vreq = self.v.Request(
            rid, tokens, self.v.SamplingParams(max_tokens=1 << 16, ignore_eos=True), None,
            arrival_time=0.0, block_hasher=self.hasher,
        )
        r = _Req(rid, vreq)
        self._sync_hashes(r)
        self.reqs[rid] = r

    def _advance(self, r: _Req, n: int, token: int) -> None:
        r.computed += n
        r.vreq.num_computed_tokens = r.computed
        if r.computed == r.vreq.num_tokens:  # the step sampled a token
            r.vreq.append_output_token_ids(token)
            self._sync_hashes(r)

    def admit(self, r: _Req, chunk: int, must_fit: bool, token: int) -> None:
        """A waiting (new or preempted) request: look up the cache, then allocate."""
        vblocks, vhit, _ = self.theirs.get_computed_blocks(r.vreq)
        hit = self.ours.get_computed_blocks(r.hashes, r.vreq.num_tokens)
        assert hit == CacheHit(tuple(vblocks.get_block_ids()[0]) if vhit else (), vhit)
        n = min(chunk, r.vreq.num_tokens - hit.num_tokens)
        got = self.theirs.allocate_slots(
            r.vreq, n, num_new_computed_tokens=vhit, new_computed_blocks=vblocks, full_sequence_must_fit=must_fit
        )
        mine = self.ours.allocate_slots(
            r.rid, block_hashes=r.hashes, num_tokens=r.vreq.num_tokens, num_computed_tokens=0,
            num_new_tokens=n, hit=hit, full_sequence_must_fit=must_fit,
        )
        assert mine == (None if got is None else tuple(got.get_block_ids()[0]))
        self.refused += got is None
        self.shared += got is not None and bool(hit.blocks)
        if got is not None:
            r.running = True
            r.vreq.status = self.p.RequestStatus.RUNNING
            r.computed = hit.num_tokens
            self._advance(r, n, token)

    def step(self, r: _Req, chunk: int, token: int) -> None:
        """A running request's next chunk or decode token."""
        n = min(chunk, r.vreq.num_tokens - r.computed)
        got = self.theirs.allocate_slots(r.vreq, n)
        mine = self.ours.allocate_slots(
            r.rid, block_hashes=r.hashes, num_tokens=r.vreq.num_tokens, num_computed_tokens=r.computed, num_new_tokens=n
        )
        assert mine == (None if got is None else tuple(got.get_block_ids()[0]))
        self.refused += got is None
        if got is not None:
            self._advance(r, n, token)

    def release(self, r: _Req, finish: bool) -> None:
        """Finish, or preempt (recompute: computed tokens lost, outputs kept)."""
        self.theirs.free(r.vreq)
        self.ours.free(r.rid)
        r.running = False
        r.computed = 0
        r.vreq.num_computed_tokens = 0
        r.vreq.status = self.p.RequestStatus.PREEMPTED
        if finish:
            del self.reqs[r.rid]

    def check(self) -> None:
        _pool_state(self.ours.pool, self.theirs.block_pool, self.hash_of)
        for r in self.reqs.values():
            assert self.ours.get_blocks(r.rid) == tuple(self.theirs.get_block_ids(r.rid)[0])
        # events carry the hash as bytes, or as its low 64 bits (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
        as_int = {int.from_bytes(b, "big") & ((1 << 64) - 1): h for b, h in self.hash_of.items()}
        removed = [
            as_int[h] if isinstance(h, int) else self.hash_of[h]
            for e in self.theirs.take_events()
            if isinstance(e, self.p.BlockRemoved)
            for h in e.block_hashes
        ]
        assert list(self.ours.pool.take_evicted()) == removed
        self.evicted += len(removed)


@st.composite
def _prompts(draw: st.DrawFn, families: list[list[int]], max_len: int) -> list[int]:
    """A prompt sharing a prefix of one of a few families, then tokens of its own."""
    fam = draw(st.sampled_from(families))
    k = draw(st.integers(0, len(fam)))
    own = draw(st.lists(st.integers(1, 3), min_size=0 if k else 1, max_size=max_len - k))
    return (fam[:k] + own) or [1]


@SETTINGS
@given(data=st.data())
def test_manager_matches_vllm_after_every_operation(vllm: SimpleNamespace, data: st.DataObject) -> None:
    B = data.draw(st.sampled_from([1, 2, 4]), label="block_size")
    nb = data.draw(st.integers(3, 14), label="num_blocks")
    caching = data.draw(st.sampled_from([True, True, True, False]), label="enable_caching")
    cfg = PoolConfig(num_blocks=nb, block_size=B, enable_caching=caching)
    w = _World(vllm, cfg)
    max_len = (nb - 1) * B
    families = [data.draw(st.lists(st.integers(1, 3), min_size=max_len, max_size=max_len)) for _ in range(2)]
    w.check()
    for _ in range(data.draw(st.integers(1, 60), label="operations")):
        waiting = [r for r in w.reqs.values() if not r.running]
        running = [r for r in w.reqs.values() if r.running]
        ops = ["arrive"] + ["admit"] * bool(waiting) + ["step", "preempt", "finish"] * bool(running)
        op = data.draw(st.sampled_from(ops))
        token = data.draw(st.integers(1, 3))
        if op == "arrive":
            w.arrive(data.draw(_prompts(families, max_len)))
        elif op == "admit":
            r = data.draw(st.sampled_from(waiting))
            if r.vreq.num_tokens > max_len:
                continue
            w.admit(r, data.draw(st.integers(1, 2 * max_len)), data.draw(st.booleans()), token)
        elif op == "step":
            r = data.draw(st.sampled_from(running))
            if r.vreq.num_tokens >= max_len:  # would outgrow the pool: preempt or finish it instead
                continue
            w.step(r, data.draw(st.integers(1, 2 * max_len)), token)
        else:
            w.release(data.draw(st.sampled_from(running)), finish=op == "finish")
        w.check()
    # what the run met (pytest --hypothesis-show-statistics)
    event(f"evictions: {'some' if w.evicted else 'none'}")
    event(f"shared blocks: {'some' if w.shared else 'none'}")
    event(f"refusals: {'some' if w.refused else 'none'}")


def test_the_manager_test_meets_eviction_hits_and_refusals(vllm: SimpleNamespace) -> None:
    # a fixed scenario: the random test above is only a check if these things happen in it
    w = _World(vllm, PoolConfig(num_blocks=6, block_size=2))
    w.arrive([1, 2, 3, 4, 5])
    a = w.reqs["0"]
    w.admit(a, 10, True, 9)  # 3 blocks, two cached; one output token
    w.check()
    w.release(a, finish=False)  # preempted: its blocks are free but still cached
    w.check()
    w.admit(a, 10, True, 9)  # resumed: finds its own two cached blocks
    w.check()
    assert w.ours.get_blocks("0")[:2] == (1, 2)
    w.arrive([1, 2, 3, 4, 7, 7, 7])
    b = w.reqs["1"]
    w.admit(b, 10, True, 8)  # shares two blocks with a
    w.check()
    assert w.ours.pool.ref_count(1) == 2
    w.release(a, finish=True)
    w.release(b, finish=True)
    w.check()
    w.arrive([3, 3, 3, 3, 3, 3, 3, 3])  # needs four blocks: evicts cached ones
    w.admit(w.reqs["2"], 20, True, 1)
    w.check()
    assert w.ours.pool.num_free_blocks == 1 and w.evicted > 0
    w.arrive([1, 2, 3, 4, 5])
    w.admit(w.reqs["3"], 20, True, 1)  # full_sequence_must_fit refuses
    w.check()
    assert not w.reqs["3"].running


# ---------------------------------------------------------------------------------------
# The pool alone: any free order, touches of cached free blocks, caching by hand
# ---------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_pool_matches_vllm_for_any_free_order(vllm: SimpleNamespace, data: st.DataObject) -> None:
    p = _vllm_parts()
    nb = data.draw(st.integers(2, 12), label="num_blocks")
    caching = data.draw(st.booleans(), label="enable_caching")
    ours = BlockPool(PoolConfig(num_blocks=nb, block_size=1, enable_caching=caching))
    theirs = p.BlockPool(num_gpu_blocks=nb, enable_caching=caching, hash_block_size=1)
    hash_of = {i.to_bytes(8, "big"): i for i in range(1, 64)}
    held: list[int] = []  # one entry per reference
    for _ in range(data.draw(st.integers(1, 50), label="operations")):
        op = data.draw(st.sampled_from(["get", "free", "touch", "cache"]))
        if op == "get":
            n = data.draw(st.integers(0, ours.num_free_blocks))
            got = ours.get_new_blocks(n)
            assert got == [b.block_id for b in theirs.get_new_blocks(n)]
            held += got
        elif op == "free" and held:
            picked = data.draw(st.lists(st.sampled_from(range(len(held))), unique=True, min_size=1))
            blocks = [held[i] for i in picked]
            for i in sorted(picked, reverse=True):
                del held[i]
            ours.free_blocks(blocks)
            theirs.free_blocks([theirs.blocks[b] for b in blocks])
        elif op == "touch" and caching:
            chain = data.draw(st.lists(st.integers(1, 63), max_size=4))
            hit = ours.find_longest_cache_hit(chain, len(chain))
            vhit = []
            for h in chain:
                got = theirs.get_cached_block(h.to_bytes(8, "big"), [0])
                if not got:
                    break
                vhit.append(got[0])
            assert hit == [b.block_id for b in vhit]
            ours.touch(hit)
            theirs.touch(vhit)
            held += hit
        elif op == "cache" and caching and held:
            blocks = data.draw(st.lists(st.sampled_from(held), unique=True, min_size=1, max_size=4))
            blocks = [b for b in blocks if ours.block_hash(b) is None]
            hashes = data.draw(st.lists(st.integers(1, 63), min_size=len(blocks), max_size=len(blocks)))
            ours.cache_full_blocks(blocks, hashes, 0, len(blocks))
            req = SimpleNamespace(block_hashes=[h.to_bytes(8, "big") for h in hashes])
            theirs.cache_full_blocks(req, [theirs.blocks[b] for b in blocks], 0, len(blocks), 1, 0)
        _pool_state(ours, theirs, hash_of)
