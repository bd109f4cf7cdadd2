"""Arrival plans: which requests arrive in which slot.

A plan is three equal-length int64 arrays — arrival slot (non-decreasing),
``s`` and ``o`` — built from a seeded numpy ``Generator`` (Poisson(``λ·b̄``)
arrivals per slot) or from a trace of arrival times.  The same seed gives the
same plan, byte for byte: counts are drawn first, then all lengths at once.

A plan may also carry its requests' prompt content (``prompts``, a
:class:`~kvstab.prefix.PromptSet`, for prefix caching): drawn from the
workload's prefix law after the lengths (so the lengths are those of the plan
without it), or a trace's own ``hash_ids``.  Multi-turn conversations
(``prefix=chat(K,T)``) are not Poisson per request:
:func:`conversation_arrivals` starts conversations as a Poisson process and
sends each next turn a think time after the previous turn's *arrival* (open
loop: the plan is made before any run, so a turn does not wait for the
previous answer to finish; choose ``T`` above the response time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix import PromptSet
from kvstab.prefix_laws import Conversation
from kvstab.traces import Trace
from kvstab.workload import Workload

__all__ = [
    "ArrivalPlan",
    "poisson_arrivals",
    "conversation_arrivals",
    "trace_arrivals",
    "fixed_arrivals",
    "MAX_ARRIVAL_SLOT",
    "MAX_PLANNED",
]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class ArrivalPlan:
    """Requests in arrival order: ``slot[i]`` is when request ``i`` arrives;
    ``prompts`` (optional) is their prompt content, request ``i``'s prompt
    ``s[i]`` tokens long (``None``: no prefix structure, every prompt unique)."""

    slot: IntArray
    s: IntArray
    o: IntArray
    dropped: int = 0
    prompts: PromptSet | None = None

    def __post_init__(self) -> None:
        n = self.slot.size
        if self.s.size != n or self.o.size != n:
            raise InvalidArgument("arrival plan: slot, s and o must have the same length")
        if n and (np.any(np.diff(self.slot) < 0) or self.slot[0] < 0):
            raise InvalidArgument("arrival plan: arrival slots must be non-negative and non-decreasing")
        if n and (self.s.min() < 1 or self.o.min() < 1):
            i = int(np.argmin(np.minimum(self.s, self.o)))
            raise InvalidArgument(
                f"request {i} has s={int(self.s[i])}, o={int(self.o[i])}; lengths must be integers >= 1"
            )
        if self.prompts is not None:
            if len(self.prompts) != n:
                raise InvalidArgument(f"arrival plan: {len(self.prompts)} prompts for {n} requests")
            bad = np.flatnonzero(self.prompts.lengths() != self.s)
            if bad.size:
                i = int(bad[0])
                raise InvalidArgument(
                    f"arrival plan: request {i}'s prompt is {int(self.prompts.lengths()[i])} tokens but s={int(self.s[i])}"
                )

    def __len__(self) -> int:
        return int(self.slot.size)

    def fit_to(self, params: ModelParams, drop_oversize: bool = False) -> ArrivalPlan:
        """Check every request can ever be served (peak ``s + o`` fits in ``M``);
        with ``drop_oversize`` remove those that cannot and count them."""
        totals = self.s + self.o
        # one question per distinct total, asked of the model's own rule
        distinct = np.unique(totals)
        too_big = distinct[[not params.fits_total(int(x)) for x in distinct]]
        bad = np.isin(totals, too_big)
        if not bad.any():
            return self
        if not drop_oversize:
            i = int(np.argmax(bad))
            raise InvalidArgument(
                f"request {i} (s={int(self.s[i])}, o={int(self.o[i])}) needs {params.peak(int(totals[i]))} tokens at its peak "
                f"but M={params.M}: no scheduler can ever serve it (pass --drop-oversize to drop such requests)"
            )
        keep = ~bad
        prompts = self.prompts.take(keep) if self.prompts is not None else None
        return ArrivalPlan(
            self.slot[keep], self.s[keep], self.o[keep], dropped=self.dropped + int(bad.sum()), prompts=prompts
        )

    def area_check(self, params: ModelParams) -> int:
        """Largest peak memory of any request (for reports)."""
        if not len(self):
            return 0
        return params.peak(int((self.s + self.o).max()))


#: the latest slot a request may arrive in (far beyond any horizon; well inside int64)
MAX_ARRIVAL_SLOT = 10**15

#: the most requests a Poisson plan may be expected to hold (three int64
#: arrays of this length are ~1 GB; a larger run is a mistake, not a study)
MAX_PLANNED = 3 * 10**7


def _check_rate(rate: float, params: ModelParams, slots: int) -> None:
    bbar = params.bbar
    if not (isinstance(rate, (int, float)) and np.isfinite(rate) and rate > 0):
        raise InvalidArgument(f"arrival rate λ must be > 0 requests/s, got {rate!r}")
    if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
        raise InvalidArgument(f"slots must be a positive integer, got {slots!r}")
    expected = rate * bbar * slots
    if expected > MAX_PLANNED:
        raise InvalidArgument(
            f"λ·b̄·slots = {rate:g}·{bbar:g}·{slots} = {expected:.3g} expected arrivals, more than kvstab plans "
            f"({MAX_PLANNED:.0e}); lower the rate or the slots"
        )


def poisson_arrivals(
    workload: Workload, rate: float, params: ModelParams, slots: int, seed: int = 0
) -> ArrivalPlan:
    """Poisson(``rate·b̄``) arrivals in each of ``slots`` slots of the server
    ``params`` (only its ``b̄`` matters here; ``ModelParams(bbar=1.0)`` makes
    ``rate`` a rate per slot), lengths i.i.d. from ``workload``; with the
    workload's prefix law, the prompts too (a ``chat`` law: :func:`conversation_arrivals`)."""
    if isinstance(workload.prefix, Conversation):
        return conversation_arrivals(workload.prefix, rate, params, slots, seed)
    _check_rate(rate, params, slots)
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rate * params.bbar, size=slots)
    slot = np.repeat(np.arange(slots, dtype=np.int64), counts)
    s, o = workload.sample(rng, int(slot.size))
    s = np.asarray(s, dtype=np.int64)
    # drawn after the lengths, so the lengths are the plan's without the prefix law
    prompts = workload.prefix.prompts(rng, s) if workload.prefix is not None else None
    return ArrivalPlan(slot, s, np.asarray(o, dtype=np.int64), prompts=prompts)


def conversation_arrivals(
    law: Conversation, rate: float, params: ModelParams, slots: int, seed: int = 0
) -> ArrivalPlan:
    """Multi-turn conversations: ``rate`` requests per second on average.

    Conversations start as a Poisson process of rate ``rate / E[K]`` (uniform
    within their slot); turn ``k`` arrives an exponential think time of mean
    ``law.think`` seconds after turn ``k − 1``'s arrival (open loop).  Requests
    that would arrive at or after slot ``slots`` are cut (so conversations
    near the end lose their last turns).  Requests are in arrival order, ties
    kept in conversation order; request ``i``'s prompt holds its conversation's
    earlier messages and answers, and ``prompts.output`` names its answer."""
    _check_rate(rate, params, slots)
    bbar = params.bbar
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rate * bbar / law.mean_turns, size=slots)
    start_slot = np.repeat(np.arange(slots, dtype=np.int64), counts)
    start = (start_slot + rng.random(start_slot.size)) * bbar
    d = law.draw(rng, int(start_slot.size))
    when = law.turn_times(rng, d, start)
    slot = np.floor(when / bbar).astype(np.int64)
    order = np.argsort(when, kind="stable")
    order = order[slot[order] < slots]
    return ArrivalPlan(slot[order], d.s[order], d.o[order], prompts=d.prompts.take(order))


def trace_arrivals(trace: Trace, params: ModelParams, time_scale: float = 1.0) -> ArrivalPlan:
    """A trace's own arrival times mapped to the slots of the server ``params``:
    ``slot = ⌊t·time_scale / b̄⌋``."""
    if trace.arrival is None:
        raise InvalidArgument(f"trace {trace.path} records no arrival times; use Poisson arrivals (--rate)")
    bbar = params.bbar
    if not (time_scale > 0):
        raise InvalidArgument(f"time scale must be > 0, got {time_scale!r}")
    when = np.floor(np.asarray(trace.arrival, dtype=np.float64) * time_scale / bbar)
    if when.size and not (np.all(np.isfinite(when)) and when.min() >= 0 and when.max() <= MAX_ARRIVAL_SLOT):
        bad = int(np.argmax(~np.isfinite(when) | (when < 0) | (when > MAX_ARRIVAL_SLOT)))
        raise InvalidArgument(
            f"trace {trace.path}: request {bad} arrives at {float(trace.arrival[bad])!r} s, slot "
            f"{when[bad]!r} of b̄={bbar} s; arrival slots must lie in [0, {MAX_ARRIVAL_SLOT}]"
        )
    slot = when.astype(np.int64)
    return ArrivalPlan(slot, trace.s.copy(), trace.o.copy(), prompts=trace.prompts)


def fixed_arrivals(requests: list[tuple[int, int, int]]) -> ArrivalPlan:
    """A plan from ``(slot, s, o)`` triples (sorted by slot, stable)."""
    rows = sorted(enumerate(requests), key=lambda t: (t[1][0], t[0]))
    arr = np.asarray([r for _, r in rows], dtype=np.int64).reshape(-1, 3)
    return ArrivalPlan(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy())
