"""Inductive invariants: per-branch, per-conjunct obligations, and Houdini.

An invariant ``Inv`` (a list of :class:`~kvstab.proofs.invariants.Conjunct`) is
proved by two families of obligations, each query in a fresh solver frame:

* **initiation** — ``Init ∧ ¬C`` unsat for every conjunct ``C`` (``Init``:
  no active request, any well-formed queue);
* **consecution** — ``Inv ∧ Step ∧ b ∧ ¬C′`` unsat for every decision branch
  ``b`` (preempts / admits / holds) and every goal ``C′``: the per-slot safety
  checks of the engine (memory ≤ ``M`` in the slot, …) and every conjunct of
  ``Inv`` on the post state.

**Vacuity guards**: before any ``unsat`` is trusted, the premises (``Init``;
``Inv ∧ Step ∧ b`` per branch) are checked satisfiable; if not, every goal of
that frame is :class:`~kvstab.proofs.verdicts.Unknown` — a proof over an empty
set of states fails.

The queue the rule sees is any well-formed queue of up to ``Q`` requests: a
slot's arrivals are folded into it.  That is sound because ``Inv`` constrains
queued requests only by well-formedness, which arrivals and preemptions keep.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import z3

from kvstab.contract import Scheduler, state_vars_of
from kvstab.proofs.encoding import (
    Setting,
    StepTerms,
    SymState,
    encode_step,
    fresh_state,
    memory,
    state_at_initial,
    well_formed,
)
from kvstab.proofs.invariants import CaseSplit, Conjunct, ConjunctFn, base_conjuncts, state_conjunct_name
from kvstab.proofs.replaying import decode_int, decode_slot, replay_trace
from kvstab.proofs.solver import Answer, Budget, Status, save_query, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Trace, Unknown, Verdict, passed

__all__ = ["InductionResult", "check_inductive", "houdini", "bounds_assumptions"]


def bounds_assumptions(K: int, Q: int, full_units: bool) -> tuple[str, ...]:
    """The bounded-model assumptions every proof here carries."""
    out = [
        f"at most K = {K} active requests when the rule decides",
        f"the rule sees the whole queue, at most Q = {Q} requests",
        "request peaks fit: B⌈(s+o)/B⌉ ≤ M (the engine rejects other requests)",
    ]
    out.append("every running request does one full unit per slot" if full_units else "grants as the rule gives them")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class InductionResult:
    """The verdict of an invariant and every obligation behind it."""

    verdict: Verdict
    obligations: tuple[Obligation, ...]
    conjuncts: tuple[str, ...]


@dataclass(slots=True)
class _Frame:
    step: StepTerms
    conjuncts: list[Conjunct]
    init: SymState


def _constant(goal: z3.BoolRef) -> ConjunctFn:
    """A conjunct function that ignores the state: the engine's safety goals are
    already terms of the encoded step."""

    def fn(state: SymState, setting: Setting) -> z3.BoolRef:
        return goal

    return fn


def _frame(scheduler: Scheduler, setting: Setting, K: int, Q: int, extra: Sequence[Conjunct]) -> _Frame:
    svars = state_vars_of(scheduler)
    pre = fresh_state("pre", K, Q, svars)
    step = encode_step(scheduler, pre, setting, "post")
    return _Frame(
        step=step,
        conjuncts=base_conjuncts(step.full_units, setting, svars) + list(extra),
        init=fresh_state("init", K, Q, svars),
    )


def _init_premises(fr: _Frame, setting: Setting) -> list[z3.BoolRef]:
    # the empty system: nobody active, any well-formed queue, the rule's declared initial state
    empty = [z3.Not(e.present) for e in fr.init.active]
    return (
        setting.base_constraints()
        + empty
        + [well_formed(fr.init, setting, fr.step.full_units), state_at_initial(fr.init)]
    )


def _step_premises(fr: _Frame, setting: Setting, conjuncts: Sequence[Conjunct]) -> list[z3.BoolRef]:
    return setting.base_constraints() + [c(fr.step.pre, setting) for c in conjuncts] + fr.step.constraints()


def _hints(c: Conjunct, fr: _Frame, setting: Setting) -> list[z3.BoolRef]:
    # a conjunct's lemma instances are premises of its own goal only: the other
    # queries do not need them and would pay for them
    return c.hints(fr.step, setting) if c.hints is not None else []


def prove_lemmas(conjuncts: Sequence[Conjunct], setting: Setting, budget: Budget) -> list[Obligation]:
    """Prove each conjunct's lemma (valid for all values of its free variables),
    behind a vacuity guard on its antecedent."""
    obs: list[Obligation] = []
    for c in conjuncts:
        if c.lemma is None:
            continue
        lem = c.lemma(setting)
        if z3.is_app_of(lem, z3.Z3_OP_IMPLIES):
            guard, secs = _timed(f"lemma-{c.name}-premises", [lem.arg(0)], budget)
            obs.append(_guard_obligation("lemma: premises satisfiable", guard, secs, branch=c.name))
            if guard.status is not Status.SAT:
                continue
        ans, secs = _timed(f"lemma-{c.name}", [z3.Not(lem)], budget)
        obs.append(Obligation("lemma", _verdict(ans, "lemma is false"), secs, conjunct=f"{c.name}: its lemma"))
    return obs


def _guard(name: str, prem: list[z3.BoolRef], small: list[z3.BoolRef], budget: Budget) -> tuple[Answer, float]:
    """A vacuity guard: are ``prem`` satisfiable?  A model of ``prem`` with the
    extra ``small`` constraints (most slots empty) is a model of ``prem``, and
    is much cheaper to find; only when there is none is ``prem`` checked alone."""
    t0 = time.perf_counter()
    ans = solve(prem + small, budget, name + "-small")
    if ans.status is not Status.SAT:
        ans = solve(prem, budget, name)
    return ans, time.perf_counter() - t0


def _case_split(conjuncts: Sequence[Conjunct], step: StepTerms, setting: Setting) -> tuple[str, CaseSplit] | None:
    """The first conjunct's case split of the memory goal (its name and its cases), if one has any."""
    for c in conjuncts:
        if c.cases is not None:
            return c.name, c.cases(step, setting)
    return None


def _cover(split: tuple[str, CaseSplit] | None, budget: Budget) -> list[Obligation]:
    """The case split's own obligation: its cases cover every state."""
    if split is None:
        return []
    name, cs = split
    ans, secs = _timed(f"cases-{name}", cs.cover, budget)
    return [Obligation("cases", _verdict(ans, "the cases do not cover every state"), secs, conjunct=f"{name}: its cases")]


def _solve_split(name: str, query: list[z3.BoolRef], split: tuple[str, CaseSplit] | None, budget: Budget) -> Answer:
    """``query`` as one solver call, or, with a case split, one call per case:
    unsat iff every case is; the first sat case's answer; else unknown."""
    if split is None:
        return solve(query, budget, name)
    undecided: Answer | None = None
    for cname, cond in split[1].cases:
        ans = solve(query + [cond], budget, f"{name}-{cname}")
        if ans.status is Status.SAT:
            return ans
        if ans.status is Status.UNKNOWN and undecided is None:
            undecided = Answer(Status.UNKNOWN, smt2=ans.smt2, reason=f"case {cname!r}: {ans.reason}")
    return undecided or Answer(Status.UNSAT)


def _timed(name: str, assertions: list[z3.BoolRef], budget: Budget) -> tuple[Answer, float]:
    t0 = time.perf_counter()
    ans = solve(assertions, budget, name)
    return ans, time.perf_counter() - t0


def check_inductive(
    scheduler: Scheduler,
    setting: Setting,
    K: int,
    Q: int,
    extra: Sequence[Conjunct] = (),
    *,
    budget: Budget | None = None,
    spec: str | None = None,
    method: str = "1-induction",
    fail_fast: bool = False,
) -> InductionResult:
    """Prove that base ∧ ``extra`` is an inductive invariant that implies the
    engine's per-slot checks.  A failed memory goal is decoded into a
    counterexample to induction and replayed from its state in the simulator.
    ``fail_fast`` stops at the first obligation that is not proved (for a
    first attempt that a strengthening may follow)."""
    budget = budget or Budget()
    fr = _frame(scheduler, setting, K, Q, extra)
    # the hints of a conjunct are used only with its lemma proved (else the
    # lemma's failing obligation fails the proof)
    obs: list[Obligation] = prove_lemmas(fr.conjuncts, setting, budget)

    # initiation, one frame per conjunct, behind one vacuity guard
    prem = _init_premises(fr, setting)
    guard, secs = _timed("init-premises", prem, budget)
    obs.append(_guard_obligation("init: premises satisfiable", guard, secs))
    for c in fr.conjuncts:
        if guard.status is not Status.SAT:
            obs.append(Obligation("init", _vacuous(guard), 0.0, conjunct=c.name))
            continue
        ans, secs = _timed(f"init-{c.name}", prem + [z3.Not(c(fr.init, setting))], budget)
        obs.append(Obligation("init", _verdict(ans, f"Init does not imply {c.name!r}"), secs, conjunct=c.name))

    # consecution, per branch and per goal
    prem = _step_premises(fr, setting, fr.conjuncts)
    relevant = _relevance(fr, setting, prem, K, Q, budget)
    obs.append(relevant)
    if not passed(relevant.verdict):
        return _result(obs, fr, setting, K, Q, extra, method)
    safety_hints = [h for c in fr.conjuncts if c.hints_for_safety for h in _hints(c, fr, setting)]
    # each goal: name, term, what a counterexample breaks in the engine (the
    # memory check, a state variable's bounds; None: a conjunct, not a run), hints
    goals: list[tuple[str, z3.BoolRef, str | None, list[z3.BoolRef]]] = [
        (n, g, "memory" if n.startswith("memory") else None, safety_hints) for n, g in fr.step.safety(setting)
    ]
    bound_of = {state_conjunct_name(v): v.name for v in fr.step.pre.svars}
    # a conjunct's goal may assume the slot's safety goals: they are proved
    # under the same premises as obligations of the same branch (lemma chaining)
    proved_safety = [g for _, g in fr.step.safety(setting)]
    split = _case_split(fr.conjuncts, fr.step, setting)
    obs += _cover(split, budget)
    wf_any = fr.step.full_units and fr.conjuncts[0].name == "well-formed"
    if wf_any:
        # well-formedness does not depend on the decision: prove it once, for
        # every decision (free admit/preempt flags), instead of per branch
        obs += _well_formed_any_decision(setting, K, Q, budget)
    goals += [
        (c.name + "′", c(fr.step.post, setting), _state_kind(c, bound_of), _hints(c, fr, setting) + proved_safety)
        for c in fr.conjuncts[1 if wf_any else 0 :]
    ]
    for bname, bcond in fr.step.branches:
        budget.group(f"{method}: step [{bname}], {len(goals)} goals")
        guard, secs = _guard(f"step-{bname}-premises", prem + [bcond], _small_model(fr), budget)
        obs.append(_guard_obligation("step: premises satisfiable", guard, secs, branch=bname))
        for gname, goal, breaks, hints in goals:
            if guard.status is not Status.SAT:
                obs.append(Obligation("step", _vacuous(guard), 0.0, branch=bname, conjunct=gname))
                continue
            query = prem + hints + [bcond, z3.Not(goal)]
            found: Answer | None = None
            secs = 0.0
            if fail_fast:
                # a first attempt expects counterexamples: one among states with
                # one active and one queued request is cheap to find and as good
                # as any (only sat is taken from the restricted query)
                small, secs = _timed(f"step-{bname}-{gname}-small", query + _small_model(fr, active=2), budget)
                found = small if small.status is Status.SAT else None
            if found is None:
                t1 = time.perf_counter()
                found = _solve_split(f"step-{bname}-{gname}", query, split if breaks == "memory" else None, budget)
                secs += time.perf_counter() - t1
            ans = found
            info: dict[str, object] = {}
            if ans.status is Status.SAT:
                # kept so that an Unknown overall verdict can point at the failing query
                info["smt2"] = save_query(query, budget, f"cti-{bname}-{gname}", "sat: counterexample to induction")
            if ans.status is Status.SAT and breaks == "memory":
                v: Verdict = Refuted(_cti(scheduler, spec, setting, fr.step, ans.model), "counterexample to induction")
            elif ans.status is Status.SAT and breaks is not None:
                # a next state outside the declared bounds: the engine rejects it, so replay it
                trace = _cti(scheduler, spec, setting, fr.step, ans.model, broken_state=breaks)
                v = Refuted(trace, f"state variable {breaks!r} leaves its declared bounds")
            else:
                v = _verdict(ans, f"{gname} not preserved (counterexample to induction)")
            obs.append(Obligation("step", v, secs, branch=bname, conjunct=gname, info=info))
            if fail_fast and not passed(v):
                return _result(obs, fr, setting, K, Q, extra, method)
        if fail_fast and not passed(obs[-1].verdict):
            return _result(obs, fr, setting, K, Q, extra, method)
    return _result(obs, fr, setting, K, Q, extra, method)


def _relevance(fr: _Frame, setting: Setting, prem: list[z3.BoolRef], K: int, Q: int, budget: Budget) -> Obligation:
    """The relevance guard: some state the premises cover has memory within one
    chunk of ``M``.  If none has, the bounds make every ``unsat`` below vacuous
    where it matters (e.g. ``K = 8`` requests cannot fill ``M = 131000``)."""
    t0 = time.perf_counter()
    near = memory(fr.step.pre, setting) >= setting.M_term - setting.chunk
    ans = solve(prem + [near], budget, "relevance")
    secs = time.perf_counter() - t0
    match ans.status:
        case Status.SAT:
            v: Verdict = Proved("memory pressure reachable within the bounds (relevance guard)")
        case Status.UNSAT:
            v = Unknown(
                f"vacuous bounds: no state with at most K = {K} active and Q = {Q} queued requests has memory within "
                f"ŝ = {setting.chunk} of M = {setting.M}; raise --K, or prove with a symbolic M (drop --M) or "
                "--unbounded"
            )
        case _:
            v = Unknown(f"relevance guard undecided: {ans.reason}", ans.smt2)
    return Obligation("relevance", v, secs, conjunct="a state with memory ≥ M − ŝ satisfies the premises")


def _well_formed_any_decision(setting: Setting, K: int, Q: int, budget: Budget) -> list[Obligation]:
    """``WF ∧ Step_free ⇒ WF′`` where ``Step_free`` is the engine's slot under a
    decision whose flags are free variables — so it holds for every rule."""
    from kvstab.proofs.lemmas import FreeDecision  # the free decision lives with the lemmas

    pre = fresh_state("any", K, Q)
    step = encode_step(FreeDecision(), pre, setting, "any'")
    prem = setting.base_constraints() + [well_formed(pre, setting, True)] + step.constraints()
    guard, secs = _timed("wf-any-premises", prem, budget)
    obs = [_guard_obligation("step: premises satisfiable", guard, secs, branch="every decision")]
    if guard.status is not Status.SAT:
        return obs + [Obligation("step", _vacuous(guard), 0.0, branch="every decision", conjunct="well-formed′")]
    ans, secs = _timed("wf-any", prem + [z3.Not(well_formed(step.post, setting, True))], budget)
    return obs + [
        Obligation(
            "step", _verdict(ans, "well-formed′ not preserved"), secs, branch="every decision", conjunct="well-formed′"
        )
    ]


def _result(
    obs: list[Obligation], fr: _Frame, setting: Setting, K: int, Q: int, extra: Sequence[Conjunct], method: str
) -> InductionResult:
    names = tuple(c.name for c in fr.conjuncts)
    failing = [o for o in obs if not passed(o.verdict)]
    if not failing and obs:
        assumptions = setting.assumptions() + bounds_assumptions(K, Q, fr.step.full_units)
        assumptions += tuple(f"strengthened by: {c.name}" for c in extra)
        return InductionResult(Proved(method, assumptions), tuple(obs), names)
    first = next((o for o in failing if isinstance(o.verdict, Refuted)), failing[0])
    return InductionResult(first.verdict, tuple(obs), names)


def _guard_obligation(name: str, ans: Answer, secs: float, branch: str = "") -> Obligation:
    st = ans.status
    if st is Status.SAT:
        v: Verdict = Proved("premises satisfiable (vacuity guard)")
    elif st is Status.UNSAT:
        v = Unknown("vacuous: the premises are unsatisfiable, so no state is covered")
    else:
        v = Unknown(f"solver: {ans.reason}", ans.smt2)
    return Obligation(name, v, secs, branch=branch)


def _vacuous(guard: Answer) -> Unknown:
    if guard.status is Status.UNSAT:
        return Unknown("vacuous premises: not checked")
    return Unknown(f"premises undecided: {guard.reason}", guard.smt2)


def _verdict(ans: Answer, refuted: str) -> Verdict:
    st = ans.status
    if st is Status.UNSAT:
        return Proved("unsat")
    if st is Status.SAT:
        return Refuted(None, refuted)
    return Unknown(f"solver: {ans.reason}", ans.smt2)


def _state_kind(c: Conjunct, bound_of: dict[str, str]) -> str | None:
    """The name of the state variable a base conjunct bounds, or ``None`` (any other conjunct)."""
    return bound_of.get(c.name) if c.origin == "base" else None


def _cti(
    scheduler: Scheduler,
    spec: str | None,
    setting: Setting,
    step: StepTerms,
    m: z3.ModelRef | None,
    broken_state: str = "",
) -> Trace:
    assert m is not None, "a sat answer carries its model"
    slot = decode_slot(m, step, 0)
    M = decode_int(m, setting.M_term)
    return replay_trace(
        scheduler,
        spec,
        setting,
        kind="cti",
        M=M,
        slots=[slot],
        initial_active=slot.active,
        initial_waiting=slot.waiting,
        broken_state=broken_state,
    )


def _small_model(fr: _Frame, active: int = 1) -> list[z3.BoolRef]:
    """Restrict the pre state to its first ``active`` active slots and its first queue slot."""
    return [z3.Not(e.present) for e in fr.step.pre.active[active:] + fr.step.pre.waiting[1:]]


def houdini(
    scheduler: Scheduler,
    setting: Setting,
    K: int,
    Q: int,
    required: Sequence[Conjunct],
    candidates: Sequence[Conjunct],
    *,
    budget: Budget | None = None,
) -> tuple[list[Conjunct] | None, list[str]]:
    """Houdini: drop the candidates that fail initiation or are not preserved
    (assuming all survivors), until the rest is inductive.

    ``required`` (the base invariant and user conjuncts) take part like the
    candidates; if one of them would be dropped there is no strengthening in
    the menu and the result is ``None``.  Returns the surviving candidates and
    a log of what was dropped and why.  The survivors are then proved by
    :func:`check_inductive` in the ordinary, split, vacuity-guarded way.
    """
    budget = budget or Budget()
    fr = _frame(scheduler, setting, K, Q, list(required))
    req = fr.conjuncts  # base + required
    lemma_obs = prove_lemmas(list(candidates), setting, budget)
    bad = {o.branch or o.conjunct.split(":")[0] for o in lemma_obs if not passed(o.verdict)}
    cur = [c for c in candidates if c.name not in bad]
    log: list[str] = [f"dropped {n!r}: its lemma is not proved" for n in sorted(bad)]
    init_prem = _init_premises(fr, setting)
    for c in list(cur):
        ans = solve(init_prem + [z3.Not(c(fr.init, setting))], budget, f"houdini-init-{c.name}")
        if ans.status is not Status.UNSAT:
            cur.remove(c)
            log.append(f"dropped {c.name!r}: not implied by Init ({ans.status.value})")
    while True:
        everything = req + cur
        prem = _step_premises(fr, setting, everything)
        guard, _ = _guard("houdini-premises", prem, _small_model(fr), budget)
        if guard.status is not Status.SAT:
            log.append(f"premises {guard.status.value}: vacuous or undecided")
            return None, log
        dropped = False
        safety_hints = [h for c in everything if c.hints_for_safety for h in _hints(c, fr, setting)]
        safety = fr.step.safety(setting)
        # the conjuncts' goals assume the slot's safety, which is checked last
        # in the round: if it fails Houdini fails, so the assumption is only
        # ever used when it holds (and dropping a candidate is always safe)
        # (well-formedness is decision-independent and proved separately by check_inductive)
        skip_wf = fr.step.full_units
        goals = [
            (c, c(fr.step.post, setting), _hints(c, fr, setting) + [g for _, g in safety], False)
            for c in everything
            if not (skip_wf and c.origin == "base" and c.name == "well-formed")
        ]
        goals += [(Conjunct(n, _constant(g)), g, safety_hints, n.startswith("memory")) for n, g in safety]
        small = _small_model(fr, active=2)
        # the memory goal's case split, checked to cover every state (else it is not used)
        split = _case_split(everything, fr.step, setting)
        if split is not None and not all(passed(o.verdict) for o in _cover(split, budget)):
            log.append(f"case split of {split[0]!r} not used: its cases are not shown to cover every state")
            split = None
        for c, goal, hints, memory_goal in goals:
            # a counterexample among states with one active and one queued
            # request is cheap to find and as good as any (it is a real CTI)
            ans = solve(prem + hints + small + [z3.Not(goal)], budget, f"houdini-small-{c.name}")
            if ans.status is not Status.SAT:
                query = prem + hints + [z3.Not(goal)]
                ans = _solve_split(f"houdini-{c.name}", query, split if memory_goal else None, budget)
            if ans.status is Status.UNSAT:
                continue
            if c in cur:
                cur.remove(c)
                log.append(f"dropped {c.name!r}: not preserved ({ans.status.value})")
                dropped = True
                break  # re-check everyone under the weaker premises
            log.append(f"required {c.name!r} not preserved with the remaining candidates ({ans.status.value})")
            return None, log
        if not dropped:
            log.append(f"inductive: {', '.join(c.name for c in cur) or '(no candidate needed)'}")
            return cur, log
