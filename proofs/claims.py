"""More than memory: each scheduler's declared claims, proved or refuted one slot at a time.

What a rule declares (:func:`kvstab.contract.traits_of`) becomes obligations
about one slot.  A rule in the prefix-fold class gets each claim for **any
number of requests** (:mod:`kvstab.proofs.claims_folds`: one-step facts of its
folds); a claim whose one-step facts do not hold, and every claim of a rule
outside the class, is checked here over one encoded decision from any
well-formed state with at most ``K`` active and ``Q`` queued requests
(memory ≤ ``M`` when it decides), where a counterexample is a concrete state.
Each :class:`Claim` says which scope it has, and why when it is bounded:

* **FCFS admissions** (``fcfs=True``): admissions form a prefix of the
  queue — a request is admitted only if every request ahead of it is.
* **Non-clairvoyance** (``clairvoyant=False``), by a two-copy argument: two
  states that differ only in the output lengths ``o`` get the same decision
  (admit and preempt flags, grants).  The rule runs on views that *show* ``o``,
  so a rule that reads ``o`` is refuted even where the engine would hide it.
  A refutation carries the two concrete states, and the rule is re-run on
  them with concrete integers to confirm that its decisions differ.
* **Progress premises** (every rule but a negative control): the oldest
  running request is never preempted and advances (not asked of a rule that
  declares ``stalls_running``); a lone head is admitted into an empty server.
  With them no run livelocks: after the last arrival the ranking
  ``ρ = N·(T + 1) + r`` decreases every slot, where ``N`` is the number of
  unfinished requests, ``T`` the longest request ``s + o``, and ``r`` the
  tokens the oldest running request still needs (``T + 1`` when none runs) —
  checked for every rule that does not declare ``stalls_running``, grants
  included; see ``docs/proofs.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from kvstab.contract import ActiveEntry, Decision, Scheduler, Traits, View, WaitingEntry, state_vars_of, traits_of
from kvstab.model import progress_after
from kvstab.ops import CONCRETE
from kvstab.proofs.claims_folds import SCOPE, FreeClaim, free_claims
from kvstab.proofs.encoding import (
    Entry,
    Setting,
    StepTerms,
    SymState,
    call_decide,
    encode_step,
    fresh_state,
    memory,
    run_rule,
    state_in_bounds,
    view_of,
    well_formed,
)
from kvstab.proofs.loops import guarded_check
from kvstab.proofs.replaying import decode_int, decode_state
from kvstab.proofs.selfcheck import engine_step
from kvstab.proofs.solver import Budget
from kvstab.proofs.unbounded import ClassCheck
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict, passed
from kvstab.replay import replay_command
from kvstab.symbolic import unwrap

__all__ = ["CLAIMS_MAX", "Claim", "ClaimResult", "Pair", "prove_claims"]

Active = tuple[tuple[int, int, int], ...]
Waiting = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Pair:
    """Two states that differ only in ``o`` and get different decisions (replayed on the rule)."""

    M: int
    first: tuple[Active, Waiting]
    second: tuple[Active, Waiting]
    decisions: tuple[str, str]
    replayed: bool
    commands: tuple[str, str]
    #: the scheduler's own state, the same in both (a stateful rule)
    sched_state: tuple[int | float, ...] = ()

    def describe(self) -> str:
        """A few lines a reader can follow."""
        (a1, w1), (a2, w2) = self.first, self.second
        both = f", scheduler state {list(self.sched_state)}" if self.sched_state else ""
        return "\n".join(
            [
                f"two states differing only in o (M={self.M}{both}):",
                f"  state 1: active {list(a1)} waiting {list(w1)} -> {self.decisions[0]}",
                f"  state 2: active {list(a2)} waiting {list(w2)} -> {self.decisions[1]}",
                f"  rule re-run on concrete values: {'decisions differ' if self.replayed else 'NOT reproduced'}",
                f"  replay 1: {self.commands[0]}",
                f"  replay 2: {self.commands[1]}",
            ]
        )


#: the most active (and queued) requests the bounded claims are checked with (``kvstab prove
#: --claims`` and the audit cap ``K`` and ``Q`` here: the two-copy queries grow fast)
CLAIMS_MAX = 8


@dataclass(frozen=True, slots=True)
class Claim:
    """A declared property and the obligation that checks it."""

    name: str
    verdict: Verdict
    obligations: tuple[Obligation, ...] = ()
    witness: str = ""
    pair: Pair | None = None
    #: what the verdict covers: "any number of requests", or the bounds it was checked at
    scope: str = ""
    #: why a claim of a rule is checked at bounds (outside the class, or which one-step fact failed)
    note: str = ""
    #: the one-step facts a claim for any number of requests rests on
    facts: tuple[str, ...] = ()
    #: a bounded refutation's state, as the rule is re-run on it: (M, active, waiting, scheduler state)
    state: tuple[int, Active, Waiting, tuple[int | float, ...]] | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """Every claim checked for one scheduler."""

    scheduler: str
    claims: tuple[Claim, ...] = field(default=())

    @property
    def verdict(self) -> Verdict:
        """``Proved`` only if every claim is; else the first refutation (or the first ``Unknown``)."""
        bad = [c for c in self.claims if not passed(c.verdict)]
        if not bad:
            return Proved("every declared claim", tuple(c.name for c in self.claims))
        return next((c.verdict for c in bad if isinstance(c.verdict, Refuted)), bad[0].verdict)


def _premises(pre: SymState, step: StepTerms, setting: Setting) -> list[z3.BoolRef]:
    """A well-formed state within memory, and the slot from it; queue slots filled in order."""
    out = setting.base_constraints() + [
        well_formed(pre, setting, step.full_units),
        memory(pre, setting) <= setting.M_term,
        state_in_bounds(pre),  # a stateful rule's declared state invariant
    ]
    out += step.constraints()
    for a, b in zip(pre.waiting, pre.waiting[1:]):
        out.append(z3.Implies(b.present, a.present))
    for a, b in zip(pre.active, pre.active[1:]):
        out.append(z3.Implies(b.present, a.present))
    return out


def _check(
    name: str, prem: list[z3.BoolRef], goal: z3.BoolRef, budget: Budget
) -> tuple[Verdict, list[Obligation], z3.ModelRef | None]:
    """Vacuity guard, then ``prem ∧ ¬goal``: Proved, Refuted (with the model) or Unknown."""
    return guarded_check("claim", name, prem, goal, budget, f"claim-{name}", f"{name}: a state breaks it")


def _sched(m: z3.ModelRef, st: SymState) -> str:
    """`` state [..]`` for a stateful rule's witness ("" for a stateless one)."""
    return f" state {list(decode_state(m, st.sched))}" if st.sched else ""


def _state(m: z3.ModelRef, st: SymState) -> tuple[Active, Waiting]:
    act = tuple(
        (decode_int(m, e.s), decode_int(m, e.o), decode_int(m, e.p))
        for e in st.active
        if z3.is_true(m.eval(e.present, model_completion=True))
    )
    wait = tuple(
        (decode_int(m, e.s), decode_int(m, e.o))
        for e in st.waiting
        if z3.is_true(m.eval(e.present, model_completion=True))
    )
    return act, wait


def _concrete(
    m: z3.ModelRef | None, st: SymState, setting: Setting
) -> tuple[int, Active, Waiting, tuple[int | float, ...]] | None:
    """The state a bounded counterexample decodes to (``None`` without one)."""
    if m is None:
        return None
    return (decode_int(m, setting.M_term), *_state(m, st), decode_state(m, st.sched))


class _ShownO:
    """The rule as the claims run it, shown ``o`` whatever it declares (the engine hides ``o``
    from a rule that declares ``clairvoyant=False``; the claims' encoding shows it)."""

    def __init__(self, rule: Scheduler) -> None:
        self._rule = rule
        self.traits = dataclasses.replace(traits_of(rule), clairvoyant=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rule, name)


def _breaks(
    key: str, scheduler: Scheduler, setting: Setting, state: tuple[int, Active, Waiting, tuple[int | float, ...]]
) -> bool:
    """Whether the rule, re-run on the concrete state with integers (``o`` shown, as the claims
    show it), breaks the claim ``key`` there: a bounded counterexample counts only if it does."""
    M, act, wait, sched = state
    d = _concrete_decision(scheduler, setting, M, act, wait, sched)
    admit = [bool(x) for x in d.admit]
    match key:
        case "fcfs":
            return any(admit[j] and not all(admit[:j]) for j in range(len(admit)))
        case "oldest":
            if not act:
                return False
            s, _, p = act[0]
            grant = None if d.grants is None else int(d.grants[0])
            return bool(d.preempt[0]) or progress_after(s, p, setting.chunk, grant, CONCRETE) <= p
        case "lone-head":
            return not act and bool(wait) and not (admit[0] if traits_of(scheduler).fcfs else any(admit))
        case _:
            # the ranking, on the engine's own slot: (N, r) does not fall
            out = engine_step(_ShownO(scheduler), setting, (M, act, wait, sched))
            T = max(s + o for s, o, *_ in act + wait)
            before = (len(act) + len(wait), act[0][0] + act[0][1] - act[0][2] if act else T + 1)
            first = out.active[0] if out.active else None
            after = (len(out.active) + len(out.waiting), first[1] + first[2] - first[3] if first else T + 1)
            return not after < before


def _all(terms: list[z3.BoolRef]) -> z3.BoolRef:
    """Conjunction; ``True`` for none (z3 would print a zero-argument ``and``, which SMT-LIB rejects)."""
    return z3.And(*terms) if terms else z3.BoolVal(True)


def _fcfs(step: StepTerms, setting: Setting, prem: list[z3.BoolRef], budget: Budget) -> Claim:
    w = step.pre.waiting
    goal = _all(
        [
            z3.Implies(step.admit[j], _all([z3.Implies(w[i].present, step.admit[i]) for i in range(j)]))
            for j in range(len(w))
        ]
    )
    v, obs, m = _check("admissions form a prefix of the queue (FCFS)", prem, goal, budget)
    witness = ""
    if isinstance(v, Refuted) and m is not None:
        act, wait = _state(m, step.pre)
        admitted = [
            j for j, e in enumerate(w) if z3.is_true(m.eval(z3.And(e.present, step.admit[j]), model_completion=True))
        ]
        witness = (
            f"M={decode_int(m, setting.M_term)}: active {list(act)} waiting {list(wait)}{_sched(m, step.pre)} "
            f"admits {admitted}"
        )
    return Claim("FCFS admissions", v, tuple(obs), witness, state=_concrete(m, step.pre, setting))


def _oldest(step: StepTerms, setting: Setting, prem: list[z3.BoolRef], budget: Budget) -> Claim:
    a0 = step.pre.active[0]
    after0 = step.after[0]
    goal = z3.Implies(a0.present, z3.And(z3.Not(step.preempt[0]), after0 > a0.p))
    v, obs, m = _check("the oldest running request is never preempted and advances", prem, goal, budget)
    witness = ""
    if isinstance(v, Refuted) and m is not None:
        act, wait = _state(m, step.pre)
        witness = f"M={decode_int(m, setting.M_term)}: active {list(act)} waiting {list(wait)}{_sched(m, step.pre)}"
    return Claim("oldest running request progresses", v, tuple(obs), witness, state=_concrete(m, step.pre, setting))


def _lone_head(step: StepTerms, setting: Setting, prem: list[z3.BoolRef], budget: Budget, fcfs: bool) -> Claim:
    """An empty server admits the head (FCFS rules) or someone (any other rule)."""
    empty = [z3.Not(e.present) for e in step.pre.active]
    head = step.pre.waiting[0]
    goal = step.admit[0] if fcfs else z3.Or(*step.admit)
    what = "a lone head is admitted into an empty server" if fcfs else "an empty server admits someone"
    v, obs, m = _check(what, prem + empty + [head.present], goal, budget)
    witness = ""
    if isinstance(v, Refuted) and m is not None:
        _, wait = _state(m, step.pre)
        admitted = [
            j
            for j, e in enumerate(step.pre.waiting)
            if z3.is_true(m.eval(z3.And(e.present, step.admit[j]), model_completion=True))
        ]
        # said from the model: an FCFS refutation only knows the head is left out, not that nobody is admitted
        outcome = (
            "the head (request 0) is not admitted" + (f"; it admits {admitted}" if admitted else "")
            if fcfs
            else "nobody is admitted"
        )
        witness = f"M={decode_int(m, setting.M_term)}: empty server, waiting {list(wait)}{_sched(m, step.pre)}: {outcome}"
    name = "empty server admits" if not fcfs else "lone head admitted"
    return Claim(name, v, tuple(obs), witness, state=_concrete(m, step.pre, setting))


def _tokens_left(e: Entry) -> z3.ArithRef:
    """Tokens ``e`` still has to process: ``s + o − p``."""
    return e.s + e.o - e.p


def _ranking(step: StepTerms, setting: Setting, prem: list[z3.BoolRef], budget: Budget) -> Claim:
    """No livelock: once arrivals stop, ``ρ = N·(T + 1) + r`` falls every slot, where ``r`` counts
    the *tokens* the oldest running request still needs — so a rule that grants part of a unit
    (``vllm-v1`` under a token budget) is covered as well as one that runs full units."""
    T = z3.Int("rank.T")
    pre, post = step.pre, step.post
    bound = [z3.Implies(e.present, T >= e.s + e.o) for e in pre.active + pre.waiting]

    def rank(active: tuple[Entry, ...], waiting: tuple[Entry, ...]) -> tuple[z3.ArithRef, z3.ArithRef]:
        n = z3.Sum([z3.If(e.present, 1, 0) for e in active + waiting] + [z3.IntVal(0)])
        r: z3.ArithRef = T + 1
        for e in reversed(active):  # the first present entry is the oldest running request
            r = z3.If(e.present, _tokens_left(e), r)
        return n, r

    # ρ = N·(T + 1) + r with 1 ≤ r ≤ T + 1 falls iff (N, r) falls lexicographically;
    # that form keeps the query linear
    (n0, r0), (n1, r1) = rank(pre.active, pre.waiting), rank(post.active, post.waiting)
    falls = z3.Or(n1 < n0, z3.And(n1 == n0, r1 < r0))
    nonempty = z3.Or(*[e.present for e in pre.active + pre.waiting])
    v, obs, m = _check(
        "ρ = N·(T + 1) + r decreases in every slot without arrivals", prem + bound + [nonempty], falls, budget
    )
    witness = ""
    if isinstance(v, Refuted) and m is not None:
        act, wait = _state(m, pre)
        witness = (
            f"M={decode_int(m, setting.M_term)}: active {list(act)} waiting {list(wait)}{_sched(m, pre)}: "
            "the ranking does not fall"
        )
    return Claim("no livelock (ranking function)", v, tuple(obs), witness, state=_concrete(m, pre, setting))


def _shadow(st: SymState, tag: str) -> SymState:
    """A copy of ``st`` with fresh output lengths and everything else equal."""

    def copy(e: Entry, queued: bool, k: int) -> Entry:
        return Entry(e.present, e.rid, e.s, z3.Int(f"{tag}.{'w' if queued else 'a'}{k}.o"), e.p)

    return SymState(
        active=tuple(copy(e, False, k) for k, e in enumerate(st.active)),
        waiting=tuple(copy(e, True, k) for k, e in enumerate(st.waiting)),
        sched=st.sched,  # the same scheduler state: only o differs
        svars=st.svars,
    )


def _decision_terms(d: Decision) -> list[z3.ExprRef]:
    terms = [unwrap(x) if not isinstance(x, bool) else z3.BoolVal(x) for x in d.admit + d.preempt]
    if d.grants is not None:
        terms += [unwrap(x) if not isinstance(x, int) else z3.IntVal(x) for x in d.grants]
    return terms


def _show(d: Decision) -> str:
    grants = "" if d.grants is None else f" grants {[int(g) for g in d.grants]}"
    return f"admit {[bool(x) for x in d.admit]} preempt {[bool(x) for x in d.preempt]}{grants}"


def _concrete_decision(
    scheduler: Scheduler,
    setting: Setting,
    M: int,
    act: Active,
    wait: Waiting,
    sched_state: tuple[int | float, ...] = (),
) -> Decision:
    # the rule itself, shown every o: engines hide o from a rule that declares it does not read it
    # (kvstab.contract.visible_view), which is exactly the claim under test here
    p = setting.params(M)
    view = View(
        active=tuple(ActiveEntry(i, s, o, prog) for i, (s, o, prog) in enumerate(act)),
        waiting=tuple(WaitingEntry(len(act) + j, s, o) for j, (s, o) in enumerate(wait)),
        M=p.M,
        chunk=p.chunk,
        block=p.block,
        token_budget=p.token_budget,
        max_num_seqs=p.max_num_seqs,
        n_waiting=len(wait),
        state=sched_state,
    )
    return call_decide(scheduler, view, CONCRETE)


def _non_clairvoyant(
    scheduler: Scheduler, spec: str | None, setting: Setting, pre: SymState, prem: list[z3.BoolRef], budget: Budget
) -> Claim:
    other = _shadow(pre, "copy")
    d1 = run_rule(scheduler, view_of(pre, setting))
    d2 = run_rule(scheduler, view_of(other, setting))
    t1, t2 = _decision_terms(d1), _decision_terms(d2)
    # the copy is a state the engine could hold too: its requests are well-formed with their own o
    prem2 = prem + [well_formed(other, setting, d1.grants is None), memory(other, setting) <= setting.M_term]
    same = _all([a == b for a, b in zip(t1, t2)])
    v, obs, m = _check("same state, different o: same decision (two copies)", prem2, same, budget)
    pair = None
    if isinstance(v, Refuted) and m is not None:
        M = decode_int(m, setting.M_term)
        s1, s2 = _state(m, pre), _state(m, other)
        sched = decode_state(m, pre.sched)
        c1 = _concrete_decision(scheduler, setting, M, *s1, sched_state=sched)
        c2 = _concrete_decision(scheduler, setting, M, *s2, sched_state=sched)
        name = spec if spec is not None else scheduler.name
        params = setting.params(M)
        cmds = (
            replay_command(name, params, [], active=list(s1[0]) or None, waiting=list(s1[1]) or None) + " --slots 1",
            replay_command(name, params, [], active=list(s2[0]) or None, waiting=list(s2[1]) or None) + " --slots 1",
        )
        pair = Pair(M, s1, s2, (_show(c1), _show(c2)), _show(c1) != _show(c2), cmds, sched)
        v = Refuted(None, "the decision depends on o although the rule declares clairvoyant=False")
    return Claim("non-clairvoyant", v, tuple(obs), pair.describe() if pair else "", pair)


def _wanted(traits: Traits, only: Sequence[str]) -> list[tuple[str, str]]:
    """``(key, name)`` of each claim ``traits`` declares (``only``: the groups named there)."""
    groups = set(only)

    def want(n: str) -> bool:
        return not groups or n in groups

    out: list[tuple[str, str]] = []
    if traits.fcfs and want("fcfs"):
        out.append(("fcfs", "FCFS admissions"))
    if not traits.clairvoyant and want("non-clairvoyant"):
        out.append(("non-clairvoyant", "non-clairvoyant"))
    if not traits.negative_control and want("progress"):
        # a rule that may give running requests no work (stalls_running: SGLang's prefill-only steps,
        # and its retraction of the request with the fewest outputs, which may be the oldest) claims
        # neither that the oldest request advances every slot nor the ranking built on it: its drain
        # is bounded by the work left instead
        if not traits.stalls_running:
            out.append(("oldest", "oldest running request progresses"))
        out.append(("lone-head", "lone head admitted" if traits.fcfs else "empty server admits"))
        if not traits.stalls_running:
            out.append(("ranking", "no livelock (ranking function)"))
    return out


def _free_assumptions(setting: Setting, check: ClassCheck, grants: bool, stateful: bool) -> tuple[str, ...]:
    """What a claim proved for any number of requests assumes (no K, no Q)."""
    return setting.assumptions() + (
        "any number of active and queued requests (no K, no Q)",
        "every request well-formed (s, o ≥ 1, B⌈(s+o)/B⌉ ≤ M, 0 < p < s + o when active)"
        + ("" if grants else ", whole chunks in prefill"),
        "the rule sees any prefix of the queue (the engine's window)",
    ) + (("the rule's state within its declared bounds",) if stateful else ()) + check.premises


def prove_claims(
    scheduler: Scheduler,
    setting: Setting | None = None,
    *,
    K: int = 3,
    Q: int = 3,
    spec: str | None = None,
    budget: Budget | None = None,
    only: Sequence[str] = (),
    unbounded: bool = True,
) -> ClaimResult:
    """Check every claim ``scheduler`` declares (or the groups named in ``only``:
    ``fcfs``, ``non-clairvoyant``, ``progress``).

    With ``unbounded`` (the default) a rule in the prefix-fold class gets each
    claim for any number of requests (:mod:`kvstab.proofs.claims_folds`) where
    its one-step facts hold; every other claim, and every claim of a rule
    outside the class, is checked with at most ``K`` active and ``Q`` queued
    requests, and its :attr:`Claim.scope` says so (its :attr:`Claim.note` why).
    """
    setting = setting or Setting()
    budget = budget or Budget()
    traits = traits_of(scheduler)
    wanted = _wanted(traits, only)
    free: dict[str, FreeClaim] = {}
    why_bounded = "the bounded check was asked for"
    check = None
    if unbounded and wanted:
        check, free = free_claims(scheduler, setting, budget, [k for k, _ in wanted])
        if not check.member:
            why_bounded = f"outside the prefix-fold class: {check.reason}"
    frame: tuple[StepTerms, list[z3.BoolRef]] | None = None

    def bounded() -> tuple[StepTerms, list[z3.BoolRef]]:
        # built once, and only if some claim needs it
        nonlocal frame
        if frame is None:
            budget.group(f"declared claims at K = {K}, Q = {Q}")
            pre = fresh_state("pre", K, Q, state_vars_of(scheduler))
            step = encode_step(scheduler, pre, setting, "post")
            frame = (step, _premises(pre, step, setting))
        return frame

    claims: list[Claim] = []
    for key, name in wanted:
        got = free.get(key)
        if got is not None and isinstance(got.verdict, Proved) and check is not None:
            grants = check.sides is not None and check.sides.grants
            v = Proved(got.verdict.method, _free_assumptions(setting, check, grants, bool(state_vars_of(scheduler))))
            claims.append(Claim(name, v, got.obligations, scope=SCOPE, facts=got.facts))
            continue
        step, prem = bounded()
        match key:
            case "fcfs":
                c = _fcfs(step, setting, prem, budget)
            case "non-clairvoyant":
                c = _non_clairvoyant(scheduler, spec, setting, step.pre, prem, budget)
            case "oldest":
                c = _oldest(step, setting, prem, budget)
            case "lone-head":
                c = _lone_head(step, setting, prem, budget, traits.fcfs)
            case _:
                c = _ranking(step, setting, prem, budget)
        if isinstance(c.verdict, Refuted) and c.state is not None and not _breaks(key, scheduler, setting, c.state):
            # the encoding and the rule disagree on this state (a rule that reads an empty slot's
            # fields in the symbolic view, say): never a refutation
            c = dataclasses.replace(c, verdict=Unknown(
                "the bounded counterexample does not reproduce when the rule is re-run on it with integers "
                "(does the rule read the fields of an empty slot? mask them with `present`)"
            ), witness=c.witness + "\n(not reproduced on the concrete rule)")
        note = why_bounded
        if got is not None and isinstance(got.verdict, Unknown):
            note = got.verdict.reason
        obs = (got.obligations if got is not None else ()) + c.obligations
        claims.append(dataclasses.replace(c, name=name, obligations=obs, scope=f"K ≤ {K}, Q ≤ {Q}", note=note))
    return ClaimResult(scheduler.name, tuple(claims))
