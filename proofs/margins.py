"""The work-conservation margin ``Δ`` of a policy, established by proofs.

``Δ`` is the smallest number of tokens such that, in every slot where the
queue is non-empty after the decision, the memory in use is at least
``M − Δ``.  It is found by a search over ``Δ`` in which every step is a
solver query: the answer is a **proof** at ``Δ`` (``unsat``: no state of the
invariant has memory ``< M − Δ`` with a non-empty queue) and a **witness** at
``Δ − 1`` (``sat``: a decoded state with memory exactly ``M − Δ``), so ``Δ``
is tight over the invariant's states.  It needs ``M`` and the length bounds
``max s``, ``max o`` fixed.

``Δ/M`` is the policy's own ``δ``; for a policy without preemption the drift
argument then certifies stability below ``μ(1 − Δ/M)``.  With recompute
preemption the slot identity also charges the area a preemption throws away,
so ``Δ`` certifies only the memory in use, not the useful work (see
``docs/proofs.md``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import z3

from kvstab.contract import Scheduler, state_vars_of
from kvstab.errors import InvalidArgument
from kvstab.model import tokens_held
from kvstab.proofs.encoding import Setting, encode_step, fresh_state
from kvstab.proofs.invariants import Conjunct, base_conjuncts
from kvstab.proofs.replaying import decode_slot
from kvstab.proofs.solver import Answer, Budget, Status, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, SlotState, Unknown, Verdict

__all__ = ["MarginResult", "work_conservation_margin"]


@dataclass(frozen=True, slots=True)
class MarginResult:
    """``delta`` (tokens) with its proof and tightness witness; ``None`` if undecided."""

    scheduler: str
    M: int | None  # None: symbolic, Δ holds for every M
    max_s: int
    max_o: int
    delta: int | None
    verdict: Verdict
    witness: SlotState | None
    declared: int | None
    obligations: tuple[Obligation, ...]

    @property
    def paper_delta_tokens(self) -> int:
        """The paper's ``δ·M = ess sup(s + o)`` (block-rounded), in tokens."""
        return int(tokens_held(self.max_s + self.max_o, 1))

    @property
    def own_delta(self) -> float | None:
        """``Δ/M``: the policy's own ``δ``."""
        return None if self.delta is None or self.M is None else self.delta / self.M


def work_conservation_margin(
    scheduler: Scheduler,
    setting: Setting,
    K: int,
    Q: int,
    max_s: int,
    max_o: int,
    *,
    conjuncts: Sequence[Conjunct] = (),
    budget: Budget | None = None,
) -> MarginResult:
    """Establish ``Δ`` for ``scheduler`` over the states of base ∧ ``conjuncts``.

    With ``M`` symbolic the search looks for one constant ``Δ`` that holds for
    *every* ``M`` that can hold the longest request, up to the paper's
    ``δ·M = B⌈(max s + max o)/B⌉``; a policy whose idle memory grows with ``M``
    has none, and the result says so (``delta`` is ``None``, with a witness).
    """
    for n, v in (("max s", max_s), ("max o", max_o)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgument(f"{n} must be a positive integer, got {v!r}")
    if setting.M is not None and tokens_held(max_s + max_o, setting.block) > setting.M:
        raise InvalidArgument(f"max s + max o = {max_s + max_o} does not fit in M = {setting.M}")
    budget = budget or Budget()
    M = setting.M
    peak = int(tokens_held(max_s + max_o, setting.block))
    svars = state_vars_of(scheduler)
    pre = fresh_state("pre", K, Q, svars)
    step = encode_step(scheduler, pre, setting, "post")
    conj = base_conjuncts(step.full_units, setting, svars) + list(conjuncts)
    bounds = [z3.Implies(e.present, z3.And(e.s <= max_s, e.o <= max_o)) for e in pre.active + pre.waiting]
    queue_left = z3.Or(*[e.present for e in step.post.waiting])
    prem = setting.base_constraints() + [c(pre, setting) for c in conj] + step.constraints() + bounds + [queue_left]
    if M is None:
        prem.append(setting.M_term >= peak)
    obs: list[Obligation] = []
    t0 = time.perf_counter()
    guard = solve(prem, budget, "margin-premises")
    obs.append(Obligation("margin: premises satisfiable", _v(guard), time.perf_counter() - t0))
    declared = _declared(scheduler, setting, max_s, max_o)
    if guard.status is not Status.SAT:
        return MarginResult(scheduler.name, M, max_s, max_o, None, obs[-1].verdict, None, declared, tuple(obs))

    def below(delta: int) -> tuple[Answer, float]:
        t = time.perf_counter()
        return solve(prem + [step.charged < setting.M_term - delta], budget, f"margin-{delta}"), time.perf_counter() - t

    # invariant of the search: Δ = hi holds (proved or trivially M); Δ = lo - 1 fails
    lo, hi = 0, M if M is not None else peak
    witness = None
    if M is None:
        # with M symbolic, Δ = peak is not trivially true: it is the search's first query
        ans, secs = below(hi)
        if ans.status is not Status.UNSAT:
            st0 = ans.status
            v0: Verdict = (
                Refuted(None, f"no constant Δ ≤ {peak} holds for every M: idle memory grows with M")
                if st0 is Status.SAT
                else Unknown(f"solver: {ans.reason}", ans.smt2)
            )
            wit = decode_slot(ans.model, step, 0) if st0 is Status.SAT and ans.model is not None else None
            obs.append(Obligation("margin", v0, secs, conjunct=f"memory ≥ M − {hi} for every M"))
            return MarginResult(scheduler.name, M, max_s, max_o, None, v0, wit, declared, tuple(obs))
        obs.append(Obligation("margin", Proved("unsat"), secs, conjunct=f"memory ≥ M − {hi} for every M"))
    while lo < hi:
        mid = (lo + hi) // 2
        ans, secs = below(mid)
        st = ans.status
        if st is Status.UNKNOWN:
            undecided = Unknown(f"solver: {ans.reason}", ans.smt2)
            obs.append(Obligation("margin", undecided, secs, conjunct=f"memory ≥ M − {mid}"))
            return MarginResult(scheduler.name, M, max_s, max_o, None, undecided, None, declared, tuple(obs))
        if st is Status.UNSAT:
            obs.append(Obligation("margin", Proved("unsat"), secs, conjunct=f"memory ≥ M − {mid}"))
            hi = mid
        else:
            obs.append(Obligation("margin", Refuted(None, "a state uses less"), secs, conjunct=f"memory ≥ M − {mid}"))
            lo = mid + 1
    delta = hi
    if delta > 0:
        # tightness: a state whose memory is exactly M − Δ
        t = time.perf_counter()
        ans = solve(prem + [step.charged == setting.M_term - delta], budget, f"margin-witness-{delta}")
        if ans.status is Status.SAT and ans.model is not None:
            witness = decode_slot(ans.model, step, 0)
            obs.append(
                Obligation(
                    "margin: witness", Proved("sat: tight"), time.perf_counter() - t, conjunct=f"memory = M − {delta}"
                )
            )
        else:
            no_witness = Unknown(f"no witness at memory = M − {delta} ({ans.status.value})", ans.smt2)
            obs.append(Obligation("margin: witness", no_witness, time.perf_counter() - t))
            return MarginResult(scheduler.name, M, max_s, max_o, delta, no_witness, None, declared, tuple(obs))
    verdict = Proved(
        "search over Δ with a proof at Δ and a witness at Δ − 1",
        setting.assumptions()
        + (f"K = {K}, Q = {Q}", f"s ≤ {max_s}, o ≤ {max_o}")
        + (() if M is not None else (f"every M ≥ {peak} (the longest request fits)",)),
    )
    return MarginResult(scheduler.name, M, max_s, max_o, delta, verdict, witness, declared, tuple(obs))


def _v(ans: Answer) -> Verdict:
    st = ans.status
    if st is Status.SAT:
        return Proved("premises satisfiable (vacuity guard)")
    if st is Status.UNSAT:
        return Unknown(
            "vacuous: no state within the K/Q bounds has a non-empty queue after the decision "
            "(raise K so that the active requests can fill M)"
        )
    return Unknown(f"solver: {ans.reason}", ans.smt2)


def _declared(scheduler: Scheduler, setting: Setting, max_s: int, max_o: int) -> int | None:
    fn = getattr(scheduler, "margin", None)
    if not callable(fn) or setting.M is None:
        return None
    return int(fn(setting.params(setting.M), max_s, max_o))
