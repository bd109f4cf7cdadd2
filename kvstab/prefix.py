"""Prompt content with prefix structure: segments, block-hash chains, token ids.

A prompt is a sequence of **segments** ``(content, length)``: ``content`` is a
64-bit content id, ``length ≥ 1`` tokens.  Token ``j`` of a segment is the
token ``(content, j)`` — offsets restart at 0 in every segment — so two prompts
hold the same token at a position exactly when their segments up to there
agree, and they share:

* the tokens of their common segment prefix, and
* of the first segment where they differ, ``min`` of the two lengths when both
  have the same content id (one is a truncation of the other: a Mooncake
  prompt whose last 512-token hash block is partial), else nothing.

:func:`common_prefix` is that count — what SGLang's token-granular radix tree
matches.  :func:`block_hashes` is what vLLM computes for block size ``B``: one
hash per **full** block of the prompt (``⌊s/B⌋`` of them), block ``k``'s hash a
function of block ``k − 1``'s hash and block ``k``'s tokens, so equal chains up
to block ``k`` mean equal tokens up to ``(k + 1)·B`` (up to 64-bit collisions).
The hash is deterministic across processes and machines (no salted
``hash()``).  :func:`token_ids` turns the tokens into real vocabulary ids, the
same ids for the same ``(content, j)``, to feed vLLM's and SGLang's own
schedulers the same prefix structure.

At scale a plan's prompts are one :class:`PromptSet`: three flat int64 arrays
(per-request offsets into the segment arrays), and
:meth:`PromptSet.block_hashes` gives every request's chain at once as a ragged
array, vectorised (no Python loop per block).

The chain, exactly (all arithmetic mod 2⁶⁴; ``fmix`` is MurmurHash3's 64-bit
finaliser, a bijection)::

    piece  = a maximal run of one segment inside one block:
             (content c, first offset j, length n, position in the block q)
    mix    = fmix(fmix(fmix(c + K0) + j·K1) + (n·B + q)·K2)      (n·B + q is exact: 1 ≤ n ≤ B, q < B)
    d_k    = Σ over block k's pieces of mix
    P_k    = R·P_{k−1} + d_k,  P_{−1} = SEED
    h_k    = fmix(P_k)          (as a signed int64)

(``K0 … K2``, ``R``, ``SEED``: the module's constants.)

Since ``fmix`` is invertible, ``h_k`` is a function of ``(h_{k−1}, block k's
content)``: a chain, as vLLM's ``hash(parent, tokens)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.validation import MAX_TOKENS, positive_int

__all__ = [
    "Prompt",
    "PromptSet",
    "block_hashes",
    "token_ids",
    "common_prefix",
    "concat",
    "content_ids",
    "content_id",
    "CONTENT_KINDS",
    "chain_constants",
    "segment_digests",
]

IntArray = npt.NDArray[np.int64]
_U = np.uint64
_MASK = (1 << 64) - 1

# MurmurHash3 fmix64 constants, and odd multipliers for the fields of a piece
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_K = (0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93, 0xA0761D6478BD642F, 0xE7037ED1A0B428DB, 0x8EBC6AF09C88C6E3)
#: the chain's multiplier (odd, so it has an inverse mod 2⁶⁴, which the vectorised chain uses)
_R = 0x100000001B3 | 1
_R_INV = pow(_R, -1, 1 << 64)
_SEED = 0x6A09E667F3BCC909

#: namespaces of content ids, so ids made for different purposes never meet
CONTENT_KINDS: dict[str, int] = {
    "own": 1,  # a request's own tokens (unique to it)
    "mooncake": 2,  # a Mooncake trace's 512-token hash block
    "shared": 3,  # a system prompt every request shares
    "tenant": 4,  # one tenant's system prompt
    "fewshot-header": 5,  # the instruction all few-shot templates share
    "fewshot": 6,  # one few-shot template's examples
    "message": 7,  # a user message of a conversation
    "answer": 8,  # an answer (a request's output) of a conversation
    "output": 9,  # a request's output tokens
}


def _fmix_int(x: int) -> int:
    x &= _MASK
    x ^= x >> 33
    x = (x * _C1) & _MASK
    x ^= x >> 33
    x = (x * _C2) & _MASK
    return x ^ (x >> 33)


def _fmix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """fmix64 of each element, in place (callers pass an array of their own)."""
    t = x >> _U(33)
    x ^= t
    x *= _U(_C1)
    np.right_shift(x, _U(33), out=t)
    x ^= t
    x *= _U(_C2)
    np.right_shift(x, _U(33), out=t)
    x ^= t
    return x


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def content_id(kind: str, *keys: int) -> int:
    """A content id (signed int64) for ``keys`` in the namespace ``kind`` of
    :data:`CONTENT_KINDS`: deterministic, and different kinds or keys give
    different ids (up to 64-bit collisions)."""
    if kind not in CONTENT_KINDS:
        raise InvalidArgument(f"content kind {kind!r} is not one of {', '.join(CONTENT_KINDS)}")
    x = _fmix_int(CONTENT_KINDS[kind] * _K[0])
    for k in keys:
        x = _fmix_int(x + (int(k) & _MASK) * _K[1])
    return _signed(x)


def content_ids(kind: str, keys: npt.ArrayLike) -> IntArray:
    """:func:`content_id` of ``kind`` for each key of an int array (one key each), vectorised."""
    if kind not in CONTENT_KINDS:
        raise InvalidArgument(f"content kind {kind!r} is not one of {', '.join(CONTENT_KINDS)}")
    base = _U(_fmix_int(CONTENT_KINDS[kind] * _K[0]))
    k = np.asarray(keys, dtype=np.int64).view(np.uint64)
    return _fmix(base + k * _U(_K[1])).view(np.int64)


def chain_constants() -> tuple[int, int, int, int]:
    """The chain's constants ``(R, SEED, K1, K2)`` (module docstring), for a compiled
    engine that hashes blocks itself: ``mix = fmix(fmix(d + j·K1) + (n·B + q)·K2)`` with
    ``d`` = :func:`segment_digests` of the piece's segment, ``P_k = R·P_{k−1} + Σ mix``,
    ``P_{−1} = SEED``, ``h_k = fmix(P_k)`` (all mod 2⁶⁴)."""
    return _R, _SEED, _K[1], _K[2]


def segment_digests(content: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """``fmix(c + K0)`` of each segment's content id ``c``: the part of a piece's mix that
    depends on its segment alone (see :func:`chain_constants`)."""
    c = np.array(content, dtype=np.int64).view(np.uint64)
    return _fmix(c + _U(_K[0]))


def _piece_int(content: int, first: int, length: int, pos: int, block: int) -> int:
    # (length, pos) packs exactly into length·B + pos: 1 ≤ length ≤ B, 0 ≤ pos < B
    x = _fmix_int(_fmix_int((content & _MASK) + _K[0]) + first * _K[1])
    return _fmix_int(x + (length * block + pos) * _K[2])


def _piece(
    content_hash: npt.NDArray[np.uint64], first: IntArray, length: IntArray, pos: IntArray, block: int
) -> npt.NDArray[np.uint64]:
    """:func:`_piece_int` of many pieces; ``content_hash`` is ``fmix(content + K0)``, made once per segment."""
    x = _fmix(content_hash + first.view(np.uint64) * _U(_K[1]))
    return _fmix(x + (length * block + pos).view(np.uint64) * _U(_K[2]))


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt's content: segments ``(content id, length in tokens)`` in order."""

    segments: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        segs: list[tuple[int, int]] = []
        for i, seg in enumerate(self.segments):
            c, n = seg
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not -(1 << 63) <= int(c) < 1 << 63:
                raise InvalidArgument(f"prompt segment {i}: content id {c!r} is not a 64-bit integer")
            segs.append((int(c), positive_int(f"prompt segment {i}: length", n, maximum=MAX_TOKENS)))
        object.__setattr__(self, "segments", tuple(segs))

    @property
    def s(self) -> int:
        """The prompt's length in tokens."""
        return sum(n for _, n in self.segments)

    def extended(self, content: int, length: int) -> Prompt:
        """This prompt followed by one more segment (a conversation's next turn,
        or a request's output tokens, whose full blocks vLLM caches as well)."""
        return Prompt((*self.segments, (content, length)))


def block_hashes(prompt: Prompt, block: int) -> tuple[int, ...]:
    """The chain of block hashes vLLM would compute for ``prompt`` with block
    size ``block``: one signed 64-bit hash per full block (``⌊s/B⌋`` of them)."""
    B = positive_int("block size B", block, maximum=MAX_TOKENS)
    out: list[int] = []
    state = _SEED
    digest = 0
    pos = 0  # tokens of the current block seen so far
    for c, n in prompt.segments:
        j = 0
        while j < n:
            take = min(n - j, B - pos)
            digest = (digest + _piece_int(c, j, take, pos, B)) & _MASK
            j += take
            pos += take
            if pos == B:
                state = (state * _R + digest) & _MASK
                out.append(_signed(_fmix_int(state)))
                digest, pos = 0, 0
    return tuple(out)


def token_ids(prompt: Prompt, vocab: int) -> IntArray:
    """Real token ids in ``[0, vocab)``, one per token, a deterministic function
    of ``(content, offset)``.  Different contents give the same id with
    probability ``1/vocab``, so a token-granular radix match may run a token
    past the true common prefix that often; a whole block of ``B`` tokens
    coincides with probability ``vocab^-B`` (never, in practice)."""
    v = positive_int("vocab", vocab, maximum=2**62)
    if not prompt.segments:
        return np.zeros(0, dtype=np.int64)
    c = np.array([c for c, _ in prompt.segments], dtype=np.int64)
    n = np.array([n for _, n in prompt.segments], dtype=np.int64)
    return _token_ids(c, n, v)


def _token_ids(content: IntArray, length: IntArray, vocab: int) -> IntArray:
    starts = np.cumsum(length) - length
    offset = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(starts, length)
    x = _fmix(np.repeat(content, length).view(np.uint64) + _U(_K[4]))
    x = _fmix(x + offset.astype(np.uint64) * _U(_K[1]))
    return (x % _U(vocab)).astype(np.int64)


def common_prefix(a: Prompt, b: Prompt) -> int:
    """How many leading tokens the two prompts share (SGLang's radix match, exact)."""
    shared = 0
    for (ca, na), (cb, nb) in zip(a.segments, b.segments, strict=False):
        if ca != cb:
            break
        shared += min(na, nb)
        if na != nb:
            break
    return shared


@dataclass(frozen=True, slots=True, eq=False)
class PromptSet:
    """The prompts of many requests, as a ragged array: request ``i``'s segments
    are ``content[offsets[i]:offsets[i+1]]`` with lengths ``length[…]``.

    ``output`` (optional) is the content id of each request's output tokens, so
    that a block pool can hash the full blocks a request fills while decoding
    (vLLM caches those too): a conversation's next turn names its previous
    answer with the same id.  ``None`` means every output is unique.
    """

    offsets: IntArray
    content: IntArray
    length: IntArray
    output: IntArray | None = None

    def __post_init__(self) -> None:
        off = np.asarray(self.offsets, dtype=np.int64)
        c = np.asarray(self.content, dtype=np.int64)
        n = np.asarray(self.length, dtype=np.int64)
        if off.ndim != 1 or off.size < 1 or off[0] != 0 or off[-1] != c.size or c.shape != n.shape:
            raise InvalidArgument("prompt set: offsets must run from 0 to the number of segments, one per request plus one")
        if np.any(np.diff(off) < 1):
            raise InvalidArgument(f"prompt set: request {int(np.argmax(np.diff(off) < 1))} has no segments")
        if n.size and n.min() < 1:
            raise InvalidArgument(f"prompt set: segment {int(np.argmin(n))} has length {int(n.min())}; lengths are >= 1")
        object.__setattr__(self, "offsets", off)
        object.__setattr__(self, "content", c)
        object.__setattr__(self, "length", n)
        if self.output is not None:
            out = np.asarray(self.output, dtype=np.int64)
            if out.shape != (off.size - 1,):
                raise InvalidArgument("prompt set: output needs one content id per request")
            object.__setattr__(self, "output", out)

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    @staticmethod
    def from_prompts(prompts: Iterable[Prompt], output: Sequence[int] | None = None) -> PromptSet:
        """A set of the given prompts, in order."""
        segs = [p.segments for p in prompts]
        off = np.concatenate(([0], np.cumsum([len(x) for x in segs]))).astype(np.int64)
        flat = [seg for x in segs for seg in x]
        c = np.array([c for c, _ in flat], dtype=np.int64)
        n = np.array([n for _, n in flat], dtype=np.int64)
        return PromptSet(off, c, n, None if output is None else np.asarray(output, dtype=np.int64))

    def prompt(self, i: int) -> Prompt:
        """Request ``i``'s prompt."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return Prompt(tuple(zip(self.content[a:b].tolist(), self.length[a:b].tolist(), strict=True)))

    def lengths(self) -> IntArray:
        """Each request's prompt length ``s``."""
        return np.add.reduceat(self.length, self.offsets[:-1]) if len(self) else np.zeros(0, dtype=np.int64)

    def take(self, index: npt.ArrayLike) -> PromptSet:
        """The prompts of the requests ``index`` (an int array or a boolean mask), in that order."""
        idx = np.asarray(index)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        counts = self.offsets[idx + 1] - self.offsets[idx]
        start = np.repeat(self.offsets[idx] - (np.cumsum(counts) - counts), counts)
        seg = np.arange(int(counts.sum()), dtype=np.int64) + start
        off = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        out = None if self.output is None else self.output[idx]
        return PromptSet(off, self.content[seg], self.length[seg], out)

    def with_outputs(self, o: npt.ArrayLike) -> PromptSet:
        """Each prompt followed by its request's ``o[i]`` output tokens (content
        ``output[i]``, or an id unique to the request when ``output`` is
        ``None``): :meth:`block_hashes` of it is the chain of every full block
        a request holds at its end, generated tokens included, as vLLM caches
        them.  A conversation's next turn starts with exactly these blocks."""
        out_len = np.asarray(o, dtype=np.int64)
        n = len(self)
        if out_len.shape != (n,):
            raise InvalidArgument(f"with_outputs needs one output length per request ({n}), got shape {out_len.shape}")
        if n and out_len.min() < 1:
            raise InvalidArgument(f"with_outputs: output length {int(out_len.min())}; lengths are >= 1")
        out = self.output if self.output is not None else content_ids("output", np.arange(n, dtype=np.int64))
        per = np.diff(self.offsets) + 1
        off = np.concatenate(([0], np.cumsum(per))).astype(np.int64)
        last = off[1:] - 1
        content = np.empty(int(off[-1]), dtype=np.int64)
        length = np.empty(int(off[-1]), dtype=np.int64)
        body = np.ones(content.size, dtype=bool)
        body[last] = False
        content[body], length[body] = self.content, self.length
        content[last], length[last] = out, out_len
        return PromptSet(off, content, length, self.output)

    def token_ids(self, i: int, vocab: int) -> IntArray:
        """:func:`token_ids` of request ``i``'s prompt."""
        v = positive_int("vocab", vocab, maximum=2**62)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return _token_ids(self.content[a:b], self.length[a:b], v)

    def block_hashes(self, block: int, start: int = 0, stop: int | None = None) -> tuple[IntArray, IntArray]:
        """The block-hash chains of requests ``start … stop − 1``, all at once:
        ``(offsets, hashes)`` with request ``start + i``'s chain
        ``hashes[offsets[i]:offsets[i+1]]``, equal to :func:`block_hashes` of
        its prompt.  Memory is linear in the blocks asked for: ask in ranges
        for a very long plan."""
        B = positive_int("block size B", block, maximum=MAX_TOKENS)
        stop = len(self) if stop is None else stop
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        c, n = self.content[a:b], self.length[a:b]
        req_seg = self.offsets[start : stop + 1] - a
        nreq = stop - start
        # token position of each segment inside its prompt
        seg_req = np.repeat(np.arange(nreq, dtype=np.int64), np.diff(req_seg))
        ends = np.cumsum(n)
        req_tok0 = np.concatenate(([0], ends))[req_seg[:-1]]
        seg_start = ends - n - req_tok0[seg_req]
        seg_end = seg_start + n
        s = seg_end[req_seg[1:] - 1] if nreq else np.zeros(0, dtype=np.int64)
        full = s // B  # full blocks per request
        # only tokens inside full blocks count: clip each segment to its prompt's last full block
        limit = full[seg_req] * B
        end_c = np.minimum(seg_end, limit)
        live = end_c > seg_start
        first_blk = seg_start // B
        npieces = np.where(live, (end_c - 1) // B - first_blk + 1, 0)
        piece_seg = np.repeat(np.arange(c.size, dtype=np.int64), npieces)
        k = np.arange(int(npieces.sum()), dtype=np.int64) - np.repeat(np.cumsum(npieces) - npieces, npieces)
        blk = first_blk[piece_seg] + k
        p0 = np.maximum(seg_start[piece_seg], blk * B)
        p1 = np.minimum(end_c[piece_seg], (blk + 1) * B)
        chash = _fmix(c.view(np.uint64) + _U(_K[0]))
        first = p0 - seg_start[piece_seg]
        d_piece = _piece(chash[piece_seg], first, p1 - p0, p0 - blk * B, B)
        offsets = np.concatenate(([0], np.cumsum(full))).astype(np.int64)
        total = int(offsets[-1])
        if total == 0:
            return offsets, np.zeros(0, dtype=np.int64)
        # global block index of each piece; pieces come in block order, so a block's pieces are contiguous
        gblk = offsets[seg_req[piece_seg]] + blk
        # every full block has at least one piece: sum each run of equal block indices
        d = np.add.reduceat(d_piece, np.flatnonzero(np.diff(gblk, prepend=-1)))
        # P_k = R·P_{k−1} + d_k, P_{−1} = SEED: fold R·SEED into each chain's first d, then
        # P = R^g·Σ_{g0≤g'≤g} d_{g'}·R^{−g'} from one cumulative sum (g: global block index, g0: the chain's first)
        has = full > 0
        starts = offsets[:-1][has]
        d[starts] += _U((_R * _SEED) & _MASK)
        rpow = np.cumprod(np.full(total, _R, dtype=np.uint64), dtype=np.uint64) * _U(_R_INV)  # R^g
        rinv = np.cumprod(np.full(total, _R_INV, dtype=np.uint64), dtype=np.uint64) * _U(_R)  # R^-g
        acc = np.cumsum(d * rinv, dtype=np.uint64)
        before = np.zeros(starts.size, dtype=np.uint64)
        before[starts > 0] = acc[starts[starts > 0] - 1]
        acc -= np.repeat(before, full[has])
        return offsets, _fmix(rpow * acc).view(np.int64)


def concat(sets: Sequence[PromptSet]) -> PromptSet:
    """The requests of several prompt sets, one after another."""
    if not sets:
        raise InvalidArgument("concat needs at least one prompt set")
    shift = np.cumsum([0] + [int(p.offsets[-1]) for p in sets[:-1]])
    off = np.concatenate([sets[0].offsets[:1]] + [p.offsets[1:] + sh for p, sh in zip(sets, shift, strict=True)])
    outs = [p.output for p in sets if p.output is not None]
    output = np.concatenate(outs) if len(outs) == len(sets) else None
    return PromptSet(
        off, np.concatenate([p.content for p in sets]), np.concatenate([p.length for p in sets]), output
    )
