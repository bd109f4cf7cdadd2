"""The reference engine's prefix cache: vLLM 0.33's block pool, seen request by request.

With ``ModelParams.prefix_caching`` on, :class:`kvstab.simulator.Engine` keeps
its KV memory in a :class:`~kvstab.blocks.KVCacheManager` (vLLM's own
reference counts, chained hashes of full blocks, longest-prefix hits and LRU
eviction, method by method) instead of charging each request
:func:`~kvstab.model.tokens_held` of its own.  This module is the layer
between the two: what a rule is shown of the cache, and one step's decision
carried out on the pool in the order vLLM's scheduler carries it out
(``docs/MODEL.md``, "Prefix caching"):

1. the running requests the rule keeps are allocated their grants in
   admission order; when the pool runs dry the newest victim is freed, and
   again, until the allocation fits (vLLM's ``self.running.pop()`` loop,
   ``sched/scheduler.py``); victims not needed by then are freed last,
   newest first;
2. the queue head is walked in queue order: each entry looks up its longest
   cached prefix *now* (after the allocations before it, which may have
   evicted blocks or cached new ones), and an admitted one adopts that hit and
   is allocated its first grant past it.

A request's KV content is a :class:`~kvstab.prefix.Prompt` covering its
prompt and every output token it will produce; its chain of block hashes
(:func:`~kvstab.prefix.block_hashes`) is computed once, and a block is cached
as soon as the step that fills it is scheduled (vLLM caches at allocation,
``kv_cache_manager.py:621``–``625``).

Memory is the pool's: distinct blocks held, a shared block once.  The rule
sees it through the view's ``shared`` and ``cached`` fields: each block is
charged to the *oldest* request holding it (running requests in admission
order, then the waiting entries in queue order), which is what makes vLLM's
newest-first preemption free exactly the blocks of a suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstab.blocks import NO_HIT, CacheHit, KVCacheManager, PoolConfig, cdiv
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, block_hashes, content_id

__all__ = ["PrefixCache", "Hit", "Kept", "Entering", "own_content"]


def own_content(rid: int, s: int, outputs: int) -> Prompt:
    """The content of a request that names none: ``s`` prompt tokens and ``outputs``
    output tokens of its own (it shares a block with no other request; after a
    preemption it finds its own blocks again)."""
    return Prompt(((content_id("own", rid), s), (content_id("output", rid), outputs)))


@dataclass(frozen=True, slots=True)
class Hit:
    """What a waiting request finds in the cache: ``cached`` tokens (whole blocks, at most
    ``s − 1``) of which ``shared`` are in blocks a request ahead of it holds."""

    cached: int = 0
    shared: int = 0


@dataclass(frozen=True, slots=True)
class Kept:
    """A running request the rule keeps: its progress before and after the step, and
    vLLM's ``num_tokens`` (prompt plus outputs known when the step is scheduled)."""

    rid: int
    before: int
    after: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Entering:
    """A queue-head entry in queue order: its prompt length now, and whether the rule
    admitted it and with which grant (tokens past its hit)."""

    rid: int
    s: int
    admitted: bool
    grant: int


class PrefixCache:
    """vLLM's block pool under a server of ``params`` (``M // B`` usable blocks of ``B``
    tokens) and the content of every request that arrived."""

    def __init__(self, params: ModelParams) -> None:
        usable = params.M // params.block
        self.block = params.block
        self.chunk = params.chunk
        self.kv = KVCacheManager(PoolConfig(num_blocks=usable + 1, block_size=params.block))
        self._content: dict[int, Prompt] = {}
        self._chains: dict[int, tuple[int, ...]] = {}

    def clone(self) -> PrefixCache:
        """A copy whose pool can be changed without touching this one (contents are shared:
        they never change)."""
        twin = PrefixCache.__new__(PrefixCache)
        twin.block = self.block
        twin.chunk = self.chunk
        twin.kv = self.kv.clone()
        twin._content = self._content
        twin._chains = self._chains
        return twin

    # ---- requests ------------------------------------------------------------------------

    def register(self, rid: int, content: Prompt) -> None:
        """Request ``rid``'s whole content (prompt, then every output token)."""
        if rid in self._content:
            raise InvalidArgument(f"request {rid} is already registered with the prefix cache")
        self._content[rid] = content

    def chain(self, rid: int, num_tokens: int) -> tuple[int, ...]:
        """Hashes of the full blocks among the request's first ``num_tokens`` tokens."""
        chain = self._chains.get(rid)
        if chain is None:
            chain = self._chains[rid] = block_hashes(self._content[rid], self.block)
        full = num_tokens // self.block
        if full > len(chain):
            raise InvalidArgument(
                f"request {rid} has {len(chain) * self.block} tokens of content, fewer than the {num_tokens} asked"
            )
        return chain[:full]

    # ---- what the rule is shown ----------------------------------------------------------

    @property
    def used_tokens(self) -> int:
        """KV memory in use: blocks held by at least one request, a shared block once, times ``B``."""
        return self.kv.pool.num_used_blocks * self.block

    def held_blocks(self, rid: int) -> int:
        """Blocks in the request's table."""
        return len(self.kv.get_blocks(rid))

    def shares(self, rids: Sequence[int]) -> list[int]:
        """For each running request (admission order), the tokens of its blocks an older
        one among them also holds."""
        seen: set[int] = set()
        out = []
        for rid in rids:
            table = self.kv.get_blocks(rid)
            out.append(len(seen.intersection(table)) * self.block)
            seen.update(table)
        return out

    def lookup(self, rid: int, s: int) -> tuple[CacheHit, Hit]:
        """The longest cached prefix of a waiting request with ``s`` tokens now
        (``get_computed_blocks``), and how much of it running requests hold."""
        hit = self.kv.get_computed_blocks(self.chain(rid, s), s)
        if not hit.blocks:
            return hit, Hit()
        held = sum(1 for b in hit.blocks if self.kv.pool.ref_count(b) > 0)
        return hit, Hit(hit.num_tokens, held * self.block)

    def preview(self, heads: Sequence[tuple[int, int]]) -> dict[int, Hit]:
        """First guess of each queue-head entry's hit, ``(rid, s)`` in queue order, before a
        decision: the pool as it is (a trial of the decision corrects it)."""
        return {rid: self.lookup(rid, s)[1] for rid, s in heads}

    # ---- one step ------------------------------------------------------------------------

    def carry_out(self, kept: Sequence[Kept], victims: Sequence[int], heads: Sequence[Entering]) -> tuple[dict[int, Hit], int]:
        """Carry out one decision on this pool in vLLM's order (module docstring).

        ``victims`` in admission order.  Returns each queue-head entry's hit as met at
        its turn, and how many blocks the decision lacked (0 when it fits in ``M``:
        more is a broken memory invariant; the allocations that did not fit are not made).
        """
        pending = list(victims)
        short = 0
        B = self.block
        for k in kept:
            if k.after == k.before:
                continue  # not scheduled this step (no budget left): vLLM allocates nothing
            if k.after // B == k.before // B and -(-k.after // B) == -(-k.before // B):
                continue  # no new block and none newly full: allocate_slots would change nothing
            while not self._allocate(k.rid, k.num_tokens, k.before, k.after, NO_HIT) and pending:
                self.kv.free(pending.pop())
            short += self._lacking(k.rid, k.after, NO_HIT)
        while pending:
            self.kv.free(pending.pop())
        met: dict[int, Hit] = {}
        for e in heads:
            hit, seen = self.lookup(e.rid, e.s)
            met[e.rid] = seen
            if not e.admitted or (e.grant == 0 and not hit.blocks):
                continue
            after = hit.num_tokens + min(e.grant, e.s - hit.num_tokens, self.chunk)
            if not self._allocate(e.rid, e.s, 0, after, hit):
                short += self._lacking(e.rid, after, hit)
        return met, short

    def _allocate(self, rid: int, num_tokens: int, before: int, after: int, hit: CacheHit) -> bool:
        """``allocate_slots`` for progress ``before`` → ``after`` (past ``hit`` for an
        admission); whether it fitted (nothing changes when it did not)."""
        computed = before
        new = after - before - hit.num_tokens
        ntok = max(num_tokens, after)
        return (
            self.kv.allocate_slots(
                rid,
                block_hashes=self.chain(rid, ntok),
                num_tokens=ntok,
                num_computed_tokens=computed,
                num_new_tokens=new,
                hit=hit,
            )
            is not None
        )

    def _lacking(self, rid: int, after: int, hit: CacheHit) -> int:
        """Blocks the request still lacks for progress ``after`` (0 once allocated)."""
        need = self.kv.num_blocks_to_allocate(rid, after, hit.blocks) if self.held_blocks(rid) < cdiv(after, self.block) else 0
        return max(need - self.kv.num_free_blocks, 0)

    def free(self, rid: int) -> None:
        """A finished request releases its blocks (they stay cached until evicted)."""
        self.kv.free(rid)
