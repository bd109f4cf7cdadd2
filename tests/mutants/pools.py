"""Mutant block pools (prefix caching): bugs in the mechanism, not in a rule.

Each class is a small variant of :mod:`kvstab.blocks` with one realistic bug of
reference counting or cache lookup; :data:`POOL_MUTANTS` installs one in a fresh
:class:`kvstab.simulator.Engine` with prefix caching on (``install(engine)``).  A rule
cannot see them: they break the accounting the proofs rest on (the view's charges
are the pool's distinct blocks, a hit is at most ``s − 1`` tokens), which the
encoding's self-check against ``Engine.step`` and the property suite's pool check
catch (``tests/proofs/test_proofs_caching.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kvstab.blocks import NO_HIT, NULL_BLOCK, BlockPool, CacheHit, KVCacheManager
from kvstab.simulator import Engine


class EvictsReferencedPool(BlockPool):
    """Returns a shared block to the free queue when *one* of its holders frees it: the
    block is then free (and evictable) while another request still references it, and a
    later allocation evicts it and hands it out a second time."""

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        for b in ordered_blocks:
            if b == NULL_BLOCK or self._ref[b] <= 0:
                continue
            self._ref[b] -= 1
            if b not in self._free:  # BUG: the block goes back even if others hold it (ref > 0)
                self._free[b] = None

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        out = []
        for _ in range(min(num_blocks, len(self._free))):
            b, _none = self._free.popitem(last=False)
            self._evict(b)
            self._ref[b] = 1  # BUG: overwrites the references of whoever still holds it
            out.append(b)
        return out

    def touch(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            if b != NULL_BLOCK:
                self._free.pop(b, None)
                self._ref[b] += 1

    def clone(self) -> BlockPool:
        twin = super().clone()
        twin.__class__ = type(self)
        return twin


class FreedOncePool(BlockPool):
    """Counts a shared block once per request when a hit takes it (``touch``) but frees it
    once: the first holder's free drops a reference, the others' are skipped, so the block
    never returns to the free queue (a leak the view does not show)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._freed: set[int] = set()

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        kept = []
        for b in ordered_blocks:
            if b != NULL_BLOCK and self._ref[b] >= 2:
                if b in self._freed:
                    continue  # BUG: "already freed": this holder's reference is never dropped
                self._freed.add(b)
            kept.append(b)
        super().free_blocks(kept)

    def clone(self) -> BlockPool:
        twin = super().clone()
        twin.__class__ = type(self)
        twin._freed = set(self._freed)  # type: ignore[attr-defined]
        return twin


class FullHitManager(KVCacheManager):
    """Looks up a hit of up to ``num_tokens`` tokens: a prompt cached in whole blocks is
    a hit of the whole prompt, and its last token (the first output's logits) is never
    computed (vLLM caps the hit at ``num_tokens − 1``, ``kv_cache_manager.py:295``–``302``)."""

    def get_computed_blocks(self, block_hashes: Sequence[int], num_tokens: int) -> CacheHit:
        if not self.config.enable_caching or num_tokens == 0:
            return NO_HIT
        hit = self.pool.find_longest_cache_hit(block_hashes, num_tokens)  # BUG: num_tokens − 1
        return CacheHit(tuple(hit), len(hit) * self.config.block_size) if hit else NO_HIT

    def clone(self) -> KVCacheManager:
        twin = super().clone()
        twin.__class__ = type(self)
        return twin


def _pool(cls: type[BlockPool]) -> Callable[[Engine], None]:
    def install(engine: Engine) -> None:
        assert engine.cache is not None, "a mutant pool needs an engine with prefix caching on"
        engine.cache.kv.pool = cls(engine.cache.kv.config)

    return install


def _manager(engine: Engine) -> None:
    assert engine.cache is not None, "a mutant pool needs an engine with prefix caching on"
    engine.cache.kv = FullHitManager(engine.cache.kv.config)


#: name → install(engine), for a fresh engine with prefix caching on
POOL_MUTANTS: dict[str, Callable[[Engine], None]] = {
    "evicts_referenced_pool": _pool(EvictsReferencedPool),
    "freed_once_pool": _pool(FreedOncePool),
    "full_hit_pool": _manager,
}
