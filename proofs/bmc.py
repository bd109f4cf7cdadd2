"""Bounded model checking from the empty system, and k-induction.

A run is unrolled slot by slot: each slot up to ``A`` symbolic requests arrive
at the queue tail, the rule decides on the whole queue, :func:`encode_step`
does the slot, and the post state is packed back into ``K`` active and ``Q``
queue slots (:func:`compact`; a run that needs more lies outside the bounded
model and is not explored).  A ``sat`` answer is a **reachable** violation: it
is decoded into concrete ``(slot, s, o)`` arrivals and replayed from the empty
system in the reference simulator.  This is what separates real bugs from
counterexamples to induction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import z3

from kvstab.contract import Scheduler, state_vars_of
from kvstab.model import tokens_held
from kvstab.proofs.encoding import (
    Entry,
    Setting,
    StepTerms,
    SymState,
    compact,
    encode_step,
    fresh_state,
    state_at_initial,
    state_in_bounds,
    var_in_bounds,
    well_formed,
)
from kvstab.proofs.invariants import Conjunct, base_conjuncts
from kvstab.proofs.replaying import decode_int, decode_slot, replay_trace
from kvstab.proofs.solver import Budget, Status, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict

__all__ = ["Unrolling", "unroll", "bmc", "k_induction"]


@dataclass(slots=True)
class Unrolling:
    """``depth`` encoded slots: their steps, arrivals and defining constraints."""

    steps: list[StepTerms]
    arrivals: list[tuple[Entry, ...]]
    start_constraints: list[z3.BoolRef]
    slot_constraints: list[list[z3.BoolRef]]  # what defines slot t (arrivals, step, packing)
    start: SymState

    def upto(self, d: int) -> list[z3.BoolRef]:
        """The constraints of the first ``d`` slots."""
        return self.start_constraints + [c for cs in self.slot_constraints[:d] for c in cs]


def _arrivals(prefix: str, A: int, setting: Setting) -> tuple[tuple[Entry, ...], list[z3.BoolRef]]:
    st = fresh_state(prefix, 0, A)
    cs = [well_formed(st, setting, True)]
    for a, b in zip(st.waiting, st.waiting[1:]):
        cs.append(z3.Implies(b.present, a.present))  # arrivals fill slots in order
    for e in st.waiting:
        cs.append(z3.Implies(z3.Not(e.present), z3.And(e.s == 0, e.o == 0)))
    return st.waiting, cs


def unroll(
    scheduler: Scheduler, setting: Setting, K: int, Q: int, A: int, depth: int, *, empty_start: bool = True
) -> Unrolling:
    """Unroll ``depth`` slots from the empty system (or, with ``empty_start=False``,
    from any well-formed state: the k-induction step)."""
    start = fresh_state("s0", K, Q, state_vars_of(scheduler))
    cs: list[z3.BoolRef] = list(setting.base_constraints())
    if empty_start:
        for e in start.active + start.waiting:
            cs.append(z3.Not(e.present))
            cs.append(z3.And(e.s == 0, e.o == 0, e.p == 0, e.rid == -1))
        cs.append(state_at_initial(start))  # every run starts at the declared initial state
    else:
        cs.append(well_formed(start, setting, True))
        cs.append(state_in_bounds(start))
        for a, b in zip(start.waiting, start.waiting[1:]):
            cs.append(z3.Implies(b.present, a.present))
    state = start
    steps: list[StepTerms] = []
    arrs: list[tuple[Entry, ...]] = []
    per_slot: list[list[z3.BoolRef]] = []
    for t in range(depth):
        arr, acs = _arrivals(f"t{t}.arr", A, setting)
        sc: list[z3.BoolRef] = list(acs)
        for j, e in enumerate(arr):
            sc.append(e.rid == 1000 * t + j)
        view_state = SymState(active=state.active, waiting=state.waiting + arr, sched=state.sched, svars=state.svars)
        step = encode_step(scheduler, view_state, setting, f"t{t}.post")
        sc += step.constraints()
        act, c1, fit1 = compact(step.post.active, K, f"s{t + 1}", False)
        que, c2, fit2 = compact(step.post.waiting, Q, f"s{t + 1}", True)
        sc += c1 + c2 + [fit1, fit2]
        per_slot.append(sc)
        steps.append(step)
        arrs.append(arr)
        # the rule's own state needs no packing: the post state's terms carry on
        state = SymState(active=act, waiting=que, sched=step.post.sched, svars=step.post.svars)
    return Unrolling(steps=steps, arrivals=arrs, start_constraints=cs, slot_constraints=per_slot, start=start)


def _violated(step: StepTerms, setting: Setting) -> z3.BoolRef:
    """The slot breaks one of the engine's checks: a per-slot invariant, or
    (stateful rules) a next state outside its declared bounds."""
    return z3.Or(*[z3.Not(g) for _, g in step.safety(setting)], z3.Not(state_in_bounds(step.post)))


def _broken_state(m: z3.ModelRef, step: StepTerms, setting: Setting) -> str:
    """The state variable whose next value the model puts out of bounds, when
    no per-slot check fails first ("" otherwise: the engine's check is what breaks)."""
    if not all(z3.is_true(m.eval(g, model_completion=True)) for _, g in step.safety(setting)):
        return ""
    for v, x in zip(step.post.svars, step.post.sched):
        if not z3.is_true(m.eval(var_in_bounds(v, x), model_completion=True)):
            return v.name
    return ""


def _depth_for(setting: Setting, n: int) -> int:
    """The least depth at which ``n`` requests could hold ``M − ŝ`` tokens (by the bound above)."""
    assert setting.M is not None
    d = 1
    while n * int(tokens_held(d * setting.chunk, setting.block)) < setting.M - setting.chunk:
        d += 1
    return d


def _least(
    prem: list[z3.BoolRef], m: z3.ModelRef, term: z3.ArithRef, lo: int, budget: Budget, name: str
) -> tuple[int, z3.ModelRef]:
    """The least value of ``term`` (≥ ``lo``) over models of ``prem``, by binary search from
    the value in ``m``; returns it and a model attaining it."""
    hi = m.eval(term, model_completion=True).as_long()  # type: ignore[attr-defined]
    best = m
    while lo < hi:
        mid = (lo + hi) // 2
        ans = solve(prem + [term <= mid], budget, name)
        if ans.status is Status.SAT and ans.model is not None:
            hi = ans.model.eval(term, model_completion=True).as_long()  # type: ignore[attr-defined]
            best = ans.model
        else:  # unsat (or undecided: keep what is known, still deterministic)
            lo = mid + 1
    return hi, best


def _minimise(
    prem: list[z3.BoolRef], m: z3.ModelRef | None, un: Unrolling, d: int, setting: Setting, budget: Budget
) -> z3.ModelRef:
    """A deterministic, small counterexample: lexicographically fewest arrivals,
    then least ``M`` (when symbolic), then least total length ``Σ(s + o)`` —
    so the same input gives the same counterexample, and no arrival in it is
    idle (one that plays no part would not be in a least one)."""
    assert m is not None, "a sat answer carries its model"
    arrivals = [e for slot in un.arrivals[:d] for e in slot]
    count = z3.Sum([z3.If(e.present, 1, 0) for e in arrivals] + [z3.IntVal(0)])
    n, m = _least(prem, m, count, 0, budget, "bmc-minimise-arrivals")
    prem = prem + [count == n]
    if setting.M is None:
        M, m = _least(prem, m, setting.M_term, 1, budget, "bmc-minimise-M")
        prem = prem + [setting.M_term == M]
    total = z3.Sum([z3.If(e.present, e.s + e.o, 0) for e in arrivals] + [z3.IntVal(0)])
    _, m = _least(prem, m, total, 0, budget, "bmc-minimise-lengths")
    return m


def bmc(
    scheduler: Scheduler,
    setting: Setting,
    K: int,
    Q: int,
    depth: int,
    *,
    arrivals_per_slot: int = 2,
    budget: Budget | None = None,
    spec: str | None = None,
) -> tuple[Verdict, list[Obligation]]:
    """Search for the shortest run from the empty system (at most ``depth``
    slots) in which a slot breaks the engine's checks.

    Returns ``Refuted(trace)`` with a replayed reachable trace, ``Proved``
    (bounded: no violation within ``depth`` slots — an assumption the verdict
    names), or ``Unknown``.
    """
    budget = budget or Budget()
    un = unroll(scheduler, setting, K, Q, arrivals_per_slot, depth)
    obs: list[Obligation] = []
    # relevance guard: a search that can never bring memory within one chunk
    # of M cannot find an overflow, and its "no violation" would be vacuous.
    # From the empty system a request has done at most `depth` units, each of
    # at most ŝ tokens, and at most min(K + Q + A, A·depth) requests exist, so
    # memory never exceeds that many times B⌈depth·ŝ/B⌉ (a sound upper bound;
    # a solver query for the exact reachable maximum costs minutes at large M).
    if setting.M is not None:
        most = min(K + Q + arrivals_per_slot, arrivals_per_slot * depth) * int(
            tokens_held(depth * setting.chunk, setting.block)
        )
        if most < setting.M - setting.chunk:
            v0: Verdict = Unknown(
                f"vacuous bounds: runs of {depth} slots with at most {arrivals_per_slot} arrivals per slot, K = {K} "
                f"and Q = {Q} hold at most {most} tokens, never within ŝ = {setting.chunk} of M = {setting.M}; "
                f"raise --bmc to at least {_depth_for(setting, K + Q + arrivals_per_slot)} or drop --M (symbolic M)"
            )
            obs.append(Obligation("bmc", v0, 0.0, branch=f"depth {depth}", conjunct="memory pressure reachable"))
            return v0, obs
    for d in range(1, depth + 1):
        budget.group(f"bounded model checking: depth {d} of {depth}")
        # each depth is its own frame: the unrolled prefix, no violation before
        # slot d-1, a violation in it
        assertions = un.upto(d)
        assertions += [z3.Not(_violated(un.steps[t], setting)) for t in range(d - 1)]
        guard = solve(assertions, budget, f"bmc-{d}-premises")
        if guard.status is not Status.SAT:
            v: Verdict = Unknown(
                "vacuous: no run of this length" if guard.status is Status.UNSAT else f"solver: {guard.reason}",
                guard.smt2,
            )
            obs.append(Obligation("bmc", v, 0.0, branch=f"depth {d}", conjunct="premises satisfiable"))
            return v, obs
        t0 = time.perf_counter()
        ans = solve(assertions + [_violated(un.steps[d - 1], setting)], budget, f"bmc-{d}")
        secs = time.perf_counter() - t0
        if ans.status is Status.SAT:
            m = _minimise(assertions + [_violated(un.steps[d - 1], setting)], ans.model, un, d, setting, budget)
            slots = [decode_slot(m, un.steps[t], t, un.arrivals[t]) for t in range(d)]
            broken = _broken_state(m, un.steps[d - 1], setting)
            trace = replay_trace(
                scheduler,
                spec,
                setting,
                kind="reachable",
                M=decode_int(m, setting.M_term),
                slots=slots,
                broken_state=broken,
            )
            what = f"state variable {broken!r} leaves its declared bounds" if broken else "violation"
            v = Refuted(trace, f"reachable {what} in slot {d - 1}")
            obs.append(Obligation("bmc", v, secs, branch=f"depth {d}", conjunct="engine checks"))
            return v, obs
        if ans.status is Status.UNKNOWN:
            v = Unknown(f"solver: {ans.reason}", ans.smt2)
            obs.append(Obligation("bmc", v, secs, branch=f"depth {d}", conjunct="engine checks"))
            return v, obs
        obs.append(Obligation("bmc", Proved("unsat"), secs, branch=f"depth {d}", conjunct="engine checks"))
    return (
        Proved(
            f"bounded model checking, {depth} slots",
            setting.assumptions()
            + (
                f"runs of at most {depth} slots from the empty system",
                f"at most {arrivals_per_slot} arrivals per slot, K = {K} active, Q = {Q} queued",
            ),
        ),
        obs,
    )


def k_induction(
    scheduler: Scheduler,
    setting: Setting,
    K: int,
    Q: int,
    k: int,
    *,
    arrivals_per_slot: int = 2,
    extra: Sequence[Conjunct] = (),
    budget: Budget | None = None,
) -> tuple[Verdict, list[Obligation]]:
    """The k-induction step: from *any* well-formed state satisfying the
    conjuncts, ``k`` slots that pass the engine's checks are followed by a
    ``(k+1)``-th that passes too.  (Its base case is :func:`bmc` to depth ``k``.)"""
    budget = budget or Budget()
    un = unroll(scheduler, setting, K, Q, arrivals_per_slot, k + 1, empty_start=False)
    conj = base_conjuncts(True, setting, state_vars_of(scheduler)) + list(extra)
    prem = un.upto(k + 1) + [c(un.start, setting) for c in conj]
    prem += [z3.Not(_violated(un.steps[t], setting)) for t in range(k)]
    obs: list[Obligation] = []
    guard = solve(prem, budget, f"kind-{k}-premises")
    if guard.status is not Status.SAT:
        v: Verdict = Unknown(
            "vacuous premises" if guard.status is Status.UNSAT else f"solver: {guard.reason}", guard.smt2
        )
        obs.append(Obligation(f"{k}-induction", v, 0.0, conjunct="premises satisfiable"))
        return v, obs
    t0 = time.perf_counter()
    ans = solve(prem + [_violated(un.steps[k], setting)], budget, f"kind-{k}")
    secs = time.perf_counter() - t0
    if ans.status is Status.UNSAT:
        v = Proved(f"{k}-induction step")
    elif ans.status is Status.SAT:
        v = Refuted(None, f"not {k}-inductive (the state need not be reachable)")
    else:
        v = Unknown(f"solver: {ans.reason}", ans.smt2)
    obs.append(Obligation(f"{k}-induction", v, secs, conjunct="engine checks"))
    return v, obs
