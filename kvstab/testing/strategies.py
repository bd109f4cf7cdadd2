"""Hypothesis strategies for adversarial workloads (public, for users' own tests).

The property suite (``props/``) draws its inputs from here, and so can a user
auditing a scheduler in their own test tree::

    from hypothesis import given
    from kvstab.testing.strategies import arrivals, model_params

    @given(params=model_params(), data=st.data())
    def test_mine(params, data):
        plan = data.draw(arrivals(params))
        ...

Plain uniform draws almost never hit the cases where schedulers break, so
every strategy here mixes in the adversarial corners on purpose:

* ``s + o`` equal to or just below ``M`` (one request fills the server);
* ``s`` one above or below a multiple of ``ŝ`` (a partial last chunk);
* ``s = 1`` and ``o = 1``;
* bimodal and heavy-tailed lengths, strongly correlated ``s`` and ``o``;
* bursts of simultaneous arrivals and empty gaps between them;
* sets of requests that arrive together and whose block-rounded peaks (or
  first chunks) sum to exactly ``M`` or one block either side, with several
  finishing in the same slot (:func:`packed_arrivals`): an admission test off
  by one token overflows only there;
* the queue window the engine shows a rule (:func:`windows`).

Each corner is a separate branch of ``st.one_of`` and the simplest branch
comes first, so a failing example shrinks toward small, plain requests.
Names follow Hypothesis: plural nouns, ``min_value``/``max_value``,
``min_size``/``max_size``.
"""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, Request, tokens_held
from kvstab.workload import Fixed, Geometric, Uniform, Workload

__all__ = [
    "model_params",
    "request_lengths",
    "workloads",
    "arrivals",
    "scenarios",
    "saturated_scenarios",
    "packed_arrivals",
    "windows",
    "largest_total",
]


def largest_total(params: ModelParams) -> int:
    """The largest ``s + o`` whose block-rounded peak still fits in ``M``."""
    return (params.M // params.block) * params.block


def model_params(
    *,
    min_M: int = 8,
    max_M: int = 256,
    max_chunk: int = 64,
    blocks: tuple[int, ...] = (1, 1, 2, 4, 16),
    max_num_seqs: bool = False,
) -> st.SearchStrategy[ModelParams]:
    """Servers with small ``M`` (so that a few requests fill them) and chunks
    that rarely divide the prompt lengths.

    ``blocks`` lists the allocation granularities to draw from (1 is listed
    twice so that the block-free model is drawn most often); a block larger
    than ``M/2`` is skipped.  ``max_num_seqs=True`` also draws running caps.
    """
    if min_M < 2 or max_M < min_M:
        raise InvalidArgument(f"model_params needs 2 <= min_M <= max_M, got min_M={min_M}, max_M={max_M}")

    return _model_params(min_M, max_M, max_chunk, blocks, max_num_seqs)


# The composites are defined once, at module level, and take their settings as
# arguments: ``st.composite`` reads its function's source (``inspect.getsource``,
# milliseconds), and strategies built per example (a server drawn inside a
# scenario) paid that on every example and every shrink step.
@st.composite
def _model_params(draw: st.DrawFn, min_M: int, max_M: int, max_chunk: int, blocks: tuple[int, ...],
                  max_num_seqs: bool) -> ModelParams:
    M = draw(st.integers(min_M, max_M))
    # chunk = M is the "no chunked prefill" server: a whole prompt in one slot
    chunk = draw(st.one_of(st.integers(1, max(1, min(max_chunk, M))), st.just(M)))
    block = draw(st.sampled_from([b for b in blocks if 2 * b <= M] or [1]))
    seqs = draw(st.none() | st.integers(1, 8)) if max_num_seqs else None
    return ModelParams(M=M, chunk=chunk, block=block, max_num_seqs=seqs)


def request_lengths(
    params: ModelParams,
    *,
    min_value: int = 1,
    max_value: int | None = None,
) -> st.SearchStrategy[Request]:
    """Single requests ``(s, o)`` with ``min_value ≤ s, o`` and peak
    ``s + o ≤ max_value`` (default: the largest peak that fits in ``M``).

    The draw mixes plain uniform lengths with the corners listed in the module
    docstring: ``o = 1``, ``s = 1``, ``s = k·ŝ ± 1``, ``s + o`` at or just below
    the maximum, and strongly correlated or heavy-tailed pairs.
    """
    return _request_lengths(params, min_value, max_value)


# One strategy per server and bounds, built once: the stateful machine draws a request for its
# server on every rule, and building this one_of anew each time made Hypothesis validate it again
# (most of a shrink's time went there).
@functools.lru_cache(maxsize=512)
def _request_lengths(params: ModelParams, min_value: int, max_value: int | None) -> st.SearchStrategy[Request]:
    top = largest_total(params) if max_value is None else int(max_value)
    if top > largest_total(params):
        raise InvalidArgument(
            f"request_lengths: max_value={top} exceeds what fits in M={params.M} (block {params.block})"
        )
    if min_value < 1 or 2 * min_value > top:
        raise InvalidArgument(f"request_lengths needs 1 <= 2*min_value <= max_value, got {min_value}, {top}")
    lo, chunk = int(min_value), params.chunk

    def pair(s: int, o: int) -> Request:
        # clamp into the box [lo, top - lo] x [lo, top - s] so every branch is valid
        s = min(max(s, lo), top - lo)
        o = min(max(o, lo), top - s)
        return Request(s, o)

    plain = st.builds(pair, st.integers(lo, top - lo), st.integers(lo, top - lo))
    tiny = st.builds(pair, st.just(lo), st.integers(lo, top - lo)) | st.builds(
        pair, st.integers(lo, top - lo), st.just(lo)
    )
    # a prompt one token off a chunk boundary: the last chunk is partial (or one token)
    off_chunk = st.builds(
        lambda k, d, o: pair(k * chunk + d, o),
        st.integers(1, max(1, top // chunk)),
        st.sampled_from([-1, 1]),
        st.integers(lo, top),
    )
    # one request fills (or nearly fills) the whole server, its prompt alone included
    near_full = st.builds(
        lambda s, slack: pair(s, top - slack - s),
        st.one_of(st.integers(lo, top - lo), st.just(top - lo)),
        st.integers(0, 2),
    )
    # strongly correlated: o proportional to s (both long or both short)
    correlated = st.builds(
        lambda s, r: pair(s, max(lo, int(s * r))),
        st.integers(lo, max(lo, top // 2)),
        st.sampled_from([0.5, 1.0, 2.0]),
    )
    # heavy tail: lengths ~ 2^U, most short, a few near the top
    heavy = st.builds(
        lambda e1, e2: pair(int(2 ** e1), int(2 ** e2)),
        st.floats(0, np.log2(max(2, top)), allow_nan=False),
        st.floats(0, np.log2(max(2, top)), allow_nan=False),
    )
    return st.one_of(plain, tiny, off_chunk, near_full, correlated, heavy)


def workloads(
    params: ModelParams,
    *,
    min_value: int = 1,
    max_value: int | None = None,
    max_size: int = 64,
) -> st.SearchStrategy[Workload]:
    """Length laws :class:`~kvstab.workload.Workload` whose support fits in ``M``
    (peak ``s + o ≤ max_value``).

    Independent marginals (uniform, constant, truncated geometric: a heavy
    right tail), and joint empirical laws of up to ``max_size`` rows drawn from
    :func:`request_lengths` — which is how bimodal and strongly correlated
    ``(s, o)`` laws arise.
    """
    top = largest_total(params) if max_value is None else int(max_value)
    half = max(min_value, top // 2)

    def marginal() -> st.SearchStrategy[Uniform | Fixed | Geometric]:
        uni = st.tuples(st.integers(min_value, half), st.integers(min_value, half)).map(
            lambda ab: Uniform(min(ab), max(ab))
        )
        const = st.integers(min_value, half).map(Fixed)
        geo = st.floats(0.02, 0.9).map(lambda p: Geometric(p, half)) if min_value == 1 else const
        return st.one_of(uni, const, geo)

    independent = st.builds(lambda s, o: Workload(s=s, o=o), marginal(), marginal())
    joint = st.lists(
        request_lengths(params, min_value=min_value, max_value=top), min_size=1, max_size=max_size
    ).map(lambda rs: Workload.joint([r.s for r in rs], [r.o for r in rs], name="drawn-joint"))
    # bimodal: two request kinds (e.g. short chat and long documents) mixed
    bimodal = st.tuples(
        request_lengths(params, min_value=min_value, max_value=top),
        request_lengths(params, min_value=min_value, max_value=top),
        st.integers(1, 9),
    ).map(
        lambda t: Workload.joint(
            [t[0].s] * t[2] + [t[1].s] * (10 - t[2]), [t[0].o] * t[2] + [t[1].o] * (10 - t[2]), name="bimodal"
        )
    )
    return st.one_of(independent, bimodal, joint)


def arrivals(
    params: ModelParams,
    *,
    min_size: int = 1,
    max_size: int = 8,
    max_gap: int = 40,
    lengths: st.SearchStrategy[Request] | None = None,
) -> st.SearchStrategy[ArrivalPlan]:
    """Arrival plans of ``min_size``–``max_size`` requests.

    Each request arrives ``gap`` slots after the previous one; a gap of 0 puts
    it in the same slot (a burst) and gaps up to ``max_gap`` leave the server
    empty for a while.  Gaps shrink toward 0 (everything in slot 0) and lengths
    toward small requests, so a counterexample shrinks to a short burst.
    ``lengths`` overrides the per-request strategy (default
    :func:`request_lengths`).
    """
    if min_size < 0 or max_size < min_size:
        raise InvalidArgument(f"arrivals needs 0 <= min_size <= max_size, got {min_size}, {max_size}")
    reqs = lengths if lengths is not None else request_lengths(params)
    gap = st.one_of(st.just(0), st.integers(0, 3), st.integers(0, max(0, max_gap)))
    return st.lists(st.tuples(gap, reqs), min_size=min_size, max_size=max_size).map(_plan)


def _plan(rows: list[tuple[int, Request]]) -> ArrivalPlan:
    slot = np.cumsum([g for g, _ in rows], dtype=np.int64) if rows else np.zeros(0, dtype=np.int64)
    return ArrivalPlan(
        np.asarray(slot, dtype=np.int64),
        np.asarray([r.s for _, r in rows], dtype=np.int64),
        np.asarray([r.o for _, r in rows], dtype=np.int64),
    )


def scenarios(
    *,
    min_M: int = 8,
    max_M: int = 256,
    min_size: int = 1,
    max_size: int = 8,
    max_gap: int = 40,
    max_num_seqs: bool = False,
) -> st.SearchStrategy[tuple[ModelParams, ArrivalPlan]]:
    """A server from :func:`model_params` and an arrival plan that fits it —
    from :func:`arrivals`, or (when ``max_size ≥ 2``) a packed set from
    :func:`packed_arrivals`: the input of one audited run."""

    return _scenarios(min_M, max_M, min_size, max_size, max_gap, max_num_seqs)


@st.composite
def _scenarios(draw: st.DrawFn, min_M: int, max_M: int, min_size: int, max_size: int, max_gap: int,
               max_num_seqs: bool) -> tuple[ModelParams, ArrivalPlan]:
    params = draw(model_params(min_M=min_M, max_M=max_M, max_num_seqs=max_num_seqs))
    plans = arrivals(params, min_size=min_size, max_size=max_size, max_gap=max_gap)
    if max_size >= 2:
        # sets whose totals meet M exactly: rare under independent draws
        plans = plans | packed_arrivals(params, min_size=max(2, min_size), max_size=min(4, max_size))
    return params, draw(plans)


def saturated_scenarios(
    *,
    min_M: int = 64,
    max_M: int = 512,
    max_per_slot: int = 6,
    max_slots: int = 10,
) -> st.SearchStrategy[tuple[ModelParams, ArrivalPlan]]:
    """A server kept busy by many small requests: peaks at most ``M/8``,
    ``2 … max_per_slot`` arrivals in each of ``3 … max_slots`` consecutive slots.

    Only on such a workload is a margin ``Δ`` of one peak small against ``M``,
    so that the drift bound (property 6) sees memory left idle while requests
    wait; with a few large requests a policy can hide idleness inside ``Δ``
    (a policy that stops admitting at ``3M/4`` passed every other draw).
    No running cap is drawn: a cap voids the margin.
    """
    if min_M < 16 or max_M < min_M:
        raise InvalidArgument(f"saturated_scenarios needs 16 <= min_M <= max_M, got {min_M}, {max_M}")

    return _saturated_scenarios(min_M, max_M, max_per_slot, max_slots)


@st.composite
def _saturated_scenarios(draw: st.DrawFn, min_M: int, max_M: int, max_per_slot: int,
                         max_slots: int) -> tuple[ModelParams, ArrivalPlan]:
    params = draw(model_params(min_M=min_M, max_M=max_M, blocks=(1, 1, 2, 4)))
    small = max(2, largest_total(params) // 8)
    per_slot = draw(st.integers(2, max(2, max_per_slot)))
    slots = draw(st.integers(3, max(3, max_slots)))
    reqs = draw(st.lists(request_lengths(params, max_value=small), min_size=per_slot * slots,
                         max_size=per_slot * slots))
    rows = [(0 if i % per_slot else (1 if i else 0), r) for i, r in enumerate(reqs)]
    return params, _plan(rows)


def windows(*, min_value: int = 1, max_value: int = 8) -> st.SearchStrategy[int]:
    """Queue windows: how many queue-head entries the engine shows a rule
    (``Engine(window=…)``).  Shrinks toward ``max_value`` (the engine's default
    8), so a failure that needs a short window keeps it and says so."""
    if min_value < 1 or max_value < min_value:
        raise InvalidArgument(f"windows needs 1 <= min_value <= max_value, got {min_value}, {max_value}")
    return st.one_of(st.just(max_value), st.integers(min_value, max_value))


def packed_arrivals(
    params: ModelParams,
    *,
    min_size: int = 2,
    max_size: int = 4,
    max_slot: int = 3,
) -> st.SearchStrategy[ArrivalPlan]:
    """``min_size``–``max_size`` requests arriving (mostly) in one slot whose totals meet
    ``M``: their block-rounded peaks (``tokens_held(s + o)``), or their
    block-rounded first chunks, sum to ``M``'s blocks or one block either side
    (``M ± 1`` tokens without blocks).

    When the arithmetic allows it the requests also finish in the same slot
    (equal ``n(s) + o``), so that their peaks coincide: a rule whose peak or
    first chunk is off by one token admits them all and overflows ``M``.
    """
    if min_size < 2 or max_size < min_size:
        raise InvalidArgument(f"packed_arrivals needs 2 <= min_size <= max_size, got {min_size}, {max_size}")
    return _packed_arrivals(params, min_size, max_size, max_slot)


@st.composite
def _packed_arrivals(draw: st.DrawFn, params: ModelParams, min_size: int, max_size: int,
                     max_slot: int) -> ArrivalPlan:
    top, B, chunk = largest_total(params), params.block, params.chunk
    blocks_in_M = params.M // B
    # one block over M is the overflow corner, so it is drawn most often
    target = blocks_in_M + draw(st.sampled_from([1, 0, 1, -1]))
    by_first_chunk = draw(st.sampled_from([False, False, False, True]))  # peaks, or first chunks
    # each part, in blocks: at least 2 tokens (s, o ≥ 1) and at most what fits
    least = -(-2 // B)
    most = (top - 1) // B if by_first_chunk else top // B
    if by_first_chunk:
        most = min(most, max(least, int(tokens_held(chunk, B)) // B))
    k = draw(st.integers(min_size, max_size))
    k = max(1, min(k, target // least))
    target = min(target, k * most)
    parts = _split(draw, target, k, least, most)
    if by_first_chunk:
        rows = [_with_first_chunk(draw, b * B, params) for b in parts]
    else:
        # a peak on a block boundary, or one token past the previous one (the corners of rounding)
        under = st.sampled_from([0, B - 1]) | st.integers(0, B - 1)
        rows = _same_finish(draw, [b * B - draw(under) for b in parts], params)
    slot = draw(st.integers(0, max(0, max_slot)))
    # all together, or the last one a few slots later, into a busy server
    late = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))
    return ArrivalPlan(
        np.asarray([slot] * (len(rows) - 1) + [slot + late], dtype=np.int64),
        np.asarray([r.s for r in rows], dtype=np.int64),
        np.asarray([r.o for r in rows], dtype=np.int64),
    )


def _split(draw: st.DrawFn, total: int, k: int, least: int, most: int) -> list[int]:
    """``k`` integers in ``[least, most]`` summing to ``total`` (clamped into reach)."""
    total = min(max(total, k * least), k * most)
    if draw(st.booleans()):
        # near-equal parts: k copies of one request (give or take a block) are
        # the classic set that reaches its peaks together
        return [total // k + (1 if i < total % k else 0) for i in range(k)]
    parts = [least] * k
    left = total - k * least
    room = most - least
    for n, i in enumerate(draw(st.permutations(range(k)))):
        others = (k - 1 - n) * room  # what the parts after this one can still take
        add = draw(st.integers(max(0, left - others), min(left, room)))
        parts[i] += add
        left -= add
    return parts


def _same_finish(draw: st.DrawFn, peaks: list[int], params: ModelParams) -> list[Request]:
    """Requests with these peaks ``s + o`` that finish in the same slot when
    admitted together (equal ``n(s) + o``), or with ``s = 1`` when no such split exists."""
    p = [max(2, min(x, largest_total(params))) for x in peaks]
    chunk = params.chunk
    # the common n(s) + o; the largest value leaves the most room (o = L − n(s) ≥ 1)
    L = draw(st.just(min(p)) | st.integers(2, min(p)))
    out: list[Request] = []
    for peak in p:
        # s − n(s) rises by 0 or 1 per token, so it takes every value from 0 up
        v = peak - L
        s = next((c for c in range(1, peak) if c - -(-c // chunk) == v), None)
        if s is None or peak - s < 1:
            return [Request(1, x - 1) for x in p]
        out.append(Request(s, peak - s))
    return out


def _with_first_chunk(draw: st.DrawFn, first: int, params: ModelParams) -> Request:
    """A request whose first chunk holds ``first`` tokens (block-rounded) and that fits ``M``."""
    top, chunk, B = largest_total(params), params.chunk, params.block
    c = max(1, min(first - draw(st.integers(0, B - 1)), chunk, top - 1))
    s = c if c < chunk else draw(st.integers(c, max(c, top - 1)))
    o = draw(st.integers(1, max(1, top - s)))
    return Request(s, o)
