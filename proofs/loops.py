"""The fold theorem: the memory invariant from one step of each fold.

A rule made of folds (:mod:`kvstab.proofs.folds`) decides a slot by running
recorded steps over the active list and the queue.  Its slot charges at most
``M`` for *every* length of those lists if loop invariants exist such that

* **init** — the invariant holds of the fold's initial accumulator;
* **step** — for *any* well-formed entry and *any* accumulator satisfying the
  invariant, the step's next accumulator satisfies it again;
* **end** — the invariants of the final accumulators imply the slot's checks
  (memory ``≤ M``, tokens ``≤`` the budget, running ``≤ max_num_seqs``).

Each is one solver query about one entry and one accumulator: nothing in it
mentions ``K`` or ``Q``.  By induction over the list, the invariant holds
after every prefix of it, so it holds of the real final accumulator whatever
the list's length.

**Ghosts.**  What the end needs is a statement about sums over the list (the
slot's charge), so a loop's state is the accumulator *and* ghost counters that
add up, entry by entry, what the engine will do with it:

* on every fold over the active list: ``Σheld`` (memory held before the slot)
  and ``#active``; their finals are the pre state's memory and count, which the
  state invariant bounds (``≤ M``, ``≤ max_num_seqs``); optionally ``Σcost``, a
  per-request term the rule sums (see ``cost`` below);
* on the fold whose outputs are the rule's preempt flags and grants (the
  *host*) and on the fold whose outputs are its admit flags (and grants):
  ``Σcharge`` (the engine's charge of the entry after its grant),
  ``Σtokens`` and ``#running``, continuing from the active list into the queue.

**Strata.**  Invariants are found in two rounds.  First each fold on its own,
in the order the rule ran them, with ghosts ``Σheld`` and ``#active`` only; their
final instances are facts about the folds' results (``Φ``) — true facts about
the one slot, so every later query may assume them.  Then the two hosts with
every ghost, assuming ``Φ``.

**Search.**  The candidates are a fixed menu of linear atoms over the loop's
state (``x ≥ 0``, ``x ≤ M``, ``x ≤ y``, ``g + x ≤ budget`` …, the values a step
reads from the rule around it, where each variable started, "while a counter
has not risen, neither has ``y``", a ghost's distance to another); Houdini drops
the ones a model shows are not implied at the start or not preserved by a
step, until the rest are inductive.  The search is only a search: the
invariant it leaves is then proved by the named obligations above, each with
a vacuity guard, which are what a verdict rests on.

**Cases.**  A :func:`~kvstab.contract.select` in the decision (``sglang``'s
prefill or decode grants) and each retraction the active side reads (may it
run?) split the slot into cases; each case has its own hosts and its own end,
and a case whose premises are unsatisfiable is recorded as one that cannot
occur.  A retraction's flag is a fresh truth value per entry ("popped only
where it may run"); where it runs, the ghost ``Σkept`` (its cost over the
entries it keeps) is at most its cap at the end, by :func:`retraction_lemma`
and the premises :func:`_retraction_premises` proves of the rule's cost.

**Cost.**  A rule like ``reserve`` keeps an invariant across slots,
``Σ_active c(a) ≤ M`` for a per-request term ``c`` it sums.  The candidate
costs are the summands of the rule's own sums over the active list; with one
chosen, the pre state is assumed to satisfy it, the queue's host adds the
admitted requests' costs, the end requires ``Σcost ≤ M`` again, and
per-request facts (``c ≥ 0``, ``c`` does not grow while a request stays) carry
it to the next slot (checked by ``kvstab.proofs.unbounded``).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import z3

from kvstab.model import progress_after
from kvstab.proofs.encoding import OPS, Entry, Setting, held
from kvstab.proofs.folds import Fold, Program, Retraction, fresh_element
from kvstab.proofs.solver import Budget, Status, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict
from kvstab.symbolic import Sym, unwrap

__all__ = ["Sides", "ActiveSide", "FoldOutcome", "retraction_lemma", "prove_folds", "costs_of", "free_constants", "obligation", "guarded_check", "rename_entry", "GHOSTS"]

#: what each ghost counts, as reports print it
GHOSTS = {
    "Σheld": "memory the entries so far hold before the slot",
    "#active": "entries so far",
    "Σcost": "the cost term summed over the entries so far (and the admitted requests)",
    "Σcharge": "memory the engine charges the entries so far after their grants",
    "Σtokens": "tokens the entries so far process",
    "#running": "entries so far that run",
}


@dataclass(frozen=True, slots=True)
class ActiveSide:
    """The active list's part of the decision in one case of the slot: per entry, a
    term of the host fold's variables and of the retractions' flags (or a constant)."""

    #: when this case applies: a condition on the folds' results, the same for every entry
    cond: z3.BoolRef
    #: the case as a report names it
    label: str
    #: the fold whose outputs are the preempt flags / grants (``None``: they are constants or retraction flags)
    host: int | None
    preempt: z3.BoolRef
    grant: z3.ArithRef | None


@dataclass(frozen=True, slots=True)
class Sides:
    """Where the decision comes from: per entry, a term of the host fold's
    variables (or a constant), for the active list (in each case of a
    :func:`~kvstab.contract.select`) and for the queue."""

    #: the active list's side, one per case (one case, ``cond`` true, without a selection)
    active: tuple[ActiveSide, ...]
    #: the fold whose outputs are the admit flags / grants (``None``: nobody is ever admitted)
    waiting_host: int | None
    admit: z3.BoolRef
    waiting_grant: z3.ArithRef | None
    #: the rule gives grants (else every running request does one full unit)
    grants: bool


@dataclass(frozen=True, slots=True)
class FoldOutcome:
    """The verdict, every obligation, and the loop invariants that were proved."""

    verdict: Verdict
    obligations: tuple[Obligation, ...]
    invariants: tuple[str, ...] = ()
    cost: z3.ArithRef | None = None
    cost_entry: Entry | None = None


@dataclass(slots=True)
class _Loop:
    """One fold seen as a loop: its state (accumulator leaves and ghosts) and three maps of it."""

    label: str
    acc: list[tuple[str, z3.ExprRef]]
    ghosts: list[tuple[str, z3.ArithRef]]
    start: dict[str, z3.ExprRef]  # state variable (by name) -> its value before the first entry
    step: dict[str, z3.ExprRef]  # -> its value after one step
    end: dict[str, z3.ExprRef]  # -> the value it stands for at the end (final symbols)
    premises: list[z3.BoolRef]  # about the one entry of a step (well-formed, links)
    extra_goals: list[tuple[str, z3.BoolRef]] = field(default_factory=list)  # further step goals under the invariant
    #: the values the step reads from the rule around it (free memory, counts), by their names there
    captured: list[tuple[str, z3.ArithRef]] = field(default_factory=list)
    #: candidates the loop's builder knows of (a ghost's definition in terms of the others)
    extra_atoms: list[_Atom] = field(default_factory=list)
    _pairs: dict[int, list[tuple[z3.ExprRef, z3.ExprRef]]] = field(default_factory=dict)
    _at: dict[tuple[int, int], tuple[z3.BoolRef, z3.BoolRef]] = field(default_factory=dict)

    def variables(self) -> list[z3.ExprRef]:
        return [v for _, v in self.acc] + [v for _, v in self.ghosts]

    def at(self, where: dict[str, z3.ExprRef], term: z3.BoolRef) -> z3.BoolRef:
        """``term`` (over the loop's state) with the state replaced by ``where``'s values."""
        pairs = self._pairs.get(id(where))
        if pairs is None:  # naming a z3 variable prints it: once per map, not once per atom
            pairs = self._pairs[id(where)] = [(v, where[str(v)]) for v in self.variables()]
        # Houdini substitutes every candidate at every round: once per atom and map is enough
        key = (id(where), term.get_id())
        hit = self._at.get(key)
        if hit is not None and hit[0].eq(term):
            return hit[1]
        out = z3.substitute(term, *pairs) if pairs else term
        assert isinstance(out, z3.BoolRef)
        self._at[key] = (term, out)
        return out

    def at_all(self, where: dict[str, z3.ExprRef], terms: list[z3.BoolRef]) -> list[z3.BoolRef]:
        """:meth:`at` of each of ``terms``, the new ones substituted in one pass (they share the step's terms)."""
        new = [t for t in terms if (hit := self._at.get((id(where), t.get_id()))) is None or not hit[0].eq(t)]
        if len(new) > 1 and self._pairs.get(id(where)) is not None:
            both = z3.substitute(z3.And(*new), *self._pairs[id(where)])
            if z3.is_and(both) and both.num_args() == len(new):
                for t, u in zip(new, both.children()):
                    self._at[(id(where), t.get_id())] = (t, u)  # type: ignore[assignment]
        return [self.at(where, t) for t in terms]


@dataclass(frozen=True, slots=True)
class _Atom:
    label: str
    term: z3.BoolRef


def _all(terms: Sequence[z3.BoolRef]) -> z3.BoolRef:
    return z3.And(*terms) if terms else z3.BoolVal(True)


def _any(terms: Sequence[z3.BoolRef]) -> z3.BoolRef:
    return z3.Or(*terms) if terms else z3.BoolVal(False)


def _arith(v: z3.ExprRef) -> bool:
    return isinstance(v, z3.ArithRef)


def _menu(loop: _Loop, consts: list[tuple[str, z3.ArithRef]], wide: bool = True) -> list[_Atom]:
    """The candidate atoms over a loop's state (see the module docstring); ``wide=False``:
    the comparisons and bounds only (a proof is tried with those first)."""
    xs = [(n, v) for n, v in loop.acc if _arith(v)]
    gs = loop.ghosts
    out: list[_Atom] = []
    for n, x in xs + gs:
        out.append(_Atom(f"{n} ≥ 0", x >= 0))
        out += [_Atom(f"{n} ≤ {k}", x <= kv) for k, kv in consts]
    for g, gv in gs:
        for n, x in xs:
            out += [_Atom(f"{g} ≤ {n}", gv <= x), _Atom(f"{n} ≤ {g}", x <= gv)]
            out += [_Atom(f"{g} + {n} ≤ {k}", gv + x <= kv) for k, kv in consts]
    for n, x in xs:
        out += [_Atom(f"{n} ≤ {m}", x <= y) for m, y in xs if m != n]
    for g, gv in gs:
        out += [_Atom(f"{g} ≤ {h}", gv <= hv) for h, hv in gs if h != g]
    if not wide:
        return out
    every = xs + gs
    # the values the step reads from the rule around it: x ≤ k (used ≤ free)
    for k, kv in loop.captured:
        out += [_Atom(f"{n} ≤ {k}", x <= kv) for n, x in every]
    # where each variable started (x₀, its value before the first entry): it never falls below
    # it, or never rises above it; while a counter (a step adds 0 or 1) has not risen, another
    # variable has not either (while nothing joined the batch, it allocated nothing); a ghost
    # keeps its distance to another ghost or a counter (both grow by the same amounts)
    start = {n: _start_term(loop, x) for n, x in every}
    for n, x in every:
        if not _numeral(start[n]):
            out += [_Atom(f"{n} ≥ {n}₀", start[n] <= x), _Atom(f"{n} ≤ {n}₀", x <= start[n])]
    counters = [(n, x) for n, x in every if _counter(loop, x)]
    # (a count of every entry, #active, rises at every step: "while it has not risen" is the start)
    for n, x in [(n, x) for n, x in counters if _counter(loop, x, conditional=True)]:
        out += [_Atom(f"{n} ≤ {n}₀ ⇒ {m} ≤ {m}₀", z3.Implies(x <= start[n], y <= start[m])) for m, y in every if m != n]
    for g, gv in gs:
        for n, x in gs + [c for c in counters if c not in gs]:
            # two that start at numbers are already compared (g ≤ n, n ≤ g)
            if n != g and not (_numeral(start[g]) and _numeral(start[n])):
                d0 = start[g] - start[n]
                out += [_Atom(f"{g} − {n} ≤ {g}₀ − {n}₀", gv - x <= d0), _Atom(f"{g} − {n} ≥ {g}₀ − {n}₀", gv - x >= d0)]
    return out + list(loop.extra_atoms)


def _counter(loop: _Loop, x: z3.ExprRef, conditional: bool = False) -> bool:
    """Whether a step adds 0 or 1 to the integer ``x`` (a count of the entries so far that …;
    ``conditional``: one that depends on the entry, not a constant)."""
    if not (isinstance(x, z3.ArithRef) and x.is_int()):
        return False
    d = z3.simplify(loop.step[str(x)] - x)

    def unit(t: z3.ExprRef) -> bool:
        return z3.is_int_value(t) and t.as_long() in (0, 1)  # type: ignore[attr-defined]

    return (unit(d) and not conditional) or (z3.is_app_of(d, z3.Z3_OP_ITE) and unit(d.arg(1)) and unit(d.arg(2)))


def _start_term(loop: _Loop, x: z3.ExprRef) -> z3.ArithRef:
    t = loop.start[str(x)]
    assert isinstance(t, z3.ArithRef)
    return t


def _numeral(t: z3.ExprRef) -> bool:
    t = z3.simplify(t)
    return z3.is_int_value(t) or z3.is_rational_value(t)


def _show(atoms: Sequence[_Atom]) -> str:
    """The invariant as a reader wants it: ``x ≤ y ∧ y ≤ x`` printed as ``x = y``."""
    labels = [a.label for a in atoms]
    done: set[str] = set()
    parts: list[str] = []
    for lab in labels:
        if lab in done:
            continue
        lhs, sep, rhs = lab.partition(" ≤ ")
        if sep and "+" not in lhs and f"{rhs} ≤ {lhs}" in labels:
            done.add(f"{rhs} ≤ {lhs}")
            parts.append(f"{lhs} = {rhs}")
        else:
            parts.append(lab)
        done.add(lab)
    return " ∧ ".join(parts) if parts else "true"


def _houdini(
    loop: _Loop, cands: list[_Atom], context: list[z3.BoolRef], budget: Budget, phases: tuple[str, ...] = ("start", "step")
) -> list[_Atom] | None:
    """The largest subset of ``cands`` that holds at the start and is kept by
    every step (``None``: the solver left a query undecided); with ``phases=("step",)``
    the largest that every step keeps, wherever it starts.  A search: its
    answer is proved afterwards by :func:`_loop_obligations`."""
    quiet = dataclasses.replace(budget, keep_all=False)
    alive = list(cands)
    for phase in phases:
        while alive:
            where = loop.start if phase == "start" else loop.step
            loop.at(where, z3.BoolVal(True))  # names the map's variables once
            moved = loop.at_all(where, [a.term for a in alive])
            if phase == "start":
                query = context + [_any([z3.Not(t) for t in moved])]
            else:
                query = context + loop.premises + [a.term for a in alive] + [_any([z3.Not(t) for t in moved])]
            ans = solve(query, quiet, f"houdini-{loop.label}-{phase}")
            if ans.status is Status.UNSAT:
                break
            if ans.status is not Status.SAT or ans.model is None:
                return None
            m = ans.model
            keep = [a for a, t in zip(alive, moved) if z3.is_true(m.eval(t, model_completion=True))]
            if len(keep) == len(alive):  # cannot happen (the model breaks one); never loop forever
                return None
            alive = keep
    return alive


def obligation(name: str, premises: list[z3.BoolRef], goal: z3.BoolRef, budget: Budget, what: str) -> list[Obligation]:
    """A vacuity guard on ``premises``, then ``premises ∧ ¬goal`` unsat."""
    return guarded_check(name, what, premises, goal, budget, f"unbounded-{name}", f"{what}: false for some entry")[1]


def guarded_check(
    kind: str,
    what: str,
    premises: list[z3.BoolRef],
    goal: z3.BoolRef,
    budget: Budget,
    query: str,
    refuted: str,
) -> tuple[Verdict, list[Obligation], z3.ModelRef | None]:
    """A vacuity guard on ``premises`` (query ``<query>-premises``), then ``premises ∧ ¬goal``
    unsat (query ``query``): the goal's verdict (``Refuted`` says ``refuted``; ``Unknown`` when the
    guard fails), the obligations of ``kind`` named ``what [guard]`` and ``what``, and the model
    that breaks the goal, if one does."""
    t0 = time.perf_counter()
    g = solve(premises, budget, f"{query}-premises")
    t1 = time.perf_counter()
    v: Verdict
    if g.status is not Status.SAT:
        v = Unknown("vacuous premises" if g.status is Status.UNSAT else f"solver: {g.reason}", g.smt2)
        return v, [Obligation(kind, v, t1 - t0, conjunct=what + " [guard]")], None
    a = solve(premises + [z3.Not(goal)], budget, query)
    secs = time.perf_counter() - t1
    match a.status:
        case Status.UNSAT:
            v = Proved("unsat")
        case Status.SAT:
            v = Refuted(None, refuted)
        case _:
            v = Unknown(f"solver: {a.reason}", a.smt2)
    return (
        v,
        [
            Obligation(kind, Proved("premises satisfiable (vacuity guard)"), t1 - t0, conjunct=what + " [guard]"),
            Obligation(kind, v, secs, conjunct=what),
        ],
        a.model,
    )


def _loop_obligations(loop: _Loop, inv: list[_Atom], context: list[z3.BoolRef], budget: Budget) -> list[Obligation]:
    """The invariant holds at the start, and every step keeps it (and any further step goals)."""
    j = _all([a.term for a in inv])
    obs = obligation(loop.label, list(context), loop.at(loop.start, j), budget, "invariant holds at the start")
    prem = list(context) + loop.premises + [j]
    obs += obligation(loop.label, prem, loop.at(loop.step, j), budget, "every step keeps the invariant")
    for what, goal in loop.extra_goals:
        obs += obligation(loop.label, prem, goal, budget, what)
    return obs


def _passed(obs: Sequence[Obligation]) -> bool:
    return all(isinstance(o.verdict, Proved) for o in obs)


# --- building the loops


def _wf_active(e: Entry, setting: Setting, aligned: bool) -> list[z3.BoolRef]:
    """A well-formed active entry (present: the lists hold only real requests)."""
    M = setting.M_term
    out = [e.s >= 1, e.o >= 1, held(e.s + e.o, setting) <= M, e.p > 0, e.p < e.s + e.o]
    if setting.prefix_caching:
        # the view's entry net of what older requests hold: its shared part is whole blocks; a
        # prefill started past a cached prefix is not chunk-aligned (no alignment premise)
        out += [e.shared >= 0, e.shared % setting.block == 0]
    elif aligned:
        out.append(z3.Implies(e.p < e.s, e.p % setting.chunk == 0))
    return out


def _wf_waiting(e: Entry, setting: Setting) -> list[z3.BoolRef]:
    out = [e.s >= 1, e.o >= 1, held(e.s + e.o, setting) <= setting.M_term]
    if setting.prefix_caching:
        # its cached prefix (e.p, net of the shared part) is whole blocks, at most s − 1 (vLLM
        # recomputes the last prompt token: kv_cache_manager.py:295-302)
        out += [e.p >= 0, e.p <= e.s - 1, e.p % setting.block == 0, e.shared >= 0, e.shared % setting.block == 0]
    return out


def _after(e: Entry, grant: z3.ArithRef | None, setting: Setting) -> z3.ArithRef:
    """Progress after the slot's work: ``progress_after`` with the grant (``None``: a full unit)."""
    g = None if grant is None else Sym(grant)
    out = unwrap(progress_after(Sym(e.s), Sym(e.p), setting.chunk, g, OPS))
    assert isinstance(out, z3.ArithRef)
    return out


def rename_entry(term: z3.ExprRef, src: Entry, dst: Entry) -> z3.ExprRef:
    """``term`` written for ``src``'s entry variables, rewritten for ``dst``'s."""
    fields = zip((src.rid, src.s, src.o, src.p, src.shared), (dst.rid, dst.s, dst.o, dst.p, dst.shared))
    pairs = [(a, b) for a, b in fields if not a.eq(b)]
    pairs = [(a, b) for a, b in pairs if z3.is_const(a) and a.decl().kind() == z3.Z3_OP_UNINTERPRETED]
    return z3.substitute(term, *pairs) if pairs else term


def _leaf_names(f: Fold) -> list[tuple[str, z3.ExprRef]]:
    names = f.names if len(f.names) == len(f.acc) else tuple(f"acc[{i}]" for i in range(len(f.acc)))
    return list(zip(names, f.acc))


def costs_of(prog: Program, budget: Budget) -> list[tuple[z3.ArithRef, Fold]]:
    """The per-request terms the rule sums over the active list: every fold over
    it with no output and one accumulator ``acc`` whose step is ``acc + c(entry)``."""
    out: list[tuple[z3.ArithRef, Fold]] = []
    for f in prog.folds:
        if f.base != "active" or f.outs != (None,) or len(f.acc) != 1 or f.links or not _arith(f.acc[0]):
            continue
        acc = f.acc[0]
        c = z3.substitute(f.nxt[0], (acc, z3.IntVal(0) if acc.is_int() else z3.RealVal(0)))  # type: ignore[attr-defined]
        if any(v.eq(acc) for v in free_constants(c)):
            continue
        ans = solve([f.nxt[0] != acc + c], dataclasses.replace(budget, keep_all=False), f"cost-{f.index}")
        if ans.status is Status.UNSAT:
            assert isinstance(c, z3.ArithRef)
            out.append((c, f))
    return out


def free_constants(t: z3.ExprRef) -> set[z3.ExprRef]:
    """The uninterpreted constants (the variables) of ``t``."""
    seen: set[int] = set()
    out: set[z3.ExprRef] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        if x.get_id() in seen:
            continue
        seen.add(x.get_id())
        if z3.is_const(x) and x.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out.add(x)
        stack.extend(x.children())
    return out


@dataclass(slots=True)
class _Theorem:
    """Everything one attempt at the theorem shares."""

    prog: Program
    sides: Sides
    setting: Setting
    budget: Budget
    base: list[z3.BoolRef]
    consts: list[tuple[str, z3.ArithRef]]
    pre_memory: z3.ArithRef = field(default_factory=lambda: z3.Int("pre.Σheld"))
    pre_count: z3.ArithRef = field(default_factory=lambda: z3.Int("pre.#active"))
    pre_cost: z3.ArithRef = field(default_factory=lambda: z3.Int("pre.Σcost"))
    #: stratum-one invariants (fold index -> atoms), and their final instances
    inv1: dict[int, list[_Atom]] = field(default_factory=dict)
    phi: list[z3.BoolRef] = field(default_factory=list)
    obligations: list[Obligation] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    #: the wide menu (start values, counters, captured values, ghost differences, Σgrowth) is in play
    wide: bool = False
    #: per fold, the stratum-one candidates its stratum-one invariant dropped (by label)
    dead1: dict[int, set[str]] = field(default_factory=dict)
    #: what every step of a loop keeps, found once for the loops that recur case after case
    kept: dict[tuple[int, ...], tuple[object, list[_Atom] | None]] = field(default_factory=dict)

    def search(
        self, loop: _Loop, fold: int | None, ctx: list[z3.BoolRef], common: list[z3.BoolRef]
    ) -> list[_Atom] | None:
        """Houdini for a host's loop in one case.  The candidates stratum one dropped for
        the same fold (over its accumulator and ``Σheld``, ``#active`` alone) are not tried
        again.  The loops of the queue are the same in every case but for where they start,
        so what their steps keep is searched once, under the context ``common`` to every
        case, and each case then keeps what holds at its start (and is still kept without
        what it dropped)."""
        dead = self.dead1.get(fold, set()) if fold is not None else set()
        cands = [a for a in _menu(loop, self.consts, self.wide) if a.label not in dead]
        if common is ctx:  # nothing to share: the usual search (what fails at the start goes first, cheaply)
            return _houdini(loop, cands, ctx, self.budget)
        key = (
            *(a.term.get_id() for a in cands),
            -1,
            *(p.get_id() for p in loop.premises),
            -1,
            *(loop.step[str(v)].get_id() for v in loop.variables()),
        )
        if key not in self.kept:
            # the terms are kept alive with their ids (z3 reuses the id of a term that was freed)
            alive = (cands, list(loop.premises), dict(loop.step))
            self.kept[key] = (alive, _houdini(loop, cands, common, self.budget, phases=("step",)))
        found = self.kept[key][1]
        return None if found is None else _houdini(loop, found, ctx, self.budget)

    def links(self, f: Fold, tag: str) -> list[z3.BoolRef]:
        """Each linked element component is fold ``j``'s output at this entry for
        *some* accumulator satisfying ``j``'s invariant."""
        out: list[z3.BoolRef] = []
        for i, (var, j, c) in enumerate(f.links):
            src = self.prog.folds[j]
            copy = [_fresh_like(a, f"{tag}.link{i}.acc{k}") for k, a in enumerate(src.acc)]
            pairs = list(zip(src.acc, copy))
            term = src.outs[c]
            assert term is not None
            out.append(var == rename_entry(z3.substitute(term, *pairs) if pairs else term, src.entry, f.entry))
            for a in self.inv1.get(j, []):
                t = z3.substitute(a.term, *pairs) if pairs else a.term
                out.append(rename_entry(t, src.entry, f.entry))  # type: ignore[arg-type]
        return out

    def state_ghosts(self, f: Fold, tag: str, cost: tuple[z3.ArithRef, Fold] | None) -> tuple[
        list[tuple[str, z3.ArithRef]], dict[str, z3.ExprRef], dict[str, z3.ExprRef], dict[str, z3.ExprRef]
    ]:
        """``Σheld``, ``#active`` (and ``Σcost``) of a fold over the active list."""
        gs = [("Σheld", z3.Int(f"{tag}.Σheld")), ("#active", z3.Int(f"{tag}.#active"))]
        incs: list[z3.ArithRef] = [held(f.entry.p, self.setting), z3.IntVal(1)]
        ends: list[z3.ArithRef] = [self.pre_memory, self.pre_count]
        if cost is not None:
            gs.append(("Σcost", z3.Int(f"{tag}.Σcost")))
            incs.append(rename_entry(cost[0], cost[1].entry, f.entry))  # type: ignore[arg-type]
            ends.append(self.pre_cost)
        start = {str(v): z3.IntVal(0) for _, v in gs}
        step = {str(v): v + d for (_, v), d in zip(gs, incs)}
        end = {str(v): e for (_, v), e in zip(gs, ends)}
        return gs, start, step, end

    def loop1(self, f: Fold) -> _Loop:
        """Stratum one: the fold with the state ghosts only."""
        tag = f"s1.fold{f.index}"
        start = {str(a): i for a, i in zip(f.acc, f.init)}
        step = {str(a): n for a, n in zip(f.acc, f.nxt)}
        end = {str(a): x for a, x in zip(f.acc, f.final)}
        gs: list[tuple[str, z3.ArithRef]] = []
        prem = self.links(f, tag) + self.retracted(f)
        if f.base == "active":
            gs, s0, s1, s2 = self.state_ghosts(f, tag, None)
            start.update(s0)
            step.update(s1)
            end.update(s2)
            prem += _wf_active(f.entry, self.setting, not self.sides.grants)
        else:
            prem += _wf_waiting(f.entry, self.setting)
        return _Loop(
            f"fold {f.index}: {f.where}", _leaf_names(f), gs, start, step, end, prem, captured=list(f.consts)
        )

    def retracted(self, f: Fold) -> list[z3.BoolRef]:
        """A retraction's flag at an entry: popped only where the retraction may run."""
        return [z3.Implies(v, self.prog.retractions[r].allowed) for v, r in f.retracted]  # type: ignore[misc]


def _fresh_like(v: z3.ExprRef, name: str) -> z3.ExprRef:
    if v.sort() == z3.BoolSort():
        return z3.Bool(name)
    if isinstance(v, z3.ArithRef) and v.is_real():
        return z3.Real(name)
    return z3.Int(name)


def _base_facts(prog: Program, setting: Setting, th_pre: tuple[z3.ArithRef, z3.ArithRef]) -> list[z3.BoolRef]:
    """What the theorem assumes of the pre state: ``M ≥ B``, memory ``≤ M``, the
    active count ``≤ max_num_seqs``."""
    mem, count = th_pre
    M = setting.M_term
    out = [M >= max(1, setting.block), mem >= 0, mem <= M, count >= 0, prog.n_waiting >= 0]
    if setting.max_num_seqs is not None:
        out.append(count <= setting.max_num_seqs)
    return out


def prove_folds(
    prog: Program,
    sides: Sides,
    setting: Setting,
    budget: Budget,
    state_bounds: Sequence[z3.BoolRef] = (),
    state_goals: Sequence[tuple[str, z3.BoolRef]] = (),
) -> FoldOutcome:
    """The fold theorem for ``prog``: stratum one, the retractions' premises, then
    the hosts with each candidate cost (none first), case by case, then the end.
    ``state_bounds`` are a stateful rule's declared bounds on its pre state
    (assumed), ``state_goals`` its next state within them (proved at the end).  The
    first attempt whose every obligation is ``unsat`` is the proof; otherwise the
    failure of the attempt that came closest.

    The loop invariants are searched with the plain comparisons first; only if that
    proof fails is it searched again with the wide menu (its invariants are larger,
    so a rule the plain one proves keeps its small, quick obligations).  A rule with
    cases or a retraction relates its walks to one another (what one allocated to
    what another may), which the plain menu cannot say: it gets the wide one at once."""
    if prog.retractions or len(sides.active) > 1:
        return _prove_folds(prog, sides, setting, budget, state_bounds, state_goals, wide=True)
    out = _prove_folds(prog, sides, setting, budget, state_bounds, state_goals, wide=False)
    if isinstance(out.verdict, Proved) or not _worth_widening(out):
        return out
    wide = _prove_folds(prog, sides, setting, budget, state_bounds, state_goals, wide=True)
    return wide if isinstance(wide.verdict, Proved) or _misses(wide) <= _misses(out) else out


def _worth_widening(out: FoldOutcome) -> bool:
    """Whether a failed proof may pass with the wide menu: a loop invariant too weak for a
    goal, not a per-entry fact (a retraction's premises) or a question the solver left open."""
    bad = [o for o in out.obligations if not isinstance(o.verdict, Proved)]
    if not bad or any(isinstance(o.verdict, Unknown) and o.verdict.reason.startswith("solver") for o in bad):
        return False
    return not any(o.name.startswith("retraction") for o in bad)


def _prove_folds(
    prog: Program,
    sides: Sides,
    setting: Setting,
    budget: Budget,
    state_bounds: Sequence[z3.BoolRef],
    state_goals: Sequence[tuple[str, z3.BoolRef]],
    *,
    wide: bool,
) -> FoldOutcome:
    consts: list[tuple[str, z3.ArithRef]] = [("M", setting.M_term)]
    if setting.token_budget is not None:
        consts.append(("token_budget", z3.IntVal(setting.token_budget)))
    if setting.max_num_seqs is not None:
        consts.append(("max_num_seqs", z3.IntVal(setting.max_num_seqs)))
    th = _Theorem(prog, sides, setting, budget, [], consts, wide=wide)
    th.base = _base_facts(prog, setting, (th.pre_memory, th.pre_count)) + list(state_bounds)

    # stratum one: each fold on its own, in the order the rule ran them
    for f in prog.folds:
        loop = th.loop1(f)
        menu = _menu(loop, consts, th.wide)
        inv = _houdini(loop, menu, th.base + th.phi, budget)
        if inv is None:
            return FoldOutcome(Unknown(f"the solver left the loop-invariant search of {loop.label} undecided"), ())
        th.dead1[f.index] = {a.label for a in menu} - {a.label for a in inv}
        th.obligations += _loop_obligations(loop, inv, th.base + th.phi, budget)
        th.inv1[f.index] = inv
        th.phi += [loop.at(loop.end, a.term) for a in inv]
        th.shown.append(f"{loop.label}: {_show(inv)}")
    if not _passed(th.obligations):
        return _failed(th.obligations, th.shown)
    # each retraction's premises: every cost within [0, cap] (then the kept requests cost ≤ cap)
    for r in prog.retractions:
        th.obligations += _retraction_premises(th, r)
    if prog.retractions:
        th.obligations += retraction_lemma(max(len(r.keys) for r in prog.retractions), budget)
    if not _passed(th.obligations):
        return _failed(th.obligations, th.shown)

    # a cost is a sum the admission walk starts from (reserve's Σ peaks): the others cannot help it
    w = sides.waiting_host
    start_ids = {v.get_id() for t in (prog.folds[w].init if w is not None else ()) for v in free_constants(t)}
    costs: list[tuple[z3.ArithRef, Fold] | None] = [
        None, *(c for c in costs_of(prog, budget) if c[1].final[0].get_id() in start_ids)
    ]
    best: FoldOutcome | None = None
    for cost in costs:
        out = _attempt(th, cost, state_goals)
        if isinstance(out.verdict, Proved):
            return out
        # report the attempt that came closest (fewest obligations left unproved; the first on a tie)
        if best is None or _misses(out) < _misses(best):
            best = out
    assert best is not None
    return best


def _misses(out: FoldOutcome) -> int:
    """How many obligations an attempt left unproved (one stopped early counts as worst)."""
    return sum(1 for o in out.obligations if not isinstance(o.verdict, Proved)) or len(out.obligations) + 1


def _failed(obs: Sequence[Obligation], shown: Sequence[str]) -> FoldOutcome:
    bad = next(o for o in obs if not isinstance(o.verdict, Proved))
    if isinstance(bad.verdict, Unknown) and bad.verdict.reason.startswith("solver"):
        v: Verdict = Unknown(f"{bad.label()}: {bad.verdict.reason}", bad.verdict.smt2)
    else:
        v = Unknown(f"the fold theorem does not apply: {bad.label()} is not proved ({bad.verdict})")
    return FoldOutcome(v, tuple(obs), tuple(shown))


# --- retraction: the combinator's bound, proved once


def _retraction_premises(th: _Theorem, r: Retraction) -> list[Obligation]:
    """What the retraction lemma needs of one rule's retraction, where it may run: every
    request's cost (any well-formed one) in ``[0, cap]``, and ``cap ≥ 0`` (an empty list)."""
    ctx = th.base + th.phi + [r.allowed]
    name = f"retraction {r.index}"
    wf = _wf_active(r.entry, th.setting, not th.sides.grants)
    obs = obligation(name, ctx + wf, z3.And(r.cost >= 0, r.cost <= r.cap), th.budget, "every request's cost ∈ [0, cap]")
    obs += obligation(name, ctx, r.cap >= 0, th.budget, "cap ≥ 0")
    return obs


def retraction_lemma(n_keys: int, budget: Budget) -> list[Obligation]:
    """:func:`~kvstab.contract.retract_until_fits` keeps at most ``cap``, for any list.

    *The order* (:func:`~kvstab.contract.pops_before` on keys of ``n_keys``
    values): of two entries exactly one goes first, and it is transitive, over three
    entries at three positions and any keys — a strict total order, so the entries
    line up in the order they are popped.  *The bound*: the combinator pops entry
    ``i`` iff it is not last and the entries from ``i`` on cost more than ``cap``,
    which is a fold over that line-up taken from its end, carrying ``S`` (the cost
    of the entries from here on), ``kept`` (the kept ones') and ``seen``; with every
    cost in ``[0, cap]`` and ``cap ≥ 0`` its invariant ``0 ≤ kept ≤ S``,
    ``kept ≤ cap``, ``seen ≥ 0``, ``seen = 0 ⇒ S = 0`` holds at the start and is
    kept by every step — so the requests kept cost at most ``cap``, however many
    there are.  (The rule's flags are the combinator's: their concrete and
    symbolic forms are compared with popping one by one in
    ``tests/proofs/test_proofs_sglang.py``.)"""
    from kvstab.contract import pops_before

    name = "retraction lemma"
    keys = [tuple(z3.Int(f"lemma.key{e}.{i}") for i in range(n_keys)) for e in range(3)]

    def first(a: int, b: int) -> z3.BoolRef:
        """Entry ``a`` popped before entry ``b`` (their positions are their indices)."""
        t = unwrap(pops_before(OPS, tuple(Sym(k) for k in keys[a]), tuple(Sym(k) for k in keys[b]), a > b))
        return t if isinstance(t, z3.BoolRef) else z3.BoolVal(bool(t))

    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    order = [z3.Xor(first(a, b), first(b, a)) for a, b in pairs if a < b]
    order += [
        z3.Implies(z3.And(first(a, b), first(b, c)), first(a, c))
        for a, b in pairs
        for c in range(3)
        if c not in (a, b)
    ]
    obs = obligation(name, [z3.BoolVal(True)], z3.And(*order), budget, "the pop order is a strict total order")
    S, kept, seen, c, cap = (z3.Int(f"lemma.{n}") for n in ("S", "kept", "seen", "c", "cap"))

    def inv(S: z3.ArithRef, kept: z3.ArithRef, seen: z3.ArithRef) -> z3.BoolRef:
        return z3.And(0 <= kept, kept <= S, kept <= cap, seen >= 0, z3.Implies(seen <= 0, S <= 0))

    S1 = S + c
    popped = z3.And(seen >= 1, cap < S1)
    prem = [cap >= 0]
    obs += obligation(name, prem, inv(z3.IntVal(0), z3.IntVal(0), z3.IntVal(0)), budget, "the invariant holds at the start")
    obs += obligation(
        name, prem + [inv(S, kept, seen), c >= 0, c <= cap],
        inv(S1, kept + z3.If(popped, 0, c), seen + 1), budget, "every step (popped iff not last and the rest > cap) keeps it",
    )
    obs += obligation(name, prem + [inv(S, kept, seen)], kept <= cap, budget, "the kept requests cost ≤ cap")
    return obs


# --- one attempt: the hosts' loops with every ghost, case by case


def _cases(th: _Theorem, side: ActiveSide) -> list[tuple[str, list[z3.BoolRef], list[Retraction]]]:
    """The cases of one side: its condition, split on whether each retraction it reads may run."""
    used = _retractions_read(th, side)
    out = []
    for flags in itertools.product((True, False), repeat=len(used)):
        conds = [side.cond] + [r.allowed if a else z3.Not(r.allowed) for r, a in zip(used, flags)]
        words = [side.label] + [f"retraction {r.index} {'runs' if a else 'cannot run'}" for r, a in zip(used, flags)]
        out.append((", ".join(w for w in words if w), conds, [r for r, a in zip(used, flags) if a]))
    return out


def _retractions_read(th: _Theorem, side: ActiveSide) -> list[Retraction]:
    """The retractions whose flags the side's terms (or its host's elements) read."""
    ids = {v.get_id() for t in (side.preempt, side.grant) if t is not None for v in free_constants(t)}
    host = th.prog.folds[side.host] if side.host is not None else None
    return [
        r for r in th.prog.retractions
        if r.out.get_id() in ids or (host is not None and any(i == r.index for _, i in host.retracted))
    ]


def _attempt(th: _Theorem, cost: tuple[z3.ArithRef, Fold] | None, state_goals: Sequence[tuple[str, z3.BoolRef]]) -> FoldOutcome:
    """Every case of the slot, for one cost: in each, the hosts' loops, then the end."""
    obs = list(th.obligations)
    shown = list(th.shown)
    base = th.base + ([th.pre_cost <= th.setting.M_term] if cost is not None else [])
    ctx = base + th.phi
    quiet = dataclasses.replace(th.budget, keep_all=False)
    for side in th.sides.active:
        for label, conds, runs in _cases(th, side):
            t0 = time.perf_counter()
            ans = solve(ctx + conds, quiet, f"case-{label}")
            if ans.status is Status.UNSAT:
                obs.append(Obligation("case", Proved("unsat"), time.perf_counter() - t0, conjunct=f"{label}: cannot occur"))
                continue
            if ans.status is not Status.SAT:
                return FoldOutcome(Unknown(f"the solver left the case {label!r} undecided: {ans.reason}"), tuple(obs))
            hosts: list[int | None] = (
                [side.host] if side.host is not None else [f.index for f in th.prog.folds if f.base == "active"] or [None]
            )
            best: tuple[list[Obligation], list[str]] | None = None
            for host in hosts:
                got = _case(th, side, host, label, ctx + conds, ctx, runs, cost, state_goals)
                if best is None or _misses_of(got[0]) < _misses_of(best[0]):
                    best = got
                if _passed(got[0]):
                    break
            assert best is not None
            obs += best[0]
            shown += best[1]
            if not _passed(best[0]):
                out = _failed(obs, shown)
                return dataclasses.replace(out, cost=cost[0] if cost else None, cost_entry=cost[1].entry if cost else None)
    return FoldOutcome(
        Proved("prefix-fold theorem"), tuple(obs), tuple(shown), cost[0] if cost else None, cost[1].entry if cost else None
    )


def _misses_of(obs: Sequence[Obligation]) -> int:
    return sum(1 for o in obs if not isinstance(o.verdict, Proved)) or (0 if obs else 1)


def _flags_of(th: _Theorem, f: Fold | None, tag: str, runs: Sequence[Retraction]) -> tuple[
    list[tuple[z3.ExprRef, z3.ExprRef]], dict[int, z3.BoolRef], list[z3.BoolRef]
]:
    """One variable per retraction for the loop's entry, the substitution that names a
    retraction's flag by it (the decision's placeholder, the fold's elements), and its premise."""
    flags = {r.index: z3.Bool(f"{tag}.retracted{r.index}") for r in th.prog.retractions}
    pairs: list[tuple[z3.ExprRef, z3.ExprRef]] = [(r.out, flags[r.index]) for r in th.prog.retractions]
    if f is not None:
        pairs += [(v, flags[i]) for v, i in f.retracted]
    prem = [z3.Implies(flags[r.index], r.allowed) for r in th.prog.retractions]  # type: ignore[misc]
    return pairs, flags, prem


def _sub(t: z3.ExprRef, pairs: Sequence[tuple[z3.ExprRef, z3.ExprRef]]) -> z3.ExprRef:
    return z3.substitute(t, *pairs) if pairs else t


def _case(
    th: _Theorem,
    side: ActiveSide,
    host: int | None,
    label: str,
    ctx: list[z3.BoolRef],
    common: list[z3.BoolRef],
    runs: Sequence[Retraction],
    cost: tuple[z3.ArithRef, Fold] | None,
    state_goals: Sequence[tuple[str, z3.BoolRef]],
) -> tuple[list[Obligation], list[str]]:
    """One case: the active list's host loop, the queue's, and the slot's checks."""
    se, sides, budget = th.setting, th.sides, th.budget
    obs: list[Obligation] = []
    shown: list[str] = []
    where = f"; {label}" if label else ""
    # the active list's host
    charge_names = ("Σcharge", "Σgrowth", "Σtokens", "#running") if th.wide else ("Σcharge", "Σtokens", "#running")
    if host is not None:
        f: Fold | None = th.prog.folds[host]
        assert f is not None
        tag = f"s2.fold{f.index}"
        gs, start, step, end = th.state_ghosts(f, tag, cost)
        pairs, flags, prem_r = _flags_of(th, f, tag, runs)
        start.update({str(a): i for a, i in zip(f.acc, f.init)})
        step.update({str(a): _sub(n, pairs) for a, n in zip(f.acc, f.nxt)})
        end.update({str(a): x for a, x in zip(f.acc, f.final)})
        e = f.entry
        prem = th.links(f, tag) + _wf_active(e, se, not sides.grants) + prem_r
        leaves = _leaf_names(f)
        loop_label = f"fold {f.index}: {f.where}"
        captured = list(f.consts)
    else:
        tag = "s2.entries"
        e = fresh_element(tag, True, se.prefix_caching)
        dummy = Fold(-1, "active", "the active list", e, (), (), (), (), (), ())
        gs, start, step, end = th.state_ghosts(dummy, tag, cost)
        pairs, flags, prem_r = _flags_of(th, None, tag, runs)
        prem = _wf_active(e, se, not sides.grants) + prem_r
        leaves = []
        loop_label = "the active list"
        captured = []
    pre = _sub(side.preempt, pairs)
    grant = None if side.grant is None else _sub(side.grant, pairs)
    runs_e = z3.Not(pre)
    after = _after(e, grant, se)  # type: ignore[arg-type]
    ends_a = {n: z3.Int(f"A.{tag}.{n}.end") for n in charge_names}
    charge = z3.If(runs_e, held(after, se), 0)
    incs = {
        "Σcharge": charge,
        "Σgrowth": charge - held(e.p, se),
        "Σtokens": z3.If(runs_e, after - e.p, 0),
        "#running": z3.If(runs_e, 1, 0),
    }
    ghost = {}
    for n in charge_names:
        v = z3.Int(f"{tag}.{n}")
        ghost[n] = v
        gs.append((n, v))
        start[str(v)] = z3.IntVal(0)
        step[str(v)] = v + incs[n]
        end[str(v)] = ends_a[n]
    # what the retractions that may run keep: Σ cost over the entries not popped
    kept_ends: list[tuple[Retraction, z3.ArithRef]] = []
    for r in runs:
        v = z3.Int(f"{tag}.Σkept{r.index}")
        gs.append((f"Σkept{r.index}", v))
        start[str(v)] = z3.IntVal(0)
        step[str(v)] = v + z3.If(flags[r.index], 0, rename_entry(r.cost, r.entry, e))  # type: ignore[operator]
        end[str(v)] = z3.Int(f"K.{tag}.{r.index}.end")
        kept_ends.append((r, end[str(v)]))  # type: ignore[arg-type]
    held_ghost = next(v for n, v in gs if n == "Σheld")
    extra_atoms = [_Atom("Σcharge = Σheld + Σgrowth", ghost["Σcharge"] == held_ghost + ghost["Σgrowth"])] if th.wide else []
    extra_a = []
    if grant is not None:
        # the engine rejects a negative grant (check_decision_values) and clamps one above the unit
        extra_a.append(("every grant is ≥ 0 (the engine rejects a negative one)", grant >= 0))
    loop_a = _Loop(
        loop_label + " (with the charge" + where + ")", leaves, gs, start, step, end, prem, extra_a,
        captured=captured, extra_atoms=extra_atoms,
    )
    inv_a = th.search(loop_a, host, ctx, ctx)  # a host's step may read the case (a grant of 0 where decode fails)
    if inv_a is None:
        return [Obligation("case", Unknown(f"the solver left the loop-invariant search of {loop_a.label} undecided"), 0.0,
                           conjunct=loop_a.label)], shown
    obs += _loop_obligations(loop_a, inv_a, ctx, budget)
    shown.append(f"{loop_a.label}: {_show(inv_a)}")
    facts_a = [loop_a.at(loop_a.end, a.term) for a in inv_a]
    # the retraction lemma, where it runs: the requests it keeps cost ≤ cap
    facts_a += [k <= r.cap for r, k in kept_ends]
    cost_end = th.pre_cost

    # the queue's host, starting from the active list's ghosts
    ctx_w = ctx + facts_a
    w = sides.waiting_host
    if w is not None:
        fw = th.prog.folds[w]
        tag_w = f"s2.fold{fw.index}"
        x = fw.entry
        pairs_w, _, prem_w = _flags_of(th, fw, tag_w, runs)
        gs_w: list[tuple[str, z3.ArithRef]] = []
        start_w = {str(a): i for a, i in zip(fw.acc, fw.init)}
        step_w = {str(a): _sub(n, pairs_w) for a, n in zip(fw.acc, fw.nxt)}
        end_w = {str(a): y for a, y in zip(fw.acc, fw.final)}
        take = sides.admit
        grant_w = sides.waiting_grant
        after_w = _after(x, grant_w, se)
        charge_w = z3.If(take, held(after_w, se), 0)
        incs_w = {"Σcharge": charge_w, "Σgrowth": charge_w, "Σtokens": z3.If(take, after_w - x.p if se.prefix_caching else after_w, 0), "#running": z3.If(take, 1, 0)}
        names = list(charge_names)
        if cost is not None:
            names.append("Σcost")
            incs_w["Σcost"] = z3.If(take, rename_entry(cost[0], cost[1].entry, x), 0)  # type: ignore[arg-type]
        ends_w = {n: z3.Int(f"W.{tag_w}.{n}.end") for n in names}
        # the ghosts start where the active list's ended: named once, so that the loop is the
        # same in every case (what its steps keep is searched once)
        for n in names:
            v = z3.Int(f"{tag_w}.{n}")
            v0 = z3.Int(f"{tag_w}.{n}₀")
            gs_w.append((n, v))
            start_w[str(v)] = v0
            ctx_w.append(v0 == (ends_a[n] if n != "Σcost" else th.pre_cost))
            step_w[str(v)] = v + incs_w[n]
            end_w[str(v)] = ends_w[n]
        extra = []
        if grant_w is not None:
            extra.append(("every grant is ≥ 0 (the engine rejects a negative one)", grant_w >= 0))
            extra.append(("an admitted request makes progress (grant ≥ 1 token)", z3.Implies(take, after_w > 0)))
        loop_w = _Loop(
            f"fold {fw.index}: {fw.where} (with the charge{where})", _leaf_names(fw), gs_w, start_w, step_w, end_w,
            th.links(fw, tag_w) + _wf_waiting(x, se) + prem_w, extra, captured=list(fw.consts),
        )
        inv_w = th.search(loop_w, fw.index, ctx_w, common)
        if inv_w is None:
            return obs + [Obligation("case", Unknown(f"the solver left the loop-invariant search of {loop_w.label} undecided"),
                                     0.0, conjunct=loop_w.label)], shown
        obs += _loop_obligations(loop_w, inv_w, ctx_w, budget)
        shown.append(f"{loop_w.label}: {_show(inv_w)}")
        facts = ctx_w + [loop_w.at(loop_w.end, a.term) for a in inv_w]
        totals = ends_w
        if cost is not None:
            cost_end = ends_w["Σcost"]
    else:
        facts = ctx_w
        totals = dict(ends_a)

    # the end: the slot's checks, from the final instances
    obs += obligation("end", facts, totals["Σcharge"] <= se.M_term, budget, "memory charged in the slot ≤ M" + where)
    if se.token_budget is not None:
        obs += obligation("end", facts, totals["Σtokens"] <= se.token_budget, budget, "tokens in the slot ≤ token budget" + where)
    if se.max_num_seqs is not None:
        obs += obligation("end", facts, totals["#running"] <= se.max_num_seqs, budget, "running ≤ max_num_seqs" + where)
    if cost is not None:
        obs += obligation("end", facts, cost_end <= se.M_term, budget, "Σcost over the next active requests ≤ M" + where)
    for what, goal in state_goals:
        obs += obligation("end", facts, goal, budget, what + where)
    return obs, shown
