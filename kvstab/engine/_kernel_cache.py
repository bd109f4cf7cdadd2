"""The compiled engine with prefix caching: vLLM 0.33's block pool in numba arrays.

:func:`run_cached` runs ``vllm-v1``, ``current-fit``, ``reserve`` and ``lookahead`` on the pool of
:mod:`kvstab.blocks` (reference counts, one free queue in eviction order, chained
hashes of full blocks, longest-prefix hits, LRU eviction) from slot ``st[CS_T]`` to
``t_end``, exactly as the reference engine does with ``ModelParams.prefix_caching``
(:mod:`kvstab.prefix_cache`; ``tests/test_engine_cache.py`` holds the two to identical
outputs).  Each rule is run *procedurally*, in vLLM's order, which ``docs/MODEL.md``
("The model with prefix caching", items 4–6) shows is the rule's decision on the
shifted view:

* the running requests are allocated their grants oldest first, and when the pool
  lacks blocks the newest running request is preempted (freed) until it does —
  the oldest-holder charge makes this the rule's prefix sums (``vllm-v1``,
  ``current-fit``; ``reserve`` never needs it);
* the queue head is walked in queue order, each entry looking its hit up at its
  turn: the settled decision of the reference engine's fixed point.

``lookahead`` takes no credit for sharing (item 6): it projects every request with its
whole table, a waiting one from its hit ``p0`` (a multiple of ``B``), so a request's
projection is ``p0`` plus that of a request of prompt ``s − p0`` from progress 0 while it
lives.  Its test is then the compiled engine's (:mod:`kvstab.engine._kernel`: the
finish-time table, O(running) a test, or the finish tree, O(log W)) on ``(s − p0, o)``
against ``M − p0``, and its wake slot holds while the head's hit stays the same.

Memory stays linear in blocks, requests and prompt segments, never in tokens:

* A request's block table is its **hit** (a prefix of cached blocks, each the first
  cached under its hash, which a held block stays) and its **own blocks**, private,
  kept as a doubly linked list through the block ids.  The hit is walked back from its
  last block through ``par[]``, each hit block's predecessor in its chain: every
  holder's hit has the same block there, so one link per block serves them all.
* Block hashes are computed here, block by block, from the request's content
  segments (:func:`kvstab.prefix.chain_constants`): a cursor per request, so a
  running request hashes each block once, when it fills.
* The map from a hash to the blocks cached under it is an open-addressing table
  (linear probing, backward-shift deletion) whose value is a list of blocks in the
  order they were cached (vLLM keeps duplicates; a lookup returns the first).

Speed is memory traffic: a block's fields are one row of ``blk[]`` and a table slot's
one row of ``ht[]`` (a block taken from the free queue is the least recently used, cold
in cache), the helpers are inlined (a call passed ~20 arrays), a decoder between block
events costs a comparison (``R_NEXT``), and a waiting head's lookup re-probes only
hashes whose first block changed and reuses the previous head's hashes over their
common leading segments.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvstab.engine import _finish_tree as FT_
from kvstab.engine import _layout as _L
from kvstab.engine import _skeleton as S_
from kvstab.engine._kernel import _la_admit, _la_enter, _la_head, _la_release, _la_test, _la_wake, _proj_held
from kvstab.engine._skeleton import _njit

#: the files whose compiled helpers ``run_cached`` inlines (lookahead's table and tree), with the
#: prefix of their sha256 this file was last compiled with (see kvstab.engine._layout.stale)
SKELETON_SHA = "2d60ea0633aae12c"
KERNEL_SHA = "63df08f27204389a"
FINISH_TREE_SHA = "0e4bea723d7ccfbd"
GUARDS = (("_kernel.py", KERNEL_SHA), ("_finish_tree.py", FINISH_TREE_SHA), ("_skeleton.py", SKELETON_SHA))
_L.warn_if_stale(__name__, GUARDS)

# rule, lifecycle and status codes are _layout's (one value a name for every kernel)
FAR = 1 << 62  # no wake slot

# scalar state st[] (``CS_``: this kernel's own state, not _layout's ``ST_``; its settings are arguments)
CS_T = 0  # next slot
CS_I = 1  # requests arrived
CS_NRUN = 2
CS_WHEAD = 3  # waiting ring buffer: head index, length
CS_WLEN = 4
CS_NFREE = 5
CS_FHEAD = 6  # free queue: head, tail block ids (-1: empty)
CS_FTAIL = 7
CS_VSLOT = 8  # the slot a BROKEN status stopped at
CS_PEAKS = 9  # Σ peak blocks of the running requests (reserve's view, kept as they come and go)
CS_TABS = 10  # Σ table sizes (hit + own blocks) of the running requests
CS_LAH = 11  # lookahead: the head it last refused (-1: none), its hit then (blocks), its wake slot
CS_LAHIT = 12
CS_LAW = 13
CS_TREE = 14  # lookahead: 1 while its finish-time table is in the finish tree
CS_LATEST = 15  # lookahead: tests run (a count of work, not an output)
CS_SIZE = 16

# per-request rows of R[]
R_S = 0
R_O = 1
R_P = 2
R_ARR = 3
R_FIRST = 4
R_FIN = 5
R_NPRE = 6
R_SERVED = 7  # area charged for the slots before R_SINCE (the rest is held × slots since: kept lazily)
R_WASTED = 8
R_ATT0 = 9  # R_SERVED when the current attempt began (its area is what the attempt added)
R_HIT = 10  # blocks of its hit
R_NOWN = 11  # own blocks
R_OHEAD = 12  # own blocks: first and last block id (-1: none)
R_OTAIL = 13
R_CPTR = 14  # the own block to cache next (-1: none yet)
R_NCACHED = 15  # blocks of its table cached (= blocks hashed by its cursor)
R_HSEG = 16  # hash cursor: segment and offset at block NCACHED
R_HOFF = 17
R_CACHED = 18  # tokens of its hit at its latest admission
R_RECOMP = 19
R_PRIOR = 20
R_SINCE = 21  # the first slot whose charge is not yet in R_SERVED
R_NEXT = 22  # a decoding request's next position that needs more than a token: a block, a cache, its end (0: none)
R_HLAST = 23  # the last block of its hit (-1: none); par[] leads back through the rest
R_SIZE = 24

# columns of the block table blk[]: one row per block, the fields a block's moves touch on one cache line
K_FPREV = 0  # free queue neighbours (-1: none)
K_FNEXT = 1
K_REF = 2
K_HASH = 3  # the hash it is cached under, when cached
K_DPREV = 4  # neighbours among the blocks cached under its hash (-1: none; UNCACHED: not cached)
K_DNEXT = 5
K_ONEXT = 6  # neighbours in its holder's own blocks
K_OPREV = 7
K_SIZE = 8
UNCACHED = -2

# columns of lookahead's finish-time table la[]: one row per request, set at its admission
L_F = 0  # its finish slot (absolute)
L_TF = 1  # the projected total at L_F (while the table is not in the tree)
L_TA = 2  # the slot it was admitted in
L_P0 = 3  # its hit then (tokens, a multiple of B): its projection is p0 plus that of (s − p0, o) from 0
L_S1 = 4  # s − p0
L_O = 5
L_SIZE = 6

# columns of the hash table ht[]: one row per table slot, its fields on one cache line
H_KEY = 0
H_FIRST = 1  # first and last block cached under the key (-1: none)
H_LAST = 2
H_USED = 3
H_SIZE = 4

# output rows: a SimResult's (the skeleton's slot row)
COLUMNS = tuple(_L.COLUMNS[: _L.NSIM])

_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


@_njit(cache=True, inline="always")
def _fmix(x: Any) -> Any:
    x ^= x >> _S33
    x *= _C1
    x ^= x >> _S33
    x *= _C2
    return x ^ (x >> _S33)


# ---- the hash table: hash -> (first, last) block cached under it ---------------------------


@_njit(cache=True, inline="always")
def _home(key: Any, mask: int) -> int:
    return int((np.uint64(key) * _GOLD) >> np.uint64(32)) & mask


@_njit(cache=True, inline="always")
def _probe(ht: Any, key: int) -> int:
    """The slot holding ``key``, or the free slot that ends its probe run (the table is never full:
    at least 2× the blocks)."""
    mask = ht.shape[0] - 1
    i = _home(key, mask)
    while ht[i, H_USED]:
        if ht[i, H_KEY] == key:
            return i
        i = (i + 1) & mask
    return i


@_njit(cache=True, inline="always")
def _find(ht: Any, key: int) -> int:
    """The table slot holding ``key``, or -1."""
    i = _probe(ht, key)
    return i if ht[i, H_USED] else -1


@_njit(cache=True, inline="always")
def _insert(ht: Any, key: int) -> int:
    """The slot of ``key``, inserted with no blocks if absent."""
    i = _probe(ht, key)
    if ht[i, H_USED]:
        return i
    ht[i, H_USED] = 1
    ht[i, H_KEY] = key
    ht[i, H_FIRST] = -1
    ht[i, H_LAST] = -1
    return i


@_njit(cache=True, inline="always")
def _delete(ht: Any, i: int) -> None:
    """Remove slot ``i``, shifting back the entries of its probe run."""
    mask = ht.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if not ht[j, H_USED]:
            break
        k = _home(ht[j, H_KEY], mask)
        # move j into the hole i if its home is not cyclically in (i, j]
        if (j > i and (k <= i or k > j)) or (j < i and (k <= i and k > j)):
            ht[i, H_KEY] = ht[j, H_KEY]
            ht[i, H_FIRST] = ht[j, H_FIRST]
            ht[i, H_LAST] = ht[j, H_LAST]
            i = j
    ht[i, H_USED] = 0


# ---- the pool ----------------------------------------------------------------------------


# The pool's three kinds of doubly linked list — the free queue (ends in ``st``), the blocks cached
# under one hash (ends in a row of ``ht``) and a request's own blocks (ends in its row of ``R``) —
# run on the two functions below, given the columns of ``blk`` that link a block to its
# neighbours and the fields that hold the list's ends.  Prepending is appending with the two
# directions swapped.


@_njit(cache=True, inline="always")
def _link_remove(blk: Any, b: int, PREV: int, NEXT: int, ends: Any, HEAD: int, TAIL: int) -> None:
    """Take block ``b`` out of the list linked through ``blk[:, PREV]``/``blk[:, NEXT]`` whose first
    and last blocks are ``ends[HEAD]``/``ends[TAIL]``; ``b``'s own links are left as they were."""
    p = blk[b, PREV]
    q = blk[b, NEXT]
    if p >= 0:
        blk[p, NEXT] = q
    else:
        ends[HEAD] = q
    if q >= 0:
        blk[q, PREV] = p
    else:
        ends[TAIL] = p


@_njit(cache=True, inline="always")
def _link_append(blk: Any, b: int, PREV: int, NEXT: int, ends: Any, HEAD: int, TAIL: int) -> None:
    """Put block ``b`` at the end ``ends[TAIL]`` of the list linked through ``blk[:, PREV]``/``blk[:, NEXT]``."""
    t = ends[TAIL]
    blk[b, PREV] = t
    blk[b, NEXT] = -1
    if t >= 0:
        blk[t, NEXT] = b
    else:
        ends[HEAD] = b
    ends[TAIL] = b


@_njit(cache=True, inline="always")
def _free_remove(st: Any, blk: Any, b: int) -> None:
    _link_remove(blk, b, K_FPREV, K_FNEXT, st, CS_FHEAD, CS_FTAIL)
    blk[b, K_FPREV] = -1
    blk[b, K_FNEXT] = -1
    st[CS_NFREE] -= 1


@_njit(cache=True, inline="always")
def _free_append(st: Any, blk: Any, b: int) -> None:
    _link_append(blk, b, K_FPREV, K_FNEXT, st, CS_FHEAD, CS_FTAIL)
    st[CS_NFREE] += 1


@_njit(cache=True, inline="always")
def _free_prepend(st: Any, blk: Any, b: int) -> None:
    _link_append(blk, b, K_FNEXT, K_FPREV, st, CS_FTAIL, CS_FHEAD)
    st[CS_NFREE] += 1


@_njit(cache=True, inline="always")
def _uncache(blk: Any, ht: Any, b: int) -> None:
    """Drop block ``b``'s cached hash (eviction): ``_maybe_evict_cached_block``."""
    i = _find(ht, blk[b, K_HASH])
    _link_remove(blk, b, K_DPREV, K_DNEXT, ht[i], H_FIRST, H_LAST)
    if ht[i, H_FIRST] < 0:
        _delete(ht, i)
    blk[b, K_DPREV] = UNCACHED
    blk[b, K_DNEXT] = -1


@_njit(cache=True, inline="always")
def _cache(blk: Any, ht: Any, b: int, h: int) -> None:
    """Cache block ``b`` under ``h`` (after the blocks already cached under it; a slot just
    inserted has no first and no last block)."""
    if blk[b, K_DPREV] != UNCACHED:
        return  # already cached (under the same hash: a chain names its prefix)
    i = _insert(ht, h)
    _link_append(blk, b, K_DPREV, K_DNEXT, ht[i], H_FIRST, H_LAST)
    blk[b, K_HASH] = h


# ---- hashing a request's blocks ------------------------------------------------------------


@_njit(cache=True, inline="always")
def _block_hash(seg_d: Any, seg_len: Any, seg: int, off: int, P: Any, B: int, R: Any, K1: Any, K2: Any) -> Any:
    """The next block's hash from the cursor (segment ``seg`` at offset ``off``, chain state
    ``P``): ``(h, P', seg', off')``."""
    pos = 0
    digest = np.uint64(0)
    while pos < B:
        take = min(seg_len[seg] - off, B - pos)
        x = _fmix(seg_d[seg] + np.uint64(off) * K1)
        digest += _fmix(x + np.uint64(take * B + pos) * K2)
        off += take
        pos += take
        if off == seg_len[seg]:
            seg += 1
            off = 0
    P = P * R + digest
    return np.int64(_fmix(P)), P, seg, off


# ---- lookahead's finish-time table -----------------------------------------------------------
#
# ``fcfs_admit_projected`` under caching projects each request with its whole table: an active
# one from its progress, a waiting one from its hit ``p0``, a multiple of ``B``, so that
# ``held(p0 + x) = p0 + held(x)``.  A request admitted in slot ``ta`` with hit ``p0``
# therefore holds ``p0 + _proj_held(s − p0, o, ta, E)`` at the end of slot ``E`` while it lives
# (lookahead never preempts and grants full units: the projection made at admission stays
# exact), and the test of a head is the compiled engine's test of ``(s − p0, o)`` against
# ``M − p0`` (its constraints at the finish slots it outlives; those after its own finish do not
# see it).  The table is ``la[]`` while few run, the finish tree ``FT`` while many do.


@_njit(cache=True)
def _la_table_test(la: Any, run: Any, nrun: int, s1: int, o: int, t: int, M: int, chunk: int,
                   B: int) -> tuple[bool, int, int, int]:
    """:func:`kvstab.engine._kernel._lookahead_test` on ``la[]`` for a head of prompt ``s1``
    (past its hit) and output ``o`` against ``M`` (``M − p0``): ``(ok, wake, fc, own)``, ``own``
    the total at the head's finish ``fc`` without its ``p0``.  A constraint at a finish slot
    after ``fc`` is not the head's (the head is gone there), so it is not tested."""
    rp, span, fc, own = _la_head(s1, o, t, chunk, B)
    ok = True
    wake = t + 1
    fnext = FAR
    for k in range(nrun):
        q = run[k]
        fq = la[q, L_F]
        if fq >= fc:
            own += la[q, L_P0] + _proj_held(la[q, L_S1], la[q, L_O], la[q, L_TA], fc, chunk, B)
            fnext = min(fnext, fq)
        if fq <= fc and la[q, L_TF] + _proj_held(s1, o, t, fq, chunk, B) > M:
            ok = False
            # it fails until the head, admitted later, is young enough at F_q to hold M − total(F_q)
            wake = max(wake, _la_wake((M - la[q, L_TF]) // B * B, fq, s1, o, rp, chunk))
    if own > M:
        ok = False
        wake = max(wake, fnext - span + 2)  # until its finish passes the next active finish slot
    return ok, wake, fc, own


@_njit(cache=True)
def _la_gone(FT: Any, la: Any, r: int, chunk: int, B: int) -> None:
    """Take request ``r`` out of the finish tree (it finished, or the table leaves the tree)."""
    F = la[r, L_F]
    ta = la[r, L_TA]
    p0 = la[r, L_P0]
    _la_release(FT, F, ta, la[r, L_S1], la[r, L_O], chunk, B)
    if p0 > 0:
        FT_.profile_add(FT, ta, 0, -p0)
        FT_.profile_add(FT, F + 1, 0, p0)


@_njit(cache=True)
def _la_move(FT: Any, la: Any, run: Any, nrun: int, chunk: int, B: int, into_tree: bool) -> None:
    """Move the running requests' table into the (empty) tree, or back out of it."""
    for k in range(nrun):
        q = run[k]
        if into_tree:
            ta = la[q, L_TA]
            F = la[q, L_F]
            p0 = la[q, L_P0]
            _la_enter(FT, ta, la[q, L_S1], la[q, L_O], F, la[q, L_TF], chunk, B)
            if p0 > 0:
                FT_.profile_add(FT, ta, 0, p0)
                FT_.profile_add(FT, F + 1, 0, -p0)
        else:
            la[q, L_TF] = FT_.tree_get(FT, la[q, L_F]) - la[q, L_F]
            _la_gone(FT, la, q, chunk, B)


@_njit(cache=True)
def _la_admits(w: int, s: int, o: int, p0: int, hit: int, t: int, M: int, chunk: int, B: int, run: Any,
               nrun: int, la: Any, FT: Any, st: Any) -> bool:
    """``lookahead``'s admission test of the head ``w`` (prompt ``s``, output ``o``, hit ``p0``
    tokens = ``hit`` blocks) in slot ``t`` against the ``nrun`` requests of ``run[]``; an admitted
    head is entered into the table (or tree).  A refused head is not tested again before its
    wake slot unless its hit changed (with the head and its hit fixed the test is the compiled
    engine's, whose wake slot ``docs/engine.md`` proves)."""
    if w == st[CS_LAH] and hit == st[CS_LAHIT] and t < st[CS_LAW]:
        return False
    st[CS_LATEST] += 1
    if FT.shape[1] == FT_.COLS:  # the table moves into the tree when many run, and back when few do
        if st[CS_TREE] == 0 and nrun >= FT[0, FT_.TREE_AT_]:
            _la_move(FT, la, run, nrun, chunk, B, True)
            st[CS_TREE] = 1
        elif st[CS_TREE] == 1 and nrun <= FT[0, FT_.TABLE_AT_]:
            _la_move(FT, la, run, nrun, chunk, B, False)
            st[CS_TREE] = 0
    s1 = s - p0
    if st[CS_TREE]:
        ok, wake, fc, own = _la_test(FT, t, s1, o, chunk, B, M - p0)
    else:
        ok, wake, fc, own = _la_table_test(la, run, nrun, s1, o, t, M - p0, chunk, B)
    if not ok:
        st[CS_LAH] = w
        st[CS_LAHIT] = hit
        st[CS_LAW] = wake
        return False
    if st[CS_TREE]:
        if p0 > 0:  # its p0 at every finish slot it lives to (before its own slot is entered), and in the profile
            FT_.tree_add(FT, t, fc, 0, p0)
            FT_.profile_add(FT, t, 0, p0)
            FT_.profile_add(FT, fc + 1, 0, -p0)
        _la_admit(FT, t, s1, o, chunk, B, fc, own + p0)
    else:
        for k in range(nrun):
            q = run[k]
            fq = la[q, L_F]
            if fq <= fc:
                la[q, L_TF] += p0 + _proj_held(s1, o, t, fq, chunk, B)
        la[w, L_TF] = own + p0
    la[w, L_F] = fc
    la[w, L_TA] = t
    la[w, L_P0] = p0
    la[w, L_S1] = s1
    la[w, L_O] = o
    return True


# ---- one run -----------------------------------------------------------------------------


@_njit(cache=True)
def run_cached(
    st: Any, R: Any, hP: Any, arr_slot: Any, seg_d: Any, seg_len: Any, seg_off: Any,
    blk: Any, par: Any, ht: Any, run: Any, wq: Any, scratch: Any, victims: Any, memo: Any, memo_P: Any,
    la: Any, FT: Any, rule: int, life: int, B: int, chunk: int, budget0: int, max_seqs: int, usable: int,
    CR: Any, SEED: Any, K1: Any, K2: Any, t_end: int, drain: bool, out: Any,
) -> int:
    """Run slots from ``st[CS_T]`` to ``t_end`` (or a drain); one row of ``out`` per slot.
    ``la`` and ``FT`` are lookahead's finish-time table and finish tree (``FT`` of
    :data:`~kvstab.engine._finish_tree.COLS` columns, else no tree: the table throughout)."""
    n = arr_slot.size
    qcap = wq.size
    t0 = st[CS_T]
    while st[CS_T] < t_end:
        t = st[CS_T]
        col = t - t0
        nrun = st[CS_NRUN]
        if nrun == 0 and st[CS_WLEN] == 0:
            if st[CS_I] >= n:
                if drain:
                    return _L.DRAINED
                st[CS_T] = t_end  # idle to the horizon: the rows stay 0
                return _L.REACHED
            nxt = arr_slot[st[CS_I]]
            if nxt > t:  # idle until the next arrival: nothing happens, rows stay 0
                st[CS_T] = min(nxt, t_end)
                continue
        # arrivals join the tail of the queue
        arrived = 0
        while st[CS_I] < n and arr_slot[st[CS_I]] <= t:
            r = st[CS_I]
            R[r, R_ARR] = t
            wq[(st[CS_WHEAD] + st[CS_WLEN]) % qcap] = r
            st[CS_WLEN] += 1
            st[CS_I] += 1
            arrived += 1
        # reserve's view: Σ peaks of the running, minus what older running requests share
        reserved = 0
        if rule == _L.RESERVE:
            reserved = st[CS_PEAKS] - (st[CS_TABS] - (usable - st[CS_NFREE]))
        # --- the running requests, oldest admission first
        budget = budget0 if (rule == _L.VLLM_V1 and budget0 >= 0) else (1 << 62)
        tokens = 0
        finishing = False  # whether a request reached its end this slot (else the release walk is skipped)
        nvict = 0
        j = 0
        self_out = False
        while j < nrun:
            r = run[j]
            p = R[r, R_P]
            if p + 1 < R[r, R_NEXT] and budget >= 1:
                # a decoder between events: one token, no block to take or cache, not its end
                R[r, R_P] = p + 1
                tokens += 1
                budget -= 1
                j += 1
                continue
            s = R[r, R_S]
            ask = min(s - p, chunk) if p < s else 1
            g = min(ask, budget)
            if g <= 0:
                break  # the budget is spent: the rest hold their blocks without work
            newp = p + g
            need = (newp + B - 1) // B - (R[r, R_HIT] + R[r, R_NOWN])
            while need > st[CS_NFREE]:
                if rule == _L.RESERVE or rule == _L.LOOKAHEAD:
                    st[CS_VSLOT] = t
                    return _L.BROKEN
                v = run[nrun - 1]
                nrun -= 1
                R[v, R_SERVED] += (R[v, R_HIT] + R[v, R_NOWN]) * B * (t - R[v, R_SINCE])  # charged to t - 1
                _release(v, R, B, blk, st, par, scratch)
                victims[nvict] = v
                nvict += 1
                if v == r:
                    self_out = True
                    break
            if self_out:
                break
            if need > 0 or newp // B > R[r, R_NCACHED]:  # a block to take or one newly full to cache
                _grow(r, need, newp, t, R, B, blk, st,
                      seg_d, seg_len, hP, ht, CR, K1, K2)
            # only newer requests can still be preempted in this slot: the work is done now
            R[r, R_P] = newp
            end = s + R[r, R_O]
            if newp >= end:
                finishing = True
            if newp >= s:  # decoding from here: the next token that takes a block, caches one or ends it
                R[r, R_NEXT] = min((R[r, R_HIT] + R[r, R_NOWN]) * B + 1, (R[r, R_NCACHED] + 1) * B, end)
            else:
                R[r, R_NEXT] = 0
            tokens += g
            budget -= g
            j += 1
        # --- admissions, in queue order, only in a slot that preempted nobody
        admitted = 0
        if nvict == 0:
            while st[CS_WLEN] > 0:
                if rule == _L.VLLM_V1 and budget <= 0:
                    break
                if max_seqs >= 0 and nrun >= max_seqs:
                    break
                w = wq[st[CS_WHEAD]]
                s = R[w, R_S]
                hit, evictable = _lookup(w, s, R, B, blk, seg_d, seg_len, seg_off, hP, ht,
                                         scratch, memo, memo_P, CR, SEED, K1, K2)
                shared = hit - evictable
                c = hit * B
                if rule == _L.VLLM_V1:
                    if (s + B - 1) // B - shared > st[CS_NFREE]:
                        break  # the whole prompt must fit (full_sequence_must_fit)
                    first = min(s - c, chunk, budget)
                elif rule == _L.CURRENT_FIT:
                    first = min(s - c, chunk)
                    if (c + first + B - 1) // B - shared > st[CS_NFREE]:
                        break
                elif rule == _L.LOOKAHEAD:
                    first = min(s - c, chunk)
                    # against M's whole blocks: every projected total is a multiple of B
                    if not _la_admits(w, s, R[w, R_O], c, hit, t, usable * B, chunk, B, run, nrun, la, FT, st):
                        break
                    if (c + first + B - 1) // B - shared > st[CS_NFREE]:
                        st[CS_VSLOT] = t
                        return _L.BROKEN
                else:
                    first = min(s - c, chunk)
                    peak = (s + R[w, R_O] + B - 1) // B - shared
                    if reserved + peak > usable:
                        break
                    reserved += peak
                    if (c + first + B - 1) // B - shared > st[CS_NFREE]:
                        st[CS_VSLOT] = t
                        return _L.BROKEN
                st[CS_WHEAD] = (st[CS_WHEAD] + 1) % qcap
                st[CS_WLEN] -= 1
                prev = -1
                for k in range(hit):  # adopt the hit: one more reference each, out of the free queue
                    b = scratch[k]
                    if blk[b, K_REF] == 0:
                        _free_remove(st, blk, b)
                    blk[b, K_REF] += 1
                    # the block before it in the chain: every holder's hit has the same one there (each
                    # is the first cached under its hash, and stays so while held)
                    par[b] = prev
                    prev = b
                R[w, R_HIT] = hit
                R[w, R_HLAST] = prev
                st[CS_PEAKS] += (s + R[w, R_O] + B - 1) // B
                st[CS_TABS] += hit
                R[w, R_NEXT] = 0
                R[w, R_NOWN] = 0
                R[w, R_OHEAD] = -1
                R[w, R_OTAIL] = -1
                R[w, R_CPTR] = -1
                R[w, R_NCACHED] = hit
                R[w, R_CACHED] = c
                R[w, R_SINCE] = t  # charged from this slot on
                R[w, R_ATT0] = R[w, R_SERVED]
                _grow(w, (c + first + B - 1) // B - hit, c + first, t, R, B, blk, st, seg_d, seg_len, hP, ht, CR, K1, K2)
                R[w, R_P] = c + first
                if c + first >= s + R[w, R_O]:
                    finishing = True
                tokens += first
                budget -= first
                if R[w, R_FIRST] < 0:
                    R[w, R_FIRST] = t
                run[nrun] = w
                nrun += 1
                admitted += 1
        memory = (usable - st[CS_NFREE]) * B
        # --- victims: progress lost (vLLM: outputs kept as prompt), back to the head, oldest first
        wasted = 0
        for k in range(nvict):  # newest first: pushing each to the front leaves the oldest at the head
            v = victims[k]
            lost = R[v, R_SERVED] - R[v, R_ATT0]  # the attempt's area (its charge was settled when freed)
            wasted += lost
            R[v, R_WASTED] += lost
            R[v, R_NPRE] += 1
            p = R[v, R_P]
            if life == _L.VLLM_LIFE:
                R[v, R_RECOMP] += p
                if p >= R[v, R_S]:
                    R[v, R_PRIOR] += p - R[v, R_S] + 1
                    s_new = p + 1
                    R[v, R_O] = R[v, R_S] + R[v, R_O] - p - 1
                    R[v, R_S] = s_new
            R[v, R_P] = 0
            st[CS_WHEAD] = (st[CS_WHEAD] - 1) % qcap
            wq[st[CS_WHEAD]] = v
            st[CS_WLEN] += 1
        running = nrun
        # --- releases at the end of the slot, in the order the slot scheduled them
        completed = 0
        kept = nrun
        if finishing:
            kept = 0
        for k in range(nrun if finishing else 0):
            r = run[k]
            if R[r, R_P] >= R[r, R_S] + R[r, R_O]:
                R[r, R_FIN] = t
                R[r, R_SERVED] += (R[r, R_HIT] + R[r, R_NOWN]) * B * (t + 1 - R[r, R_SINCE])  # charged to t
                _release(r, R, B, blk, st, par, scratch)
                if st[CS_TREE]:
                    _la_gone(FT, la, r, chunk, B)
                completed += 1
            else:
                run[kept] = r
                kept += 1
        st[CS_NRUN] = kept
        if out.shape[1] > 0:
            S_.slot_row(out, col, arrived, admitted, nvict, completed, running, memory, wasted, tokens, st[CS_WLEN])
        st[CS_T] = t + 1
        if drain and st[CS_I] >= n and st[CS_NRUN] == 0 and st[CS_WLEN] == 0:
            return _L.DRAINED
    return _L.REACHED


@_njit(cache=True, inline="always")
def _lookup(w: int, s: int, R: Any, B: int, blk: Any, seg_d: Any, seg_len: Any,
            seg_off: Any, hP: Any, ht: Any, scratch: Any, memo: Any, memo_P: Any, CR: Any, SEED: Any,
            K1: Any, K2: Any) -> Any:
    """The longest cached prefix of ``w`` with ``s`` tokens (at most ``s − 1`` tokens, whole
    blocks): its blocks into ``scratch``; returns ``(blocks, of them free)``.  The request's
    hash cursor is left after the hit.

    A refused head is looked up again every slot: its chain (a request's content never
    changes) is kept in ``memo`` — row 0 its rid and how many blocks are hashed, then per
    block the hash, the cursor after it (``memo_P`` the chain state) and the block found
    under it last time — so the table is probed again only where that block is no longer
    the first cached under the hash.  A new head keeps the rows of the one before it that
    lie wholly in the segments both start with (a shared system prompt is hashed once, not
    once per request)."""
    limit = (s - 1) // B
    if memo[0, 0] != w:
        keep = 0
        prev = memo[0, 0]
        if prev >= 0:
            a0 = seg_off[prev]
            w0 = seg_off[w]
            na = seg_off[prev + 1] - a0
            nw = seg_off[w + 1] - w0
            common = 0  # tokens of their common leading segments (equal digests: equal content)
            k = 0
            while k < na and k < nw and seg_d[a0 + k] == seg_d[w0 + k] and seg_len[a0 + k] == seg_len[w0 + k]:
                common += seg_len[a0 + k]
                k += 1
            keep = min(memo[0, 1], common // B)
            for i in range(1, keep + 1):  # the cursors move to w's segments
                memo[i, 1] += w0 - a0
        memo[0, 0] = w
        memo[0, 1] = keep
    hit = 0
    evictable = 0
    while hit < limit:
        if hit < memo[0, 1]:
            h = memo[hit + 1, 0]
        else:
            if hit == 0:
                seg = seg_off[w]
                off = 0
                P = SEED
            else:
                seg = memo[hit, 1]
                off = memo[hit, 2]
                P = memo_P[hit]
            h, P2, seg2, off2 = _block_hash(seg_d, seg_len, seg, off, P, B, CR, K1, K2)
            memo[hit + 1, 0] = h
            memo[hit + 1, 1] = seg2
            memo[hit + 1, 2] = off2
            memo[hit + 1, 3] = -1
            memo_P[hit + 1] = P2
            memo[0, 1] = hit + 1
        b = memo[hit + 1, 3]
        # still cached under h and at the head of its list: the first block under h, no probe
        if not (b >= 0 and blk[b, K_DPREV] == -1 and blk[b, K_HASH] == h):
            i = _find(ht, h)
            if i < 0:
                break
            b = ht[i, H_FIRST]
            memo[hit + 1, 3] = b
        scratch[hit] = b
        if blk[b, K_REF] == 0:
            evictable += 1
        hit += 1
    if hit == 0:
        hP[w] = SEED
        R[w, R_HSEG] = seg_off[w]
        R[w, R_HOFF] = 0
    else:
        hP[w] = memo_P[hit]
        R[w, R_HSEG] = memo[hit, 1]
        R[w, R_HOFF] = memo[hit, 2]
    return hit, evictable


@_njit(cache=True, inline="always")
def _grow(r: int, need: int, upto: int, t: int, R: Any, B: int, blk: Any, st: Any, seg_d: Any, seg_len: Any, hP: Any,
          ht: Any, CR: Any, K1: Any, K2: Any) -> None:
    """Take ``need`` blocks from the head of the free queue for ``r`` (evicting their hashes),
    then cache its blocks full by ``upto`` tokens (allocation time, as vLLM).  New blocks change
    what ``r`` is charged from slot ``t`` on: the slots before are settled first."""
    if need > 0:
        R[r, R_SERVED] += (R[r, R_HIT] + R[r, R_NOWN]) * B * (t - R[r, R_SINCE])
        R[r, R_SINCE] = t
    for _ in range(need):
        b = st[CS_FHEAD]
        _free_remove(st, blk, b)
        if blk[b, K_DPREV] != UNCACHED:
            _uncache(blk, ht, b)
        blk[b, K_REF] = 1
        _link_append(blk, b, K_OPREV, K_ONEXT, R[r], R_OHEAD, R_OTAIL)
        R[r, R_NOWN] += 1
        st[CS_TABS] += 1
        if R[r, R_CPTR] < 0:
            R[r, R_CPTR] = b
    full = upto // B
    while R[r, R_NCACHED] < full:
        b = R[r, R_CPTR]
        h, P, seg, off = _block_hash(seg_d, seg_len, R[r, R_HSEG], R[r, R_HOFF], hP[r], B, CR, K1, K2)
        hP[r] = P
        R[r, R_HSEG] = seg
        R[r, R_HOFF] = off
        _cache(blk, ht, b, h)
        R[r, R_NCACHED] += 1
        R[r, R_CPTR] = blk[b, K_ONEXT]


@_njit(cache=True, inline="always")
def _release(r: int, R: Any, B: int, blk: Any, st: Any, par: Any, scratch: Any) -> None:
    """Free ``r``'s table last block first (``free_blocks``): blocks nobody holds any more go to
    the free queue, uncached ones to its head in that order, cached ones to its tail."""
    hit = R[r, R_HIT]
    st[CS_TABS] -= hit + R[r, R_NOWN]
    st[CS_PEAKS] -= (R[r, R_S] + R[r, R_O] + B - 1) // B  # as added at its admission: S, O change only after
    nfirst = 0  # uncached blocks freed, collected in scratch in the order met
    b = R[r, R_OTAIL]
    while b >= 0:
        nb = blk[b, K_OPREV]
        blk[b, K_REF] -= 1
        if blk[b, K_REF] == 0:
            if blk[b, K_DPREV] != UNCACHED:
                _free_append(st, blk, b)
            else:
                scratch[nfirst] = b
                nfirst += 1
        b = nb
    # the hit, last block first: back along the chain (par[] was set when the hit was adopted)
    b = R[r, R_HLAST]
    for _ in range(hit):
        nb = par[b]
        blk[b, K_REF] -= 1
        if blk[b, K_REF] == 0:
            if blk[b, K_DPREV] != UNCACHED:
                _free_append(st, blk, b)
            else:  # pragma: no cover - a hit block is always cached
                scratch[nfirst] = b
                nfirst += 1
        b = nb
    for k in range(nfirst - 1, -1, -1):  # the first one met ends at the head
        _free_prepend(st, blk, scratch[k])
    R[r, R_HIT] = 0
    R[r, R_HLAST] = -1
    R[r, R_NEXT] = 0
    R[r, R_NOWN] = 0
    R[r, R_OHEAD] = -1
    R[r, R_OTAIL] = -1
    R[r, R_CPTR] = -1
    R[r, R_NCACHED] = 0
