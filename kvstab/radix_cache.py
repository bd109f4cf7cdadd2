"""SGLang 0.5.23's radix cache, token by token: the tree its scheduler matches, locks and evicts.

With the radix cache on (SGLang's default), ``mem_cache/registry.py:146`` builds
a ``UnifiedRadixCache`` whose only component is the full-attention KV
(``tree_components = (FULL,)``); its tree is
``mem_cache/unified_cache/unified_tree_core.py``.  :class:`RadixCache` keeps
the same tree with the same recency clock, so that a model built on it evicts
what SGLang evicts (line numbers below are into that file unless named):

* **Keys** are token ids, cut to whole pages (``page_aligned``); a child is
  found by its first page (``child_key``).  A match or an insert that ends
  inside an edge *splits* it (``_split_node``, ``:1467``).
* **The clock** is one process-wide counter that every read advances by one
  (``components/base.py:161``).  A new node reads it twice (its access and
  creation times, ``:126``); an insert touches the root, then each node it
  walks (``_touch_node``, ``:1096``); a split re-reads it for the child's
  access time (``:1524``).  A match stamps its last matched node with one
  reading ``t`` and each ancestor with ``t − 10⁻⁵·depth`` (``:1030``–``:1034``),
  so a path's ancestors are just older than its end.
* **Match** (``_match_prefix_helper``, ``:905``) walks from the root while a
  child's first page matches, adding whole edges, and stops inside an edge
  after splitting it.  The scheduler caps the key at ``len − 1`` tokens
  (``Req._compute_max_prefix_len``, ``schedule_batch.py:1766``): a whole-prompt hit
  still computes its last token.
* **Insert** (``begin_insert``, ``:1129``) walks the same way, splitting where
  the key leaves an edge, and hangs the rest of the key under the last node as
  one new leaf (``_add_new_node``, ``:1532``); it returns how many of the key's
  tokens were already in the tree (the caller frees its duplicate copies).
* **Locks** (``components/full.py:282``, ``:331``): a running request locks the
  path from its last node to the root; a node with ``lock_ref`` 0 is
  *evictable*, and :attr:`evictable_size` is the tokens in such nodes.
* **Eviction** (``components/full.py:209``–``:244``): a heap of the evictable
  leaves keyed by access time, oldest first; each popped leaf is deleted, and a
  parent it leaves childless and unlocked joins the heap; it stops once the
  tokens asked for are freed or no leaf is left.

The tree stores token ids only (SGLang's node values are KV slot indices,
which a model does not need: memory is counted, :attr:`total_size`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from kvstab.errors import InvalidArgument

__all__ = ["RadixCache", "RadixNode", "Match", "ANCESTOR_STEP"]

#: how much older than its child a matched path's node is stamped (``unified_tree_core.py:1033``)
ANCESTOR_STEP = 0.00001


class RadixNode:
    """One edge of the tree: its tokens (``key``), its children by first page, its lock count
    and its access time on the cache's clock."""

    __slots__ = ("key", "children", "parent", "lock_ref", "last_access", "id")

    def __init__(self, key: tuple[int, ...], parent: RadixNode | None, clock: float, ident: int) -> None:
        self.key = key
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = clock
        self.id = ident

    def __repr__(self) -> str:
        return f"RadixNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref}, t={self.last_access})"


@dataclass(frozen=True, slots=True)
class Match:
    """A prefix match: ``length`` cached tokens ending at ``node`` (the root for no hit)."""

    length: int
    node: RadixNode


class RadixCache:
    """SGLang's token-granular radix tree (FULL component, no host tier) with ``page`` tokens a page."""

    def __init__(self, page: int = 1) -> None:
        if isinstance(page, bool) or not isinstance(page, int) or page < 1:
            raise InvalidArgument(f"page must be a positive integer, got {page!r}")
        self.page = page
        self.clock = 0.0  # SGLang's _LAST_ACCESS_TIME_COUNTER_FLOAT (components/base.py:161)
        self._ids = 0
        self.root = self._new_node((), None)
        self.root.lock_ref = 1  # the root is never evictable (it holds nothing)
        self.evictable_size = 0
        self.protected_size = 0
        self.total_size = 0
        self._leaves: set[RadixNode] = set()

    # ---- the clock and nodes ------------------------------------------------------------

    def _tick(self) -> float:
        t = self.clock
        self.clock += 1.0
        return t

    def _new_node(self, key: tuple[int, ...], parent: RadixNode | None) -> RadixNode:
        t = self._tick()
        self._tick()  # the creation time, unused by LRU but read from the same counter
        node = RadixNode(key, parent, t, self._ids)
        self._ids += 1
        return node

    def _child_key(self, key: Sequence[int], at: int) -> tuple[int, ...]:
        return tuple(key[at : at + self.page])

    def _aligned(self, key: Sequence[int]) -> tuple[int, ...]:
        n = len(key) // self.page * self.page
        return tuple(key[:n])

    def _match_len(self, edge: tuple[int, ...], key: tuple[int, ...], at: int) -> int:
        """Tokens of ``edge`` equal to ``key[at:]``, whole pages only (``RadixKey.match``)."""
        n = min(len(edge), len(key) - at)
        if edge[:n] == key[at : at + n]:
            return n // self.page * self.page
        # the first mismatch lies in [lo, hi): halve with slice comparisons (C speed), then scan
        lo, hi = 0, n
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if edge[lo:mid] == key[at + lo : at + mid]:
                lo = mid
            else:
                hi = mid
        while lo < hi and edge[lo] == key[at + lo]:
            lo += 1
        return lo // self.page * self.page

    def _update_leaf(self, node: RadixNode) -> None:
        """Keep the evictable-leaf set: unlocked, not the root, no children."""
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self._leaves.add(node)
        else:
            self._leaves.discard(node)

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Split ``child``'s edge after ``at`` tokens; the new upper node is returned (``_split_node``)."""
        parent = child.parent
        assert parent is not None
        upper = self._new_node(child.key[:at], parent)
        upper.lock_ref = child.lock_ref
        lower_key = child.key[at:]
        upper.children = {lower_key[: self.page]: child}
        parent.children[child.key[: self.page]] = upper
        child.parent = upper
        child.key = lower_key
        child.last_access = self._tick()
        self._update_leaf(upper)
        self._update_leaf(child)
        return upper

    # ---- the public operations ------------------------------------------------------------

    def match(self, tokens: Sequence[int], limit: int | None = None) -> Match:
        """The longest cached prefix of ``tokens[:limit]`` (``match_prefix``); refreshes its path's access times."""
        key = self._aligned(tuple(tokens[:limit] if limit is not None else tokens))
        if not key:
            return Match(0, self.root)
        node = self.root
        at = 0
        while at < len(key):
            child = node.children.get(self._child_key(key, at))
            if child is None:
                break
            n = self._match_len(child.key, key, at)
            if n < len(child.key):
                node = self._split(child, n)
                at += n
                break
            node = child
            at += n
        t = self._tick()
        walk: RadixNode | None = node
        while walk is not None:
            walk.last_access = t
            t -= ANCESTOR_STEP
            walk = walk.parent
        return Match(at, node)

    def insert(self, tokens: Sequence[int]) -> tuple[int, RadixNode]:
        """Insert ``tokens`` (cut to whole pages): ``(tokens already cached, the key's last node)``."""
        key = self._aligned(tuple(tokens))
        node = self.root
        node.last_access = self._tick()
        at = 0
        while at < len(key):
            child = node.children.get(self._child_key(key, at))
            if child is None:
                break
            child.last_access = self._tick()
            n = self._match_len(child.key, key, at)
            node = self._split(child, n) if n < len(child.key) else child
            at += n
        prefix = at
        if at < len(key):
            leaf = self._new_node(key[at:], node)
            node.children[key[at : at + self.page]] = leaf
            self.evictable_size += len(leaf.key)
            self.total_size += len(leaf.key)
            self._update_leaf(leaf)
            self._update_leaf(node)
            node = leaf
        return prefix, node

    def lock(self, node: RadixNode) -> int:
        """A running request locks ``node``'s path to the root; the tokens it took out of the evictable pool."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
                delta += len(node.key)
            node.lock_ref += 1
            self._leaves.discard(node)
            parent = node.parent
            assert parent is not None
            node = parent
        return delta

    def unlock(self, node: RadixNode) -> int:
        """Undo one :meth:`lock` of ``node``; the tokens that became evictable."""
        delta = 0
        while node is not self.root:
            if node.lock_ref <= 0:
                raise InvalidArgument(f"unlocking {node!r}, which is not locked")
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._update_leaf(node)
            parent = node.parent
            assert parent is not None
            node = parent
        return delta

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` from unlocked leaves, least recently used first; the tokens freed."""
        heap = [(n.last_access, n.id, n) for n in self._leaves]
        heapq.heapify(heap)
        freed = 0
        last: RadixNode | None = None
        while True:
            if last is not None and last.parent is not None and last.parent in self._leaves:
                p = last.parent
                heapq.heappush(heap, (p.last_access, p.id, p))
            last = None
            if freed >= tokens or not heap:
                return freed
            _, _, x = heapq.heappop(heap)
            if x not in self._leaves:
                continue
            freed += len(x.key)
            self._delete_leaf(x)
            last = x

    def _delete_leaf(self, node: RadixNode) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[: self.page]]
        self.evictable_size -= len(node.key)
        self.total_size -= len(node.key)
        self._leaves.discard(node)
        self._update_leaf(parent)

    def path_length(self, node: RadixNode) -> int:
        """Tokens from the root to the end of ``node``."""
        n = 0
        walk: RadixNode | None = node
        while walk is not None:
            n += len(walk.key)
            walk = walk.parent
        return n
