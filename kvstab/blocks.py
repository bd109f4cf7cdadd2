"""vLLM 0.33's KV block pool with automatic prefix caching, as a pure-Python model.

Two layers, each mirroring vLLM 0.33.0 method by method (every docstring names
the file and line it follows; paths are under ``vllm/v1/core/``):

* :class:`BlockPool` — ``block_pool.py:137``: reference counts, the free queue
  in eviction order, the map from a full block's chained hash to the cached
  blocks, the null block.
* :class:`KVCacheManager` — ``kv_cache_manager.py:131`` with the unitary
  coordinator (``kv_cache_coordinator.py:530``) and the full-attention manager
  (``single_type_kv_cache_manager.py:739``) folded in: what a request finds in
  the cache, how many blocks a step needs, the admission test, freeing.

Hashes are given, not computed: a request's ``block_hashes`` is the sequence of
chained hashes of its *full* blocks so far (block ``i``'s hash identifies the
tokens of blocks ``0..i``, as vLLM's ``hash_block_tokens`` chains over the
parent, ``kv_cache_utils.py:707``).  Whoever builds them from workload content
must give equal hashes exactly to equal prefixes.

Only one KV cache group (full attention, ``hash_block_size == block_size``),
no KV connector, no speculative decoding, no sliding window, no watermark and
no ``max_model_len`` cap (a request never exceeds it): the configuration of
kvstab's vLLM cross-check.  ``docs/MODEL.md`` ("Prefix caching (vLLM 0.33)")
states every rule with its source line.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from kvstab.errors import InvalidArgument
from kvstab.validation import MAX_COUNT, MAX_TOKENS, as_int, nonneg_int, positive_int

__all__ = ["PoolConfig", "BlockPool", "CacheHit", "NO_HIT", "KVCacheManager", "NULL_BLOCK", "cdiv"]

#: The block id vLLM reserves as the null block (``block_pool.py:188``–``192``).
NULL_BLOCK = 0


def cdiv(a: int, b: int) -> int:
    """``⌈a / b⌉`` for non-negative ``a`` and positive ``b`` (vLLM's ``cdiv``)."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The KV pool's shape: what vLLM's ``BlockPool`` and ``KVCacheManager`` are built with."""

    num_blocks: int = field(
        metadata={"help": "blocks in the pool, the null block included (vLLM's num_gpu_blocks), >= 2"}
    )
    block_size: int = field(metadata={"help": "tokens per block (vLLM's block_size = hash_block_size), >= 1"})
    enable_caching: bool = field(default=True, metadata={"help": "automatic prefix caching on"})

    def __post_init__(self) -> None:
        as_int("num_blocks", self.num_blocks, minimum=2, maximum=MAX_COUNT)
        positive_int("block_size", self.block_size)
        if not isinstance(self.enable_caching, bool):
            raise InvalidArgument(f"enable_caching must be a bool, got {self.enable_caching!r}")

    @property
    def usable_blocks(self) -> int:
        """Blocks a request can hold: all but the null block (``block_pool.py:188``–``192``;
        ``get_usage`` divides by this, ``:929``)."""
        return self.num_blocks - 1


class BlockPool:
    """vLLM's ``BlockPool`` (``block_pool.py:137``) over integer block ids and hashes.

    State, all of it observable: each block's reference count and cached hash,
    the free queue (block ids, head = next evicted), and the hash → blocks map.
    Block :data:`NULL_BLOCK` is taken out of the free queue for good at
    construction and never counted, freed or cached.
    """

    def __init__(self, config: PoolConfig, *, record_evictions: bool = False) -> None:
        """Build the pool as ``BlockPool.__init__`` does (``block_pool.py:159``): every block
        free, in id order (``kv_cache_utils.py:281``), then block 0 popped as the null block
        (``block_pool.py:191``).  With ``record_evictions`` the hashes dropped by
        :meth:`get_new_blocks` are kept for :meth:`take_evicted`."""
        if not isinstance(config, PoolConfig):
            raise InvalidArgument(f"config must be a PoolConfig, got {config!r}")
        self.config = config
        n = config.num_blocks
        self._ref = [0] * n
        self._hash: list[int | None] = [None] * n
        # An ordered dict is the doubly linked free list of kv_cache_utils.py:258: O(1)
        # popleft, remove from the middle, append; prepend through move_to_end(last=False).
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, n))
        # hash -> blocks holding it, oldest insertion first: BlockHashToBlockMap
        # (block_pool.py:36) keeps duplicates and get_one_block returns the first (:63).
        self._cached: dict[int, dict[int, None]] = {}
        self._record = record_evictions
        self._evicted: list[int] = []

    # ---- reading the state -------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Free blocks, cached ones included: ``get_num_free_blocks`` (``block_pool.py:912``),
        the number vLLM's scheduler tests every allocation against."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one request; a block shared by several counts once: the
        ``num_gpu_blocks − get_num_free_blocks() − 1`` of ``reset_prefix_cache``
        (``block_pool.py:881``), the null block left out."""
        return self.config.usable_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """``get_usage`` (``block_pool.py:921``): ``1 − free / (num_blocks − 1)``."""
        return 1.0 - len(self._free) / self.config.usable_blocks

    def free_queue(self) -> tuple[int, ...]:
        """The free blocks in eviction order, head first
        (``FreeKVCacheBlockQueue.get_all_free_blocks``, ``kv_cache_utils.py:486``)."""
        return tuple(self._free)

    def ref_count(self, block: int) -> int:
        """Requests holding ``block`` (``KVCacheBlock.ref_cnt``, ``kv_cache_utils.py:168``)."""
        return self._ref[block]

    def block_hash(self, block: int) -> int | None:
        """The hash ``block`` is cached under, or ``None`` (``KVCacheBlock.block_hash``,
        ``kv_cache_utils.py:189``)."""
        return self._hash[block]

    def cached(self) -> dict[int, tuple[int, ...]]:
        """Every cached hash and the blocks holding it, oldest first
        (``cached_block_hash_to_block``, ``block_pool.py:185``)."""
        return {h: tuple(blocks) for h, blocks in self._cached.items()}

    def clone(self) -> BlockPool:
        """An independent copy of the pool's whole state (a trial run of one step works on it)."""
        twin = BlockPool.__new__(BlockPool)
        twin.config = self.config
        twin._ref = list(self._ref)
        twin._hash = list(self._hash)
        twin._free = self._free.copy()
        twin._cached = dict(self._cached)  # the inner maps are never changed in place (copy on write)
        twin._record = self._record
        twin._evicted = list(self._evicted)
        return twin

    def take_evicted(self) -> tuple[int, ...]:
        """The hashes evicted since the last call, in order, and forget them (the
        ``BlockRemoved`` events of ``take_events``, ``block_pool.py:934``).  Empty unless the
        pool was built with ``record_evictions``."""
        out = tuple(self._evicted)
        self._evicted.clear()
        return out

    # ---- the operations ----------------------------------------------------------------

    def get_cached_block(self, block_hash: int) -> int | None:
        """The first block cached under ``block_hash``, or ``None``: ``get_cached_block``
        (``block_pool.py:202``) through ``BlockHashToBlockMap.get_one_block`` (``:63``)."""
        blocks = self._cached.get(block_hash)
        return next(iter(blocks)) if blocks else None

    def cache_full_blocks(
        self, blocks: Sequence[int], block_hashes: Sequence[int], num_cached_blocks: int, num_full_blocks: int
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the matching entries of
        ``block_hashes``: ``cache_full_blocks`` (``block_pool.py:230``).  Only full blocks get a
        hash; a block already cached under the same hash is left as it is
        (``_insert_block_hash``, ``:666``); an identical block cached earlier is *not*
        de-duplicated, both stay cached (``:49``–``53``)."""
        if num_cached_blocks >= num_full_blocks:
            return
        if num_full_blocks > min(len(blocks), len(block_hashes)):
            raise InvalidArgument(
                f"cannot cache {num_full_blocks} full blocks with {len(blocks)} blocks and "
                f"{len(block_hashes)} block hashes"
            )
        for i in range(num_cached_blocks, num_full_blocks):
            b, h = blocks[i], block_hashes[i]
            if b == NULL_BLOCK:  # block_pool.py:281: null blocks are never cached
                continue
            if self._hash[b] == h:
                continue
            if self._hash[b] is not None:
                # vLLM re-hashes a cached block only when a partial entry becomes full
                # (block_pool.py:290), which needs hash_block_size < block_size.
                raise InvalidArgument(f"block {b} is already cached under another hash ({self._hash[b]} != {h})")
            self._hash[b] = h
            holders = self._cached.get(h)
            # a new inner map, not an update in place: clones share the inner maps
            self._cached[h] = {b: None} if holders is None else {**holders, b: None}

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the head of the free queue, evicting the hash of each
        cached one, each with reference count 1: ``get_new_blocks`` (``block_pool.py:706``),
        ``_maybe_evict_cached_block`` (``:769``).  Raises when too few blocks are free
        (``:718``)."""
        n = nonneg_int("num_blocks", num_blocks, maximum=MAX_COUNT)
        if n > len(self._free):
            raise InvalidArgument(f"cannot get {n} free blocks from a pool with {len(self._free)} free")
        out = []
        for _ in range(n):
            b, _none = self._free.popitem(last=False)
            self._evict(b)
            assert self._ref[b] == 0
            self._ref[b] = 1
            out.append(b)
        return out

    def _evict(self, block: int) -> None:
        """Drop ``block``'s cached hash, if any (``_remove_cached_block_hashes``, ``block_pool.py:630``)."""
        h = self._hash[block]
        if h is None:
            return
        rest = {b: None for b in self._cached[h] if b != block}  # copy on write, as in cache_full_blocks
        if rest:
            self._cached[h] = rest
        else:
            del self._cached[h]
        self._hash[block] = None
        if self._record:
            self._evicted.append(h)

    def touch(self, blocks: Iterable[int]) -> None:
        """A cache hit takes each block: out of the free queue if no request held it, and one
        more reference: ``touch`` (``block_pool.py:792``).  The null block is skipped."""
        for b in blocks:
            if b == NULL_BLOCK:
                continue
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block; those no request holds any more return to the
        free queue: ``free_blocks`` (``block_pool.py:816``).  Uncached blocks (or every block,
        with caching off) go to the *head*, in the given order, to be reused first
        (``:837``–``839``, ``:845``); cached blocks go to the *tail*, in the given order, to be
        evicted last — LRU (``:840``–``842``, ``:847``)."""
        first: list[int] = []
        last: list[int] = []
        for b in ordered_blocks:
            if b == NULL_BLOCK:  # block_pool.py:830: its ref count is not maintained
                continue
            if self._ref[b] <= 0:
                raise InvalidArgument(f"block {b} is freed but no request holds it")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                (first if self._hash[b] is None or not self.config.enable_caching else last).append(b)
        for b in reversed(first):  # prepend_n (kv_cache_utils.py:438) keeps the list's order
            self._free[b] = None
            self._free.move_to_end(b, last=False)
        for b in last:  # append_n (kv_cache_utils.py:459)
            self._free[b] = None

    def find_longest_cache_hit(self, block_hashes: Sequence[int], max_length: int) -> list[int]:
        """The blocks of the longest run of leading cached blocks covering at most
        ``max_length`` tokens: ``FullAttentionManager.find_longest_cache_hit``
        (``single_type_kv_cache_manager.py:743``), phase 1 (``:792``–``800``).  The walk stops
        at the first miss: with chained hashes every later block misses too."""
        limit = nonneg_int("max_length", max_length, maximum=MAX_TOKENS) // self.config.block_size
        hit: list[int] = []
        for h in block_hashes[:limit]:
            b = self.get_cached_block(h)
            if b is None:
                break
            hit.append(b)
        return hit


@dataclass(frozen=True, slots=True)
class CacheHit:
    """What ``get_computed_blocks`` returns: the cached blocks a request starts with and the
    tokens they cover (``len(blocks) · block_size``)."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


#: No cached prefix (vLLM's ``empty_kv_cache_blocks``, ``kv_cache_manager.py:224``).
NO_HIT = CacheHit()


class KVCacheManager:
    """vLLM's ``KVCacheManager`` for one full-attention group (``kv_cache_manager.py:131``).

    Keeps each request's block table (``req_to_blocks``) and how many of its blocks are
    cached (``num_cached_block``, ``single_type_kv_cache_manager.py:126``–``132``).  A request
    is named by any hashable id; its tokens are described at each call by ``block_hashes``
    (chained hashes of its full blocks so far, prompt and outputs), ``num_tokens`` (prompt +
    outputs so far, vLLM's ``request.num_tokens``) and ``num_computed_tokens``.
    """

    def __init__(self, config: PoolConfig, *, record_evictions: bool = False) -> None:
        """A fresh pool of ``config`` (``kv_cache_manager.py:132``, the pool built by the
        coordinator at ``kv_cache_coordinator.py:120``)."""
        self.config = config
        self.pool = BlockPool(config, record_evictions=record_evictions)
        self._blocks: dict[Hashable, list[int]] = {}
        self._num_cached: dict[Hashable, int] = {}

    def clone(self) -> KVCacheManager:
        """An independent copy: the pool and every request's block table."""
        twin = KVCacheManager.__new__(KVCacheManager)
        twin.config = self.config
        twin.pool = self.pool.clone()
        twin._blocks = {rid: list(table) for rid, table in self._blocks.items()}
        twin._num_cached = dict(self._num_cached)
        return twin

    @property
    def usage(self) -> float:
        """``KVCacheManager.usage`` (``kv_cache_manager.py:229``)."""
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        """The pool's free blocks, cached ones included (``block_pool.py:912``)."""
        return self.pool.num_free_blocks

    def get_blocks(self, request_id: Hashable) -> tuple[int, ...]:
        """The request's block table (``get_blocks``, ``kv_cache_manager.py:732``)."""
        return tuple(self._blocks.get(request_id, ()))

    def get_computed_blocks(self, block_hashes: Sequence[int], num_tokens: int) -> CacheHit:
        """The longest cached prefix of a request with ``num_tokens`` tokens, at most
        ``num_tokens − 1`` tokens long: ``get_computed_blocks`` (``kv_cache_manager.py:266``).
        The cap (``:295``–``302``) keeps the last token to compute its logits; since the hit is
        whole blocks (``single_type_kv_cache_manager.py:794``), a prompt of ``k·B`` tokens
        fully cached still recomputes its whole last block.  With caching off, no hit
        (``:292``).  The scheduler asks only when ``num_computed_tokens == 0``: a new request
        or a preempted one (``sched/scheduler.py:1110``); a preempted request finds here its
        own freed blocks that were not evicted since, outputs included."""
        n = nonneg_int("num_tokens", num_tokens, maximum=MAX_TOKENS)
        if not self.config.enable_caching or n == 0:
            return NO_HIT
        hit = self.pool.find_longest_cache_hit(block_hashes, n - 1)
        return CacheHit(tuple(hit), len(hit) * self.config.block_size) if hit else NO_HIT

    def num_blocks_to_allocate(self, request_id: Hashable, num_tokens: int, new_computed_blocks: Sequence[int]) -> int:
        """Blocks the request must take from the free queue to have ``num_tokens`` slots:
        ``get_num_blocks_to_allocate`` (``single_type_kv_cache_manager.py:176``, summed by
        ``kv_cache_coordinator.py:194``).  A running request (one with cached-block
        bookkeeping) needs its missing blocks (``:230``–``236``).  Otherwise the hit's blocks
        count as held, and each hit block no request holds counts as one to take, since
        :meth:`BlockPool.touch` removes it from the free queue (``:256``–``266``)."""
        required = cdiv(num_tokens, self.config.block_size)
        held = len(self._blocks.get(request_id, ()))
        if request_id in self._num_cached:
            return max(required - held, 0)
        new = max(required - (len(new_computed_blocks) + held), 0)
        evictable = sum(1 for b in new_computed_blocks if b != NULL_BLOCK and self.pool.ref_count(b) == 0)
        return new + evictable

    def allocate_slots(
        self,
        request_id: Hashable,
        *,
        block_hashes: Sequence[int],
        num_tokens: int,
        num_computed_tokens: int,
        num_new_tokens: int,
        hit: CacheHit = NO_HIT,
        full_sequence_must_fit: bool = False,
    ) -> tuple[int, ...] | None:
        """Give the request slots for ``num_new_tokens`` more tokens, adopting ``hit`` first;
        the new block ids, or ``None`` (and no change) when the free queue is too short:
        ``allocate_slots`` (``kv_cache_manager.py:380``).

        * computed tokens: ``num_computed_tokens + hit.num_tokens`` (``:510``–``516``);
        * ``full_sequence_must_fit`` (the scheduler passes ``scheduler_reserve_full_isl``,
          default on, for waiting requests, ``sched/scheduler.py:1449``): first the request's
          whole current sequence, ``num_tokens`` (prompt plus outputs so far — not its future
          outputs), must fit beside the hit (``:531``–``548``);
        * then the slots of this step, ``computed + num_new_tokens`` (``:550``–``588``);
        * on success the hit is touched and put at the head of the table
          (``:590``–``602``, ``single_type_kv_cache_manager.py:268``), new blocks are taken
          (``:604``), and the blocks full by ``min(computed + num_new_tokens, num_tokens)``
          tokens are cached at once, before the step runs (``:621``–``625``).
        """
        for name, v in (("num_tokens", num_tokens), ("num_computed_tokens", num_computed_tokens),
                        ("num_new_tokens", num_new_tokens)):
            if type(v) is not int or not 0 <= v <= MAX_TOKENS:  # the engine's plain ints skip the full check
                nonneg_int(name, v, maximum=MAX_TOKENS)
        if not isinstance(hit, CacheHit):
            raise InvalidArgument(f"hit must be a CacheHit, got {hit!r}")
        if num_new_tokens == 0 and hit.num_tokens == 0:  # kv_cache_manager.py:483-491
            raise InvalidArgument("num_new_tokens must be greater than 0 when there are no computed tokens to adopt")
        if len(block_hashes) > num_tokens // self.config.block_size:
            raise InvalidArgument(
                f"{len(block_hashes)} block hashes for {num_tokens} tokens: only full blocks have a hash"
            )
        if hit.blocks and request_id in self._num_cached:
            raise InvalidArgument(f"request {request_id!r} is running: a running request has no new cache hit")
        computed = num_computed_tokens + hit.num_tokens
        free = self.pool.num_free_blocks
        if full_sequence_must_fit and self.num_blocks_to_allocate(request_id, num_tokens, hit.blocks) > free:
            return None
        need_slot = computed + num_new_tokens
        if self.num_blocks_to_allocate(request_id, need_slot, hit.blocks) > free:
            return None
        table = self._blocks.setdefault(request_id, [])
        if hit.blocks:  # allocate_new_computed_blocks (kv_cache_coordinator.py:265)
            assert not table
            if self.config.enable_caching:
                self.pool.touch(hit.blocks)
            table.extend(hit.blocks)
            self._num_cached[request_id] = len(table)
        missing = cdiv(need_slot, self.config.block_size) - len(table)
        new = self.pool.get_new_blocks(missing) if missing > 0 else []
        table.extend(new)
        if self.config.enable_caching:
            self._cache_blocks(request_id, block_hashes, min(need_slot, num_tokens))
        return tuple(new)

    def _cache_blocks(self, request_id: Hashable, block_hashes: Sequence[int], num_tokens: int) -> None:
        """Cache the request's blocks full by ``num_tokens`` tokens that have a hash:
        ``cache_blocks`` (``single_type_kv_cache_manager.py:477``, ``:501``–``542``)."""
        done = self._num_cached.get(request_id, 0)
        full = min(num_tokens, len(block_hashes) * self.config.block_size) // self.config.block_size
        if done >= full:
            return
        self.pool.cache_full_blocks(self._blocks[request_id], block_hashes, done, full)
        self._num_cached[request_id] = full

    def free(self, request_id: Hashable) -> None:
        """Release a finished or preempted request's blocks, last block first, so its tail is
        evicted before its head: ``free`` (``kv_cache_manager.py:629``,
        ``single_type_kv_cache_manager.py:591``–``599``).  Its cached blocks stay cached in the
        free queue until evicted.  A request with no blocks is a no-op (``:586``)."""
        table = self._blocks.pop(request_id, [])
        self._num_cached.pop(request_id, None)
        self.pool.free_blocks(reversed(table))
