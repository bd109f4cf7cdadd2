"""The memory invariant for any number of active and queued requests.

A bounded proof (``proofs/induction.py``) covers states with at most ``K``
active and ``Q`` queued requests.  This module proves the per-slot memory
invariant with no bound at all, for the **prefix-fold class**: rules that read
``view.active`` and ``view.waiting`` only through the contract's folds
(:func:`kvstab.contract.scan` and what is built on it: ``preempt_newest``,
``fcfs_admit``, ``sum_of`` …, and ``fcfs_admit_projected``).  Every solver
query is about *one* entry and *one* accumulator (or one request's
projection), so nothing in it mentions ``K`` or ``Q``, and neither does the
verdict.

**Membership is structural** (:func:`classify`): the rule runs once on a view
whose sequences cannot be iterated, measured or indexed
(:func:`kvstab.proofs.folds.run_abstract`); each fold records its step
instead of unrolling it, and every step must be a pure function.  A rule that
completes that run decides a slot of ``n`` entries by the ``n``-fold unrolling
of the recorded steps, for every ``n`` — no size is sampled.  The decision
must then come from the folds: the preempt flags and the active grants from
one fold over the active list (or be constants; they may read a
``retract_until_fits``'s flags), the admit flags and the queue's grants from
one fold over the queue, or from ``fcfs_admit_projected``.  A ``select``
between two sequences makes cases, each with its own fold (``sglang``).

**Two theorems**, argued by hand in ``docs/proofs.md``:

* the **fold theorem** (:mod:`kvstab.proofs.loops`): loop invariants of each
  fold's step — found by Houdini from a menu of linear atoms, then proved —
  with ghost counters of what the engine charges, imply the slot's checks;
  with the per-request facts below the next state is well-formed again.
  ``current-fit``, ``vllm-v1`` (grants, token budget, ``max_num_seqs``),
  ``sglang`` (a stateful rule, case by case, with the retraction lemma) and,
  with the cost invariant ``Σ_active c(a) ≤ M``, ``reserve``;
* the **projection theorem** (:mod:`kvstab.proofs.projection`): per-request
  facts about the rule's projection and the lemma that a sum of projections
  peaks at a finish slot keep ``∀τ ≥ 1: Σ_active P(τ) ≤ M``.  ``lookahead``.

A rule outside the class, or whose obligations are not all ``unsat``, gets the
bounded flow, and the report says why in a note: never a silent ``Proved``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import z3

from kvstab.contract import Scheduler, state_vars_of
from kvstab.model import progress_after
from kvstab.proofs.encoding import OPS, Entry, Setting, held, var_in_bounds
from kvstab.proofs.folds import Fold, Lazy, NotAFold, Program, run_abstract
from kvstab.proofs.loops import ActiveSide, Sides, free_constants, obligation, prove_folds, rename_entry
from kvstab.proofs.projection import INVARIANT, projection_obligations
from kvstab.proofs.solver import Budget, Status, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict, passed
from kvstab.symbolic import Sym, unwrap

__all__ = ["ClassCheck", "UnboundedResult", "classify", "prove_unbounded", "THEOREM", "PROJECTION_THEOREM"]

#: the names of the arguments, as verdicts and reports print them
THEOREM = "prefix-fold theorem (loop invariants of each fold's step; induction over the running list and the queue)"
PROJECTION_THEOREM = "prefix-fold theorem, projection form (per-request facts; a sum of projections peaks at a finish slot)"

#: the structural premise, as a verdict states it
P0 = (
    "P0 (structural): the rule reads view.active and view.waiting only through kvstab.contract's folds — "
    "checked by running it on a view whose sequences cannot be iterated, measured or indexed, so its decision "
    "for n entries is the n-fold unrolling of the recorded steps, for every n; every step is a pure function "
    "(no global or enclosing-variable assignment, no mutable capture), checked on its code"
)


@dataclass(frozen=True, slots=True)
class ClassCheck:
    """Whether a rule is in the prefix-fold class, and why not when it is not."""

    member: bool
    reason: str
    premises: tuple[str, ...] = ()
    #: ``"fold"`` or ``"projection"`` for a member
    form: str = ""
    program: Program | None = None
    sides: Sides | None = None


@dataclass(frozen=True, slots=True)
class UnboundedResult:
    """The verdict for every ``K`` and ``Q``, the class check, the obligations
    and the loop invariants the proof rests on."""

    verdict: Verdict
    check: ClassCheck
    obligations: tuple[Obligation, ...] = field(default=())
    invariants: tuple[str, ...] = field(default=())


def _mentions(term: z3.ExprRef, f: Fold) -> bool:
    """Whether ``term`` reads the fold's element or accumulator (else it is the same for every entry)."""
    e = f.entry
    own = {v.get_id() for v in (e.rid, e.s, e.o, e.p, e.shared, *f.acc, *(v for v, _, _ in f.links))}
    return any(v.get_id() in own for v in free_constants(term))


def _output(prog: Program, seq: Any, base: str, what: str) -> tuple[Fold, z3.ExprRef]:
    """The fold and term behind one of the decision's sequences."""
    if not (isinstance(seq, Lazy) and seq.base == base and seq.kind[0] == "out"):
        raise NotAFold(f"decision.{what} is not the output of a fold over view.{base}")
    f = prog.folds[seq.kind[1]]
    term = f.outs[seq.kind[2]]
    assert term is not None
    return f, term


#: one case of the active side: its condition, its name, and the part's (fold, term)
_Branch = tuple[z3.BoolRef, list[str], tuple[Fold | None, z3.ExprRef]]


def _branches(prog: Program, seq: Any, what: str) -> list[_Branch]:
    """The active list's part behind ``seq``, case by case: a fold's output, a retraction's
    flags, or a selection between two of them (each case a condition on the folds' results)."""
    if isinstance(seq, Lazy) and seq.base == "active" and seq.kind[0] == "retracted":
        return [(z3.BoolVal(True), [], (None, prog.retractions[seq.kind[1]].out))]
    if isinstance(seq, Lazy) and seq.base == "active" and seq.kind[0] == "select":
        _, cond, then, other = seq.kind
        out: list[_Branch] = []
        for c, words, seq2 in ((cond, _pretty(prog, cond), then), (z3.Not(cond), f"¬({_pretty(prog, cond)})", other)):
            out += [(z3.And(c, c2), [words, *w2], part) for c2, w2, part in _branches(prog, seq2, what)]
        return out
    return [(z3.BoolVal(True), [], _output(prog, seq, "active", what))]


def _pretty(prog: Program, term: z3.ExprRef) -> str:
    """A condition on the folds' results, their finals named as the steps name them."""
    pairs = [
        (fin, z3.Const(f"{name}@fold{f.index}", fin.sort()))
        for f in prog.folds
        for fin, name in zip(f.final, f.names if len(f.names) == len(f.final) else [f"acc{i}" for i in range(len(f.final))])
    ]
    return str(z3.substitute(term, *pairs) if pairs else term)


def _one_host(parts: list[tuple[Fold | None, z3.ExprRef]], what: str) -> int | None:
    hosts = {f.index for f, t in parts if f is not None and _mentions(t, f)}
    if len(hosts) > 1:
        raise NotAFold(f"the {what} come from two different folds ({', '.join(f'fold {h}' for h in sorted(hosts))})")
    return next(iter(hosts), None)


def _sides(prog: Program) -> Sides:
    """Which fold each part of the decision comes from, case by case (see :class:`Sides`)."""
    d = prog.decision
    pres = _branches(prog, d.preempt, "preempt")
    grant_as: list[_Branch] = [(z3.BoolVal(True), [], (None, z3.IntVal(0)))]
    grant_w = None
    if d.grants is not None:
        g = d.grants
        if not (isinstance(g, Lazy) and g.kind[0] == "concat"):
            raise NotAFold("decision.grants is not (the active list's grants) + (the queue's grants), each from a fold")
        ga, gw = g.kind[1]
        grant_as = _branches(prog, ga, "grants (active part)")
        grant_w = _output(prog, gw, "waiting", "grants (queue part)")
    adm = _output(prog, d.admit, "waiting", "admit")
    parts_w = [adm] + ([grant_w] if grant_w is not None else [])
    # what the engine accepts (check_decision_values): truth values for the flags, integers for grants
    checks = [("admit", adm[1], z3.BoolSort())] + [("preempt", p[2][1], z3.BoolSort()) for p in pres]
    if d.grants is not None:
        checks += [("grants", p[2][1], z3.IntSort()) for p in grant_as] + [("grants", grant_w[1], z3.IntSort())]  # type: ignore[index]
    for what, term, sort in checks:
        if term.sort() != sort:
            raise NotAFold(f"decision.{what} holds {term.sort()} terms, not {sort} (the engine rejects them)")
    active = []
    for (c1, w1, pre), (c2, w2, grant) in itertools.product(pres, grant_as):
        cond = z3.simplify(z3.And(c1, c2))
        if z3.is_false(cond):
            continue
        words = w1 + [w for w in w2 if w not in w1]
        active.append(
            ActiveSide(
                cond,  # type: ignore[arg-type]
                " ∧ ".join(words),
                _one_host([pre, grant], "preempt flags and the active grants"),
                pre[1],  # type: ignore[arg-type]
                None if d.grants is None else grant[1],  # type: ignore[arg-type]
            )
        )
    return Sides(
        active=tuple(active),
        waiting_host=_one_host(parts_w, "admit flags and the queue's grants"),  # type: ignore[arg-type]
        admit=adm[1],  # type: ignore[arg-type]
        waiting_grant=None if grant_w is None else grant_w[1],  # type: ignore[arg-type]
        grants=d.grants is not None,
    )


def classify(scheduler: Scheduler, setting: Setting) -> ClassCheck:
    """Run the rule on a view of unknown length and say which theorem applies (if any)."""
    try:
        prog = run_abstract(scheduler, setting)
        d = prog.decision
        if isinstance(d.admit, Lazy) and d.admit.kind[0] == "projected":
            f, term = _output(prog, d.preempt, "active", "preempt")
            if not z3.is_false(term):
                raise NotAFold("a projected admission with preemption (the projection form never preempts)")
            if d.grants is not None:
                raise NotAFold("a projected admission with grants (the projection form runs full units)")
            if state_vars_of(scheduler):
                raise NotAFold("a projected admission in a stateful rule (the projection form is stateless)")
            if setting.token_budget is not None:
                raise NotAFold("a token budget (the projection form runs every request one full unit)")
            form = (
                "projection form: decision = (no preemption, kvstab.contract.fcfs_admit_projected with the rule's "
                f"projection, {prog.projected.where if prog.projected else '?'})"
            )
            return ClassCheck(True, "fcfs_admit_projected, no preemption", (form, P0), "projection", prog)
        sides = _sides(prog)
    except NotAFold as exc:
        return ClassCheck(False, str(exc))
    where = {f.index: f.where for f in prog.folds}

    def source(side: ActiveSide) -> str:
        ids = {v.get_id() for t in (side.preempt, side.grant) if t is not None for v in free_constants(t)}
        parts = [f"fold {side.host} ({where[side.host]})"] if side.host is not None else []
        parts += [f"retraction {r.index} ({r.where})" for r in prog.retractions if r.out.get_id() in ids]
        return " and ".join(parts) or "constants"

    if len(sides.active) == 1 and not sides.active[0].label:
        active = source(sides.active[0])
    else:
        active = "; ".join(f"{source(a)} where {a.label}" for a in sides.active)
    form = (
        "fold form: preempt flags and active grants from "
        + active
        + "; admit flags and queue grants from "
        + (f"fold {sides.waiting_host} ({where[sides.waiting_host]})" if sides.waiting_host is not None else "constants")
    )
    return ClassCheck(True, "made of folds", (form, P0), "fold", prog, sides)


# --- prefix caching: the preempted requests are a newest-first suffix

#: why a suffix matters, as the verdict states it
SUFFIX = (
    "prefix caching: the preempted requests are a suffix of the active list (none for a rule that never "
    "preempts; else proved by the 'suffix' obligations: once a step preempts, every later step does), so the "
    "survivors keep the oldest holder of every block they hold and the view's charges (entries net of shared) "
    "sum to the pool's distinct blocks in the slot (docs/MODEL.md, 'The model with prefix caching', item 4)"
)


#: the cost invariant across slots under prefix caching (by hand, docs/proofs.md)
COST_HANDOVER = (
    "prefix caching, across slots (by hand, docs/proofs.md): c is taken on the view's entry, net of what older "
    "requests hold; a finishing request hands its shared blocks to the next-oldest holder, whose c grows by at "
    "most what the finishing one's c counted, so Σ_active c does not grow"
)

#: the projection form under prefix caching
WHOLE_TABLES = (
    "prefix caching: each request is projected with its whole table (shared added back, "
    "kvstab.contract.fcfs_admit_projected), a waiting one from its cached progress; the pool's distinct blocks are "
    "at most the sum of the tables, so Σ P(1) bounds the slot's memory and INV bounds every future slot's"
)


def _suffix_obligations(prog: Program, sides: Sides, setting: Setting, budget: Budget) -> list[Obligation]:
    """With prefix caching the view charges each block to its oldest holder, exact in the
    slot only when the victims are a suffix of the active list (an older victim would hand
    its shared blocks to a younger survivor, who was shown them as free of charge).  For
    each active host whose preempt flag is not the constant false, find ``J`` (the
    accumulator leaves that stay ``≥ 0``: true at the start, kept by every step) and a
    leaf ``v`` with ``I = M < v ∧ J`` such that: a step that preempts (from ``J``) leaves
    ``I``; under ``I`` every step preempts; ``I`` is kept.  By induction over the list,
    the flags are false up to some entry and true from there on."""
    obs: list[Obligation] = []
    M = setting.M_term
    base = setting.base_constraints()
    for side in sides.active:
        if z3.is_false(z3.simplify(side.preempt)):
            continue
        if side.host is None:
            return [Obligation("suffix", Unknown("preempt flags from a retraction: not proved a suffix under prefix caching"),
                               0.0, conjunct="the preempted requests are a suffix")]
        f = prog.folds[side.host]
        if f.links:
            return [Obligation("suffix", Unknown(f"fold {f.index} reads another fold's outputs: not proved a suffix"),
                               0.0, conjunct="the preempted requests are a suffix")]
        wf = base + _wf_active_caching(f.entry, setting)
        nxt = list(zip(f.acc, f.nxt))
        ints = [a for a in f.acc if isinstance(a, z3.ArithRef) and a.is_int()]
        # J: the leaves that stay ≥ 0 (Houdini over "leaf ≥ 0": true at the start, kept by every step)
        signs = [a >= 0 for a in ints]
        start = list(zip(f.acc, f.init))
        while True:
            J = z3.And(*signs) if signs else z3.BoolVal(True)
            keep = [c for c in signs
                    if _holds(base + [z3.Not(z3.substitute(c, *start))], budget) is False
                    and _holds(wf + [J, z3.Not(_stepped(c, nxt))], budget) is False]
            if len(keep) == len(signs):
                break
            signs = keep
        J = z3.And(*signs) if signs else z3.BoolVal(True)
        tried: list[Obligation] = []
        for leaf in ints:
            inv = z3.And(M < leaf, J)
            label = f"fold {f.index} ({f.where}): with I = M < {leaf}" + (f" ∧ {J}" if signs else "")
            got = obligation("suffix", base, z3.substitute(J, *start), budget, f"{label}: J holds at the start")
            got += obligation("suffix", wf + [J], _stepped(J, nxt), budget, f"{label}: every step keeps J")
            got += obligation("suffix", wf + [J, side.preempt], _stepped(inv, nxt), budget,
                              f"{label}: a step that preempts leaves I")
            got += obligation("suffix", wf + [inv], side.preempt, budget, f"{label}: under I every step preempts")
            got += obligation("suffix", wf + [inv], _stepped(inv, nxt), budget, f"{label}: I is kept")
            if all(passed(o.verdict) for o in got):
                obs += got
                break
            tried = tried or got
        else:
            return obs + (tried or [Obligation("suffix", Unknown(f"fold {f.index}: no accumulator leaf to try"), 0.0,
                                               conjunct="the preempted requests are a suffix")])
    return obs


def _stepped(term: z3.BoolRef, nxt: list[tuple[z3.ExprRef, z3.ExprRef]]) -> z3.BoolRef:
    """``term`` about the accumulator, after one step (each leaf replaced by its next value)."""
    return z3.substitute(term, *nxt) if nxt else term  # type: ignore[return-value]


def _holds(premises: list[z3.BoolRef], budget: Budget) -> bool | None:
    """Whether ``premises`` are satisfiable (``None``: undecided) — a probe for the search, never a verdict."""
    st = solve(premises, budget, "unbounded-suffix-search").status
    return None if st is Status.UNKNOWN else st is Status.SAT


def _wf_active_caching(e: Entry, setting: Setting) -> list[z3.BoolRef]:
    """A well-formed active entry as a view with prefix caching shows it (no alignment)."""
    M = setting.M_term
    return [e.s >= 1, e.o >= 1, held(e.s + e.o, setting) <= M, e.p > 0, e.p < e.s + e.o,
            e.shared >= 0, e.shared % setting.block == 0]


# --- per-request facts (the same for every rule of the class)


def _entry(name: str) -> Entry:
    return Entry(z3.BoolVal(True), z3.Int(f"{name}.rid"), z3.Int(f"{name}.s"), z3.Int(f"{name}.o"), z3.Int(f"{name}.p"))


def _after(e: Entry, grant: z3.ArithRef | None, setting: Setting) -> z3.ArithRef:
    out = unwrap(progress_after(Sym(e.s), Sym(e.p), setting.chunk, None if grant is None else Sym(grant), OPS))
    assert isinstance(out, z3.ArithRef)
    return out


def _per_request(setting: Setting, budget: Budget, grants: bool) -> list[Obligation]:
    """What one request does in a slot, whatever the rule decided (the grant is
    any integer when the rule grants; the engine clamps it to one unit): its
    memory after the slot is ``≥ 0``, a running request that stays is still
    well-formed, and what it keeps is at most what it was charged; a full
    first unit leaves an admitted request well-formed."""
    M = setting.M_term
    x = _entry("x")
    g = z3.Int("x.grant") if grants else None
    caching = setting.prefix_caching
    aligned = not grants and not caching  # a prefill started past a cached prefix is not chunk-aligned
    wf = [M >= max(1, setting.block), x.s >= 1, x.o >= 1, held(x.s + x.o, setting) <= M, x.p > 0, x.p < x.s + x.o]
    if aligned:
        wf.append(z3.Implies(x.p < x.s, x.p % setting.chunk == 0))
    a = _after(x, g, setting)
    obs = obligation("per request", wf, held(a, setting) >= 0, budget, "post-slot memory ≥ 0")
    stays = a < x.s + x.o
    well = [a > 0, a < x.s + x.o]
    if aligned:
        well.append(z3.Implies(a < x.s, a % setting.chunk == 0))
    obs += obligation("per request", wf + [stays], z3.And(*well), budget, "a running request that stays is well-formed")
    obs += obligation(
        "per request", wf, z3.If(stays, held(a, setting), 0) <= held(a, setting), budget,
        "what it keeps ≤ what the slot charged it",
    )
    # an admitted request starts at its cached prefix (prefix caching: whole blocks, at most s − 1)
    c = z3.Int("x.cached") if caching else z3.IntVal(0)
    fresh = Entry(x.present, x.rid, x.s, x.o, c)
    a0 = _after(fresh, g, setting)
    new = [M >= max(1, setting.block), x.s >= 1, x.o >= 1, held(x.s + x.o, setting) <= M]
    if caching:
        new += [c >= 0, c <= x.s - 1, c % setting.block == 0]
    obs += obligation("per request", new, held(a0, setting) >= 0, budget, "an admitted request's memory ≥ 0")
    if caching and not grants:
        obs += obligation(
            "per request", new, z3.And(a0 > c, a0 < x.s + x.o), budget,
            "an admitted request's first unit past its cached prefix leaves it well-formed",
        )
    elif not grants:  # with grants, the queue's fold proves that an admitted request makes progress
        obs += obligation(
            "per request", new, z3.And(a0 > 0, z3.Implies(a0 < x.s, a0 % setting.chunk == 0)), budget,
            "an admitted request's first unit leaves it well-formed",
        )
    return obs


def _cost_facts(cost: z3.ArithRef, src: Entry, setting: Setting, budget: Budget, grants: bool) -> list[Obligation]:
    """The cost invariant across slots: ``c ≥ 0`` for a request at any progress
    (a fresh one included) and ``c`` does not grow while the request stays."""
    M = setting.M_term
    y = _entry("y")
    prem = [M >= max(1, setting.block), y.s >= 1, y.o >= 1, held(y.s + y.o, setting) <= M, y.p >= 0, y.p < y.s + y.o]
    if not grants and not setting.prefix_caching:
        prem.append(z3.Implies(y.p < y.s, y.p % setting.chunk == 0))
    c = rename_entry(cost, src, y)
    g = z3.Int("y.grant") if grants else None
    a = _after(y, g, setting)
    moved = Entry(y.present, y.rid, y.s, y.o, a)
    obs = obligation("cost", prem, c >= 0, budget, "c(a) ≥ 0")
    obs += obligation("cost", prem + [a < y.s + y.o], rename_entry(cost, src, moved) <= c, budget, "c does not grow while a stays")
    return obs


def _state_goals(prog: Program, scheduler: Scheduler) -> list[tuple[str, z3.BoolRef]]:
    """A stateful rule's next state within its declared bounds (its value is a term of the folds' results)."""
    svars = state_vars_of(scheduler)
    d = prog.decision
    if not svars or d.state is None:
        return []
    out: list[tuple[str, z3.BoolRef]] = []
    for v, val in zip(svars, d.state):
        z = unwrap(val)
        if not isinstance(z, z3.ArithRef):
            raise NotAFold(f"the next value of state variable {v.name!r} is {val!r}, not a number")
        if z.is_real() and not v.real:
            # the engine rejects it (check_next_state), and the bounded encoding says so
            raise NotAFold(f"state variable {v.name!r} is an integer but its next value is a real-valued term")
        out.append((f"state {v.name}′ ∈ [{v.lo!r}, {v.hi!r}]", var_in_bounds(v, z)))
    return out


def prove_unbounded(scheduler: Scheduler, setting: Setting, budget: Budget | None = None) -> UnboundedResult:
    """Prove the per-slot memory invariant for every number of requests, or say
    why the rule is outside the class (then only a bounded proof applies)."""
    budget = budget or Budget()
    check = classify(scheduler, setting)
    if not check.member or check.program is None:
        return UnboundedResult(Unknown(f"outside the prefix-fold class: {check.reason}"), check)
    prog = check.program
    svars = state_vars_of(scheduler)
    invariants: tuple[str, ...] = ()
    cost_line: tuple[str, ...] = ()
    caching_lines: tuple[str, ...] = ()
    if check.form == "projection":
        assert prog.projected is not None
        grants = False
        obs = projection_obligations(prog.projected, setting, budget) + _per_request(setting, budget, False)
        method = PROJECTION_THEOREM
        if setting.prefix_caching:
            caching_lines = (WHOLE_TABLES,)
        invariants = (f"state invariant: {INVARIANT}",)
    else:
        assert check.sides is not None
        grants = check.sides.grants
        bounds = [var_in_bounds(v, x) for v, x in zip(svars, prog.state)]
        try:
            goals = _state_goals(prog, scheduler)
        except NotAFold as exc:
            return UnboundedResult(Unknown(f"outside the prefix-fold class: {exc}"), check)
        out = prove_folds(prog, check.sides, setting, budget, bounds, goals)
        obs = list(out.obligations)
        invariants = tuple(f"loop invariant of {line}" for line in out.invariants)
        if not isinstance(out.verdict, Proved):
            return UnboundedResult(_not_applicable(out.verdict), check, tuple(obs), invariants)
        obs += _per_request(setting, budget, grants)
        if setting.prefix_caching:
            obs += _suffix_obligations(prog, check.sides, setting, budget)
            caching_lines = (SUFFIX,)
        if out.cost is not None and out.cost_entry is not None:
            obs += _cost_facts(out.cost, out.cost_entry, setting, budget, grants)
            cost_line = (f"state invariant: Σ_active c(a) ≤ M with c = {out.cost} (the rule's own sum)",)
            if setting.prefix_caching:
                cost_line += (COST_HANDOVER,)
        method = THEOREM
    bad = [o for o in obs if not passed(o.verdict)]
    if bad:
        return UnboundedResult(_not_applicable(bad[0].verdict, bad[0]), check, tuple(obs), invariants)
    assumptions = (
        setting.assumptions()
        + (
            "any number of active and queued requests (no K, no Q)",
            "request peaks fit: B⌈(s+o)/B⌉ ≤ M (the engine rejects other requests)",
            "grants as the rule gives them (the engine clamps each to one unit)"
            if grants
            else "every running request does one full unit per slot",
            "the rule sees any prefix of the queue (the engine's window)",
            "the state before the slot: well-formed, memory ≤ M"
            + (", active requests ≤ max_num_seqs" if setting.max_num_seqs is not None else "")
            + (", the rule's state within its declared bounds" if svars else "")
            + (f", and {INVARIANT}" if check.form == "projection" else ""),
        )
        + caching_lines
        + cost_line
        + check.premises
    )
    return UnboundedResult(Proved(method, assumptions), check, tuple(obs), invariants)


def _not_applicable(v: Verdict, ob: Obligation | None = None) -> Verdict:
    """An obligation that fails is about one entry, not a run: the bounded flow looks for one."""
    if isinstance(v, Refuted):
        what = ob.label() if ob is not None else "an obligation"
        return Unknown(f"the unbounded argument does not apply: {what} is false for some entry")
    if isinstance(v, Unknown) and ob is not None:
        return Unknown(f"the unbounded argument does not apply: {ob.label()}: {v.reason}", v.smt2)
    return v

