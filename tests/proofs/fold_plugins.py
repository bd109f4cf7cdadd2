"""Rules made of kvstab.contract's folds, each one line away from a built-in or a plug-in: broken
ones the unbounded proofs must *not* prove, and two they must (an over-granting port of vllm-v1,
which the engine clamps, and a stateful rule with a real-valued ratio, the shape of SGLang's)."""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from proof_plugins import RatioReserve

from kvstab.contract import (
    ActiveEntry,
    Decision,
    Traits,
    View,
    WaitingEntry,
    any_of,
    fcfs_admit,
    fcfs_admit_projected,
    fcfs_admit_with_grants,
    held_first,
    no_preemption,
    preempt_newest,
    scan,
    sum_of,
)
from kvstab.model import first_chunk_tokens, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.schedulers import sglang as sglang_module
from kvstab.schedulers.lookahead import Projection
from kvstab.schedulers.sglang import Sglang

FLAGS = Traits(fcfs=True, clairvoyant=False, preempts=True)


def _vllm(
    view: View, ops: Ops, *, ask_cap: int = 1, debit_ask: bool = False, debit_admitted: bool = True, hoard: int = 0
) -> Decision:
    """vllm-v1's rule (kvstab/schedulers/vllm_v1.py) with four knobs a port could get wrong."""
    unlimited = view.token_budget is None

    def schedule(a: ActiveEntry, acc: tuple[IntLike, IntLike, IntLike]) -> tuple[tuple[BoolLike, IntLike], Any]:
        prefix, budget, kept = acc
        ask = ops.ite(ops.lt(a.progress, a.s), ops.min(a.s - a.progress, view.chunk * ask_cap), 1)
        grant = ask if unlimited else ops.min(ask, budget - hoard)
        if hoard:
            grant = ops.max(0, grant)
        grant = ops.ite(a.present, grant, 0)
        # masked: an empty slot of a symbolic view holds nothing (tests/proofs/test_proofs_vllm.py)
        after = ops.ite(a.present, tokens_held(a.progress + grant, view.block, ops), 0)
        prefix = prefix + after
        victim = ops.and_(a.present, ops.lt(view.M, prefix))
        if not unlimited:
            budget = budget - ops.ite(victim, 0, ask if debit_ask else grant)
        return (victim, ops.ite(victim, 0, grant)), (prefix, budget, kept + ops.ite(victim, 0, after))

    start = (0, 0 if unlimited else view.token_budget, 0)
    (preempt, grants), (_, budget, kept) = scan(view.active, schedule, start, width=2)

    def fits(w: WaitingEntry, acc: tuple[IntLike, IntLike]) -> tuple[BoolLike, tuple[IntLike, IntLike], IntLike]:
        used, left = acc
        first = ops.min(w.s, view.chunk) if unlimited else ops.min(w.s, view.chunk, left)
        ok = ops.le(used + tokens_held(w.s, view.block, ops), view.M)
        if not unlimited:
            ok = ops.and_(ops.lt(0, left), ok)
        return ok, (used + tokens_held(first, view.block, ops), left - (first if debit_admitted else 0)), first

    admit, admit_grants = fcfs_admit_with_grants(view, ops, fits, (kept, budget), allowed=ops.not_(any_of(preempt, ops)))
    return Decision(admit=admit, preempt=preempt, grants=grants + admit_grants)


@dataclass(frozen=True, slots=True)
class VllmOverGrant:
    """vllm-v1 whose prefill ask is two chunks: the engine clamps every grant to one unit, so the rule
    only over-counts what it allocates and spends — safe, and proved."""

    name: str = "vllm-over-grant"
    description: str = "vllm-v1 asking for two chunks of prefill (the engine clamps to one)"
    traits: Traits = FLAGS

    def decide(self, view: View, ops: Ops) -> Decision:
        return _vllm(view, ops, ask_cap=2)


@dataclass(frozen=True, slots=True)
class VllmDebitsAsk:
    """vllm-v1 that debits the budget by what a request *asked* for: the budget goes negative, a
    later grant min(ask, budget) is negative, and the rule counts memory below what the engine charges."""

    name: str = "vllm-debits-ask"
    description: str = "vllm-v1 debiting the token budget by the ask, not the grant"
    traits: Traits = FLAGS

    def decide(self, view: View, ops: Ops) -> Decision:
        return _vllm(view, ops, debit_ask=True)


@dataclass(frozen=True, slots=True)
class VllmHoardsOneToken:
    """vllm-v1 that keeps one token of the budget back from the running requests: with a budget of
    one token none of them ever advances again (memory stays safe; progress does not)."""

    name: str = "vllm-hoards-one-token"
    description: str = "vllm-v1 granting running requests at most budget − 1 tokens"
    traits: Traits = FLAGS

    def decide(self, view: View, ops: Ops) -> Decision:
        return _vllm(view, ops, hoard=1)


@dataclass(frozen=True, slots=True)
class VllmFreeFirstChunk:
    """vllm-v1 that never debits an admitted request's first chunk: the slot can process more
    tokens than the budget."""

    name: str = "vllm-free-first-chunk"
    description: str = "vllm-v1 not debiting admitted requests' first chunks from the token budget"
    traits: Traits = FLAGS

    def decide(self, view: View, ops: Ops) -> Decision:
        return _vllm(view, ops, debit_admitted=False)


@dataclass(frozen=True, slots=True)
class RatioReserveFolds(RatioReserve):
    """proof_plugins.RatioReserve with its any() and its sum written as folds: a stateful rule
    (a real ratio in [0.1, 1] that decays and jumps after a preemption) in the class."""

    name: str = "ratio-reserve-folds"

    def decide(self, view: View, ops: Ops) -> Decision:
        (ratio,) = view.state
        preempt, kept = preempt_newest(view, ops)
        any_preempted = any_of(preempt, ops)
        remaining = sum_of(view.active, lambda a: ops.ite(a.present, a.s + a.o - a.progress, 0), ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops) + ratio * w.o
            return ops.le(after, view.M), after

        admit = fcfs_admit(view, ops, fits, kept + ratio * remaining, allowed=ops.not_(any_preempted))
        nxt = ops.ite(any_preempted, ops.min(ratio + 0.25, 1.0), ops.max(ratio - 0.125, 0.1))
        return Decision(admit=admit, preempt=preempt, state=(nxt,))


@dataclass(frozen=True, slots=True)
class CurrentFitShortChunk:
    """current-fit, made of folds, counting the head's first chunk one token short."""

    name: str = "current-fit-short-chunk"
    description: str = "current-fit with the first chunk counted one token short"
    traits: Traits = FLAGS

    def decide(self, view: View, ops: Ops) -> Decision:
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + tokens_held(first_chunk_tokens(w.s, view.chunk, ops) - 1, view.block, ops)  # BUG: − 1
            return ops.le(after, view.M), after

        return Decision(admit=fcfs_admit(view, ops, fits, kept, allowed=ops.not_(any_of(preempt, ops))), preempt=preempt)


@dataclass(frozen=True, slots=True)
class ReserveGrowingCost:
    """reserve whose reservation is the memory after this slot instead of the peak: it admits while
    Σ (post-slot memory) fits — not kept across slots, since that memory grows."""

    name: str = "reserve-growing-cost"
    description: str = "reserve with the post-slot memory reserved instead of the peak"
    traits: Traits = Traits(fcfs=True, clairvoyant=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        def nxt(a: ActiveEntry) -> IntLike:
            return tokens_held(a.progress + ops.ite(ops.lt(a.progress, a.s), ops.min(view.chunk, a.s - a.progress), 1),
                               view.block, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + tokens_held(first_chunk_tokens(w.s, view.chunk, ops), view.block, ops)
            return ops.le(after, view.M), after

        return Decision(admit=fcfs_admit(view, ops, fits, sum_of(view.active, nxt, ops)), preempt=no_preemption(view))


@dataclass(frozen=True, slots=True)
class EarlyProjection:
    """lookahead whose projection ends one slot early: the total is never checked at a request's
    real finish slot (its last, largest one)."""

    s: IntLike
    p: IntLike
    f: IntLike
    rp: IntLike
    present: BoolLike

    def held_at(self, view: View, tau: IntLike, ops: Ops) -> IntLike:
        """Lookahead's projection, cut at ``f``."""
        full = Projection(self.s, self.p, self.f + 1, self.rp, self.present)
        return ops.ite(ops.le(tau, self.f), full.held_at(view, tau, ops), 0)


@dataclass(frozen=True, slots=True)
class LookaheadSkipsLastSlot:
    """lookahead with the projection's finish slot one early (PJ3 fails: the last slot's memory is missing)."""

    name: str = "lookahead-skips-last-slot"
    description: str = "lookahead whose projection forgets each request's last slot"
    traits: Traits = Traits(fcfs=True, clairvoyant=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        def project(s: IntLike, o: IntLike, p: IntLike, present: BoolLike) -> EarlyProjection:
            pr = Projection.of(view, s, o, p, present, ops)
            return EarlyProjection(pr.s, pr.p, pr.f - 1, pr.rp, pr.present)  # BUG: one slot early

        return Decision(admit=fcfs_admit_projected(view, ops, project), preempt=no_preemption(view))


@dataclass(frozen=True, slots=True)
class LookaheadOwnFinishUnchecked:
    """lookahead written out by hand (outside the class) that never checks a candidate's own finish slot."""

    name: str = "lookahead-own-finish-unchecked"
    description: str = "lookahead without the check at the candidate's own finish slot"
    traits: Traits = Traits(fcfs=True, clairvoyant=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        act = [Projection.of(view, a.s, a.o, a.progress, a.present, ops) for a in view.active]
        totals = tuple(ops.sum(q.held_at(view, k.f, ops) for q in act) for k in act)

        def fits(w: WaitingEntry, acc: tuple[IntLike, ...]) -> tuple[BoolLike, tuple[IntLike, ...]]:
            c = Projection.of(view, w.s, w.o, 0, w.present, ops)
            new = tuple(t + c.held_at(view, k.f, ops) for t, k in zip(acc, act))
            return ops.and_(c.present, *[ops.le(t, view.M) for t in new]), new  # BUG: no check at c's own f

        return Decision(admit=fcfs_admit(view, ops, fits, totals), preempt=tuple(False for _ in view.active))


@dataclass(frozen=True)
class SglangNoRetract(Sglang):
    """sglang whose decode never retracts (the flags are dropped): a decode step that needed to
    retract keeps everyone, and the requests it would have retracted still hold their memory."""

    name: str = "sglang-no-retract"
    description: str = "sglang without retraction"

    def decide(self, view: View, ops: Ops) -> Decision:
        d = Sglang.decide(self, view, ops)
        return dataclasses.replace(d, preempt=tuple(False for _ in d.preempt))  # BUG: no retraction


def _sglang_mutant(name: str, description: str, line: str, mutated: str) -> Sglang:
    """sglang with one line of its rule (kvstab/schedulers/sglang.py) replaced: the mutant is
    built from the rule's own source, so it stays one line away from it as the rule changes."""
    src = textwrap.dedent(inspect.getsource(Sglang.decide))
    assert src.count(line) == 1, f"the line to mutate is not in sglang.py once: {line!r}"
    ns = dict(vars(sglang_module))
    exec(compile(src.replace(line, mutated), f"<sglang mutant {name}>", "exec"), ns)
    cls = dataclass(frozen=True)(
        type(
            "Sglang_" + name.replace("-", "_"),
            (Sglang,),
            {"__annotations__": {"name": str, "description": str}, "name": name, "description": description,
             "decide": ns["decide"], "__module__": __name__},
        )
    )
    return cls()  # type: ignore[no-any-return]


# the premises of the sglang proof, one mutant each (tests/proofs/test_proofs_sglang.py)
#: the prefill walk's chunk not clamped to free memory (a continuation then takes its whole chunk)
SGLANG_UNCLAMPED_CHUNK = _sglang_mutant(
    "sglang-unclamped-chunk", "sglang whose chunk is not clamped to free memory",
    "allow = ops.max(0, ops.min(allow, room))", "allow = ops.max(0, allow)",
)
#: the retraction's cost forgets the page a decode token needs: the kept requests fit without it
SGLANG_RETRACT_FORGETS_PAGE = _sglang_mutant(
    "sglang-retract-forgets-page", "sglang retracting until the held memory fits, without the new pages",
    "return paged(a.progress) + need((a, ops.le(a.s, a.progress)))", "return paged(a.progress)",
)
#: the ratio after a retraction not clipped to 1: the next state leaves its declared [0, 1]
SGLANG_RATIO_UNCLIPPED = _sglang_mutant(
    "sglang-ratio-unclipped", "sglang whose retraction estimate of new_token_ratio is not clipped to 1",
    "after_retract = ops.min(1.0, estimate)", "after_retract = estimate",
)
#: the case split on the wrong condition: a batch of one request is taken for a decode step
SGLANG_PREFILL_OFF_BY_ONE = _sglang_mutant(
    "sglang-prefill-off-by-one", "sglang that decodes when the prefill batch holds one request",
    "prefill = ops.lt(0, in_batch)", "prefill = ops.lt(1, in_batch)",
)

VLLM_OVER_GRANT = VllmOverGrant()
VLLM_DEBITS_ASK = VllmDebitsAsk()
VLLM_FREE_FIRST_CHUNK = VllmFreeFirstChunk()
VLLM_HOARDS_ONE_TOKEN = VllmHoardsOneToken()
CURRENT_FIT_SHORT_CHUNK = CurrentFitShortChunk()
RATIO_RESERVE_FOLDS = RatioReserveFolds()
RESERVE_GROWING_COST = ReserveGrowingCost()
LOOKAHEAD_SKIPS_LAST_SLOT = LookaheadSkipsLastSlot()
LOOKAHEAD_OWN_FINISH_UNCHECKED = LookaheadOwnFinishUnchecked()
SGLANG_NO_RETRACT = SglangNoRetract()
