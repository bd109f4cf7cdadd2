"""The declared claims for any number of requests, for rules made of folds.

``kvstab.proofs.claims`` checks what a rule declares on one encoded slot with
at most ``K`` active and ``Q`` queued requests.  For a rule in the
prefix-fold class (:func:`kvstab.proofs.unbounded.classify`: it reads
``view.active`` and ``view.waiting`` only through ``kvstab.contract``'s folds)
each claim reduces, by the same induction over a list as the memory theorem,
to facts about **one entry and one accumulator** of a fold's recorded step —
solver queries in which nothing mentions ``K`` or ``Q``:

* **FCFS admissions.**  The admit flags are the outputs of one fold over the
  queue (the *host*).  A truth value ``S`` of its accumulator ("stopped": a
  leaf, or its negation) with ``S ⇒ ¬admit``, ``S ⇒ S′`` and
  ``¬admit ⇒ S′`` for any entry and any accumulator: after the first request
  not admitted ``S`` holds and stays, so nobody behind it is admitted.  The
  projection form's admission is ``fcfs_admit`` (the combinator's code), whose
  walk is checked the same way with its test's answer left free.
* **Non-clairvoyance**, by two copies of every fold: two accumulators and one
  pair of entries that differ only in ``o``; ``acc₁ = acc₂`` holds at the start
  (given the earlier folds' finals equal) and every step keeps it, and the
  outputs the decision (or a later fold) reads are equal.  By induction the two
  runs of the rule on states that differ only in ``o`` decide alike, for every
  length.  The projection form: the rule's projection of one request does not
  depend on ``o``.
* **The oldest running request progresses.**  It is the active list's first
  entry: the host's step at its initial accumulator (each linked component
  its source's output at its own first entry) preempts nobody and advances it.
* **A lone head is admitted into an empty server.**  With no active request
  every fold over the active list ends at its initial accumulator; the
  queue's host's first step then admits any well-formed head (for a rule that
  is not FCFS, "someone is admitted" is shown by the head).
* **No livelock.**  The ranking ``ρ = N·(T + 1) + r`` of
  ``kvstab.proofs.claims`` falls every slot once arrivals stop, from the two
  facts above and one more about the head's first step: it makes progress
  (``docs/proofs.md`` gives the argument).

A query that is not ``unsat`` is about one entry, not a state: the claim is
then not proved for any number of requests, and ``kvstab.proofs.claims``
checks it at its bounds, where a counterexample is a concrete state (or a pair
of them) replayed on the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from kvstab.contract import Decision, Scheduler, View, WaitingEntry, fcfs_admit, fcfs_admit_projected, state_vars_of
from kvstab.model import progress_after
from kvstab.proofs.encoding import OPS, Entry, Setting, SymState, var_in_bounds, well_formed
from kvstab.proofs.folds import Fold, Lazy, NotAFold, Program, ProjectedAdmission, run_abstract
from kvstab.proofs.loops import Sides, free_constants, obligation, rename_entry
from kvstab.proofs.solver import Budget, Status, solve
from kvstab.proofs.unbounded import ClassCheck, classify
from kvstab.proofs.verdicts import Obligation, Proved, Unknown, Verdict
from kvstab.symbolic import Sym, unwrap

__all__ = ["FreeClaim", "free_claims", "SCOPE", "METHOD", "CLAIM_KEYS"]

#: how the output names the scope of a claim proved here
SCOPE = "any number of requests"

#: the method of a claim proved here
METHOD = "for any number of requests: one-step facts of the rule's folds, induction over the lists"

#: the claims this module can prove, by the keys :func:`free_claims` answers with
CLAIM_KEYS = ("fcfs", "non-clairvoyant", "oldest", "lone-head", "ranking")


@dataclass(frozen=True, slots=True)
class FreeClaim:
    """One claim for any number of requests: ``Proved`` (with its assumptions),
    or ``Unknown`` saying why the argument does not apply; the obligations and,
    when proved, the one-step facts it rests on."""

    verdict: Verdict
    obligations: tuple[Obligation, ...] = ()
    facts: tuple[str, ...] = ()


# --- what every query assumes


def _wf(e: Entry, setting: Setting, active: bool, aligned: bool) -> list[z3.BoolRef]:
    """``e`` is a request the engine could hold (the bounded encoding's well-formedness, for one entry)."""
    st = SymState(active=(e,), waiting=()) if active else SymState(active=(), waiting=(e,))
    return [well_formed(st, setting, aligned)]


def _base(prog: Program, scheduler: Scheduler, setting: Setting) -> list[z3.BoolRef]:
    """``M ≥ B``, the queue's length ``≥ 0``, a stateful rule's state within its declared bounds."""
    out = setting.base_constraints() + [prog.n_waiting >= 0]
    out += [var_in_bounds(v, x) for v, x in zip(state_vars_of(scheduler), prog.state)]
    return out


def _after(e: Entry, grant: z3.ArithRef | None, setting: Setting) -> z3.ArithRef:
    """Progress after the slot: ``progress_after`` with the grant (``None``: one full unit), as the engine clamps it."""
    out = unwrap(progress_after(Sym(e.s), Sym(e.p), setting.chunk, None if grant is None else Sym(grant), OPS))
    assert isinstance(out, z3.ArithRef)
    return out


def _sub(t: z3.ExprRef, pairs: Sequence[tuple[z3.ExprRef, z3.ExprRef]]) -> z3.ExprRef:
    return z3.substitute(t, *pairs) if pairs else t


def _bool(t: z3.ExprRef) -> z3.BoolRef:
    assert isinstance(t, z3.BoolRef)
    return t


def _all(ts: Sequence[z3.BoolRef]) -> z3.BoolRef:
    return z3.And(*ts) if ts else z3.BoolVal(True)


def _fresh(like: z3.ExprRef, name: str) -> z3.ExprRef:
    if like.sort() == z3.BoolSort():
        return z3.Bool(name)
    if isinstance(like, z3.ArithRef) and like.is_real():
        return z3.Real(name)
    return z3.Int(name)


def _proved(obs: Sequence[Obligation]) -> bool:
    return bool(obs) and all(isinstance(o.verdict, Proved) for o in obs)


def _not_applicable(obs: Sequence[Obligation], why: str = "") -> FreeClaim:
    """The first obligation that is not proved, as the reason the argument does not apply."""
    bad = next((o for o in obs if not isinstance(o.verdict, Proved)), None)
    if bad is not None:
        what = "false for some entry" if not isinstance(bad.verdict, Unknown) else bad.verdict.reason
        why = f"{bad.label()}: {what}"
    return FreeClaim(Unknown(f"not proved for any number of requests ({why})"), tuple(obs))


# --- a fold at the first entry of its list, and folds over an empty list


def _at_first(prog: Program, f: Fold, term: z3.ExprRef) -> z3.ExprRef:
    """``term`` (over fold ``f``'s element and accumulator) at the first entry of
    its list: the accumulator is the initial one, and each linked component is
    its source fold's output at its own first entry (the same entry)."""
    pairs: list[tuple[z3.ExprRef, z3.ExprRef]] = list(zip(f.acc, f.init))
    for var, j, c in f.links:
        src = prog.folds[j]
        out = src.outs[c]
        assert out is not None  # a link is to an output
        pairs.append((var, rename_entry(_at_first(prog, src, out), src.entry, f.entry)))
    return _sub(term, pairs)


def _empty_active(prog: Program) -> list[tuple[z3.ExprRef, z3.ExprRef]]:
    """Every fold over the active list, run on an empty list, ends where it starts:
    its final accumulator is its initial one (earlier finals substituted in turn)."""
    pairs: list[tuple[z3.ExprRef, z3.ExprRef]] = []
    for f in prog.folds:
        if f.base == "active":
            pairs += [(fin, _sub(ini, pairs)) for fin, ini in zip(f.final, f.init)]
    return pairs


def _host_entry(prog: Program, host: int | None, tag: str, active: bool) -> Entry:
    if host is not None:
        return prog.folds[host].entry
    p = z3.Int(f"{tag}.x.p") if active else z3.IntVal(0)
    return Entry(z3.BoolVal(True), z3.Int(f"{tag}.x.rid"), z3.Int(f"{tag}.x.s"), z3.Int(f"{tag}.x.o"), p)


# --- the claims


def _active_cases(sides: Sides) -> list[tuple[z3.BoolRef, int | None, z3.BoolRef, z3.ArithRef | None]]:
    """``(condition, host, preempt, grant)`` of the active list in each case of the slot.

    One case (condition true) for a rule without a selection; a :class:`Sides` that
    carries one side per case of a selection between two sequences (``active``)
    gives each (read by name, so that this module serves either form)."""
    cases = getattr(sides, "active", None)
    if cases is not None:
        return [(c.cond, c.host, c.preempt, c.grant) for c in cases]
    one = (getattr(sides, "active_host", None), getattr(sides, "preempt", None), getattr(sides, "active_grant", None))
    return [(z3.BoolVal(True), *one)]


def _oldest(prog: Program, sides: Sides, setting: Setting, budget: Budget, base: list[z3.BoolRef]) -> FreeClaim:
    """The active list's first entry is not preempted and advances (in every case of the slot)."""
    cases = _active_cases(sides)
    x = _host_entry(prog, next((h for _, h, _, _ in cases if h is not None), None), "oldest", True)
    goals: list[z3.BoolRef] = []
    facts: list[str] = []
    for cond, host, preempt, grant in cases:
        # every host walks the same list: its entry is the one entry of the query
        def ren(t: z3.ExprRef, host: int | None = host) -> z3.ExprRef:
            if host is None:
                return t
            f = prog.folds[host]
            return rename_entry(_at_first(prog, f, t), f.entry, x)

        g = None if grant is None else ren(grant)
        assert g is None or isinstance(g, z3.ArithRef)
        goals.append(z3.Implies(cond, z3.And(z3.Not(_bool(ren(preempt))), _after(x, g, setting) > x.p)))
        where = "constants" if host is None else f"fold {host} ({prog.folds[host].where}) at its initial accumulator"
        when = "" if z3.is_true(cond) else f" (in the case {cond})"
        facts.append(f"oldest: {where}{when}: the first entry is not preempted and advances")
    prem = base + _wf(x, setting, True, not sides.grants)
    obs = obligation(
        "claim oldest", prem, _all(goals), budget,
        "the first active entry, at the fold's initial accumulator: not preempted, advances",
    )
    if not _proved(obs):
        return _not_applicable(obs)
    return FreeClaim(Proved(METHOD), tuple(obs), tuple(facts))


def _head_terms(prog: Program, sides: Sides) -> tuple[z3.BoolRef, z3.ArithRef | None]:
    """The head's admit flag and grant in an empty server (the queue's host at its first entry)."""
    empty = _empty_active(prog)
    host = sides.waiting_host

    def first(t: z3.ExprRef) -> z3.ExprRef:
        return _sub(t if host is None else _at_first(prog, prog.folds[host], t), empty)

    grant = None if sides.waiting_grant is None else first(sides.waiting_grant)
    assert grant is None or isinstance(grant, z3.ArithRef)
    return _bool(first(sides.admit)), grant


def _lone_head(
    prog: Program, sides: Sides | None, setting: Setting, budget: Budget, base: list[z3.BoolRef], ranking: bool
) -> FreeClaim:
    """In an empty server the head is admitted (and, for the ranking, its first step makes progress)."""
    if prog.projected is not None:
        admit, x = _projected_head(prog, prog.projected)
        grant = None  # the projection form runs full units
        where = f"fcfs_admit_projected ({prog.projected.where}) with an empty active list"
    else:
        assert sides is not None
        admit, grant = _head_terms(prog, sides)
        host = sides.waiting_host
        x = _host_entry(prog, host, "head", False)
        where = "constants" if host is None else f"fold {host} ({prog.folds[host].where}) at its initial accumulator"
    prem = base + [prog.n_waiting >= 1] + _wf(x, setting, False, True)
    if ranking:
        goal = z3.And(admit, _after(x, grant, setting) > 0)
        what = "an empty server: the head is admitted and its first step makes progress"
    else:
        goal = admit
        what = "an empty server (every fold over the active list at its start): the head is admitted"
    obs = obligation("claim head", prem, goal, budget, what)
    if not _proved(obs):
        return _not_applicable(obs)
    fact = f"{'head progresses' if ranking else 'lone head'}: {where} admits any well-formed head"
    return FreeClaim(Proved(METHOD), tuple(obs), (fact + (" and advances it" if ranking else ""),))


def _projected_head(prog: Program, adm: ProjectedAdmission) -> tuple[z3.BoolRef, Entry]:
    """The head's admit flag in an empty server, from the combinator's own code.

    ``fcfs_admit_projected`` is ``fcfs_admit`` with its test; the head's test
    reads only the head and the active requests' totals (none here), so its
    flag with a one-request queue is its flag with any queue."""
    x = Entry(z3.BoolVal(True), z3.Int("head.x.rid"), z3.Int("head.x.s"), z3.Int("head.x.o"), z3.IntVal(0))
    view = dataclasses.replace(
        adm.view, active=(), waiting=(WaitingEntry(Sym(x.rid), Sym(x.s), Sym(x.o)),), n_waiting=Sym(prog.n_waiting)
    )
    flag = unwrap(fcfs_admit_projected(view, OPS, adm.project)[0])
    return _bool(_sub(flag, _empty_active(prog))), x


def _stop_candidates(f: Fold) -> list[tuple[str, z3.BoolRef]]:
    """What may say "stopped" in the queue's host: a truth-valued leaf of its accumulator, or its negation."""
    names = f.names if len(f.names) == len(f.acc) else tuple(f"acc[{i}]" for i in range(len(f.acc)))
    out: list[tuple[str, z3.BoolRef]] = []
    for n, a in zip(names, f.acc):
        if a.sort() == z3.BoolSort():
            out += [(n, _bool(a)), (f"¬{n}", z3.Not(a))]
    return out


def _fcfs_walk(
    prog: Program, f: Fold, admit: z3.BoolRef, setting: Setting, budget: Budget, base: list[z3.BoolRef]
) -> FreeClaim:
    """FCFS of a fold over the queue whose outputs are the admit flags (see the module docstring)."""
    x = f.entry
    prem = base + _wf(x, setting, False, True)
    quiet = dataclasses.replace(budget, keep_all=False)

    def nxt(t: z3.BoolRef) -> z3.BoolRef:
        return _bool(_sub(t, list(zip(f.acc, f.nxt))))

    def goals(stop: z3.BoolRef) -> list[tuple[str, list[z3.BoolRef], z3.BoolRef]]:
        return [
            ("stopped ⇒ this entry is not admitted", [stop], z3.Not(admit)),
            ("stopped ⇒ stopped after the step", [stop], nxt(stop)),
            ("not admitted ⇒ stopped after the step", [z3.Not(admit)], nxt(stop)),
        ]

    tried: list[str] = []
    for name, stop in _stop_candidates(f):
        # a quick search first (not kept as certificates): the named obligations below are the proof
        if any(solve(prem + p + [z3.Not(g)], quiet, "claim-fcfs-search").status is not Status.UNSAT for _, p, g in goals(stop)):
            tried.append(name)
            continue
        obs: list[Obligation] = []
        for what, p, g in goals(stop):
            obs += obligation("claim fcfs", prem + p, g, budget, f"fold {f.index}, stopped = {name}: {what}")
        if not _proved(obs):
            return _not_applicable(obs)
        return FreeClaim(
            Proved(METHOD),
            tuple(obs),
            (f"FCFS: fold {f.index} ({f.where}), stopped = {name}: stopped ⇒ ¬admit, stopped ⇒ stopped′, "
             "¬admit ⇒ stopped′",),
        )
    leaves = ", ".join(tried) if tried else "none"
    return FreeClaim(
        Unknown(
            "not proved for any number of requests (no truth value of the queue's fold "
            f"{f.index} ({f.where}) says 'stopped': tried {leaves})"
        )
    )


@dataclass(frozen=True, slots=True)
class _AnyTest:
    """``fcfs_admit`` with a test whose answer is left free: the walk of ``fcfs_admit_projected``."""

    name: str = "fcfs_admit (any test)"
    description: str = "fcfs_admit whose test's answer and accumulator are free"

    def decide(self, view: View, ops: Any) -> Decision:
        def fits(w: WaitingEntry, acc: Any) -> tuple[Any, Any]:
            return Sym(z3.Bool("anytest.ok")), Sym(z3.Int("anytest.acc"))

        return Decision(admit=fcfs_admit(view, ops, fits, Sym(z3.Int("anytest.start"))), preempt=())


def _fcfs(prog: Program, sides: Sides | None, setting: Setting, budget: Budget, base: list[z3.BoolRef]) -> FreeClaim:
    if prog.projected is not None:
        walk = run_abstract(_AnyTest(), setting)  # type: ignore[arg-type]  # (preempt: a fixed empty tuple)
        adm = walk.decision.admit
        assert isinstance(adm, Lazy) and adm.kind[0] == "out"
        f = walk.folds[adm.kind[1]]
        out = f.outs[adm.kind[2]]
        assert out is not None
        res = _fcfs_walk(walk, f, _bool(out), setting, budget, _base(walk, _AnyTest(), setting))  # type: ignore[arg-type]
        if isinstance(res.verdict, Proved):
            line = f"{res.facts[0]} — the walk of fcfs_admit_projected ({prog.projected.where}), for any test"
            return dataclasses.replace(res, facts=(line,))
        return res
    assert sides is not None
    if sides.waiting_host is None:
        # the same flag for every entry: everyone or no one is admitted, a prefix either way
        return FreeClaim(Proved(METHOD), (), ("FCFS: the admit flag is one term for every entry",))
    return _fcfs_walk(prog, prog.folds[sides.waiting_host], sides.admit, setting, budget, base)


def _read_by_decision(prog: Program) -> tuple[set[tuple[int, int]], list[z3.BoolRef], list[str]]:
    """What the decision (and every fold) reads of the folds' outputs: the outputs
    ``(fold, component)``, the conditions of selections between two sequences, and
    the kinds of sequence the two-copy argument does not cover (a retraction's flags)."""
    used: set[tuple[int, int]] = set()
    conds: list[z3.BoolRef] = []
    other: list[str] = []

    def take(seq: Any) -> None:
        if not isinstance(seq, Lazy):
            return
        kind = seq.kind[0]
        if kind == "out":
            used.add((seq.kind[1], seq.kind[2]))
        elif kind in ("zip", "concat"):
            for part in seq.kind[1]:
                take(part)
        elif kind == "select":  # ("select", condition, then, other)
            conds.append(seq.kind[1])
            take(seq.kind[2])
            take(seq.kind[3])
        elif kind != "projected":  # the projection is checked on its own
            other.append(kind)

    d = prog.decision
    for seq in (d.admit, d.preempt, d.grants):
        take(seq)
    for f in prog.folds:
        used |= {(j, c) for _, j, c in f.links}
    return used, conds, other


def _unknown(terms: Sequence[z3.ExprRef], known: set[int]) -> str | None:
    """The first variable of ``terms`` that the two copies neither share nor copy, if any."""
    for t in terms:
        for v in free_constants(t):
            if v.get_id() not in known:
                return str(v)
    return None


def _two_copies(
    prog: Program, setting: Setting, budget: Budget, base: list[z3.BoolRef], aligned: bool
) -> FreeClaim:
    """Non-clairvoyance: every fold run on two entries that differ only in ``o`` keeps ``acc₁ = acc₂``."""
    used, conds, other = _read_by_decision(prog)
    if other:
        return FreeClaim(Unknown(
            f"not proved for any number of requests (the decision reads a {other[0]!r} sequence, which the two-copy "
            "argument does not cover)"
        ))
    # what both copies share: the server, the scheduler's state, the queue's length (and each
    # projected admission flag, the projection being shown independent of o below)
    shared = [setting.M_term, *prog.state, prog.n_waiting]
    known = {v.get_id() for t in shared for v in free_constants(t)}
    admitted = prog.projected is not None
    finals2: list[tuple[z3.ExprRef, z3.ExprRef]] = []  # every earlier final and its copy
    same_finals: list[z3.BoolRef] = []
    obs: list[Obligation] = []
    facts: list[str] = []
    for f in prog.folds:
        tag = f"copy.fold{f.index}"
        o2 = z3.Int(f"{tag}.x.o")
        acc2 = [_fresh(a, f"{tag}.acc{k}") for k, a in enumerate(f.acc)]
        link2 = [_fresh(v, f"{tag}.link{i}") for i, (v, _, _) in enumerate(f.links)]
        pairs = list(zip(f.acc, acc2)) + list(zip([v for v, _, _ in f.links], link2)) + finals2
        if z3.is_const(f.entry.o):
            pairs.append((f.entry.o, o2))

        def copy(t: z3.ExprRef, pairs: list[tuple[z3.ExprRef, z3.ExprRef]] = pairs) -> z3.ExprRef:
            return _sub(t, pairs)

        x2 = Entry(f.entry.present, f.entry.rid, f.entry.s, o2, f.entry.p)
        # every variable of the step is shared (the entry but o, the server, the state) or copied
        own = known | {v.get_id() for v, _ in pairs} | {v.get_id() for t in (f.entry.rid, f.entry.s, f.entry.p)
                                                        for v in free_constants(t)}
        if admitted:
            own |= {v.get_id() for t in f.nxt + f.outs if t is not None for v in free_constants(t) if ".x.admitted" in str(v)}
        stray = _unknown([t for t in (*f.init, *f.nxt, *f.outs) if t is not None], own)
        if stray is not None:
            return FreeClaim(Unknown(
                f"not proved for any number of requests (fold {f.index} ({f.where}) reads {stray}, which the "
                "two-copy argument neither shares nor copies)"
            ), tuple(obs))
        active = f.base == "active"
        # each linked component is its source's output, proved the same in both copies below
        prem = base + same_finals + _wf(f.entry, setting, active, aligned) + _wf(x2, setting, active, aligned)
        prem += [v == v2 for (v, _, _), v2 in zip(f.links, link2)]
        equal = _all([a == b for a, b in zip(f.acc, acc2)])
        what = f"fold {f.index} ({f.where}), two copies"
        obs += obligation("claim two copies", base + same_finals, _all([i == copy(i) for i in f.init]), budget,
                          f"{what}: acc₁ = acc₂ at the start")
        obs += obligation("claim two copies", prem + [equal], _all([n == copy(n) for n in f.nxt]), budget,
                          f"{what}: every step on entries differing only in o keeps acc₁ = acc₂")
        outs = [t for c, t in enumerate(f.outs) if t is not None and (f.index, c) in used]
        if outs:
            obs += obligation("claim two copies", prem + [equal], _all([t == copy(t) for t in outs]), budget,
                              f"{what}: the outputs read are equal")
        if not _proved(obs):
            return _not_applicable(obs)
        for k, fin in enumerate(f.final):
            fin2 = _fresh(fin, f"{tag}.final{k}")
            finals2.append((fin, fin2))
            same_finals.append(fin == fin2)
        facts.append(f"two copies: fold {f.index} ({f.where}) keeps acc₁ = acc₂ on entries differing only in o")
    d = prog.decision
    at_end = [t for t in (unwrap(x) for x in d.state or ()) if isinstance(t, z3.ExprRef)] + conds
    if at_end:
        stray = _unknown(at_end, known | {v.get_id() for v, _ in finals2})
        if stray is not None:
            return FreeClaim(Unknown(
                f"not proved for any number of requests (the decision reads {stray}, which the two-copy argument "
                "neither shares nor copies)"
            ), tuple(obs))
        obs += obligation("claim two copies", base + same_finals, _all([t == _sub(t, finals2) for t in at_end]), budget,
                          "the next scheduler state and the choice between sequences are the same in both copies")
        if not _proved(obs):
            return _not_applicable(obs)
    if prog.projected is not None:
        more = _projection_ignores_o(prog.projected, setting, budget, base + same_finals, finals2)
        obs += more
        if not _proved(more):
            return _not_applicable(obs)
        facts.append(f"two copies: the projection ({prog.projected.where}) of a request does not depend on o")
    return FreeClaim(Proved(METHOD), tuple(obs), tuple(facts))


def _projection_ignores_o(
    adm: ProjectedAdmission,
    setting: Setting,
    budget: Budget,
    prem: list[z3.BoolRef],
    finals2: list[tuple[z3.ExprRef, z3.ExprRef]],
) -> list[Obligation]:
    """The combinator reads a request only through its projection (``f``, ``present``,
    ``held_at``) and the view's ``M``: each the same for two requests differing only in ``o``."""
    s, o1, o2, p, tau = (z3.Int(n) for n in ("copy.x.s", "copy.x.o1", "copy.x.o2", "copy.x.p", "copy.tau"))
    wf = [s >= 1, o1 >= 1, o2 >= 1, p >= 0, p < s + z3.If(o1 < o2, o1, o2), tau >= 1]
    one, two = adm.project(Sym(s), Sym(o1), Sym(p), True), adm.project(Sym(s), Sym(o2), Sym(p), True)
    same = [
        unwrap(one.f) == unwrap(two.f),
        unwrap(one.present) == unwrap(two.present),
        unwrap(one.held_at(adm.view, Sym(tau), OPS)) == unwrap(two.held_at(adm.view, Sym(tau), OPS)),
    ]
    M = unwrap(adm.view.M) if isinstance(adm.view.M, Sym) else z3.IntVal(adm.view.M)
    obs = obligation("claim two copies", prem + wf, _all(same), budget, "the projection is the same for both o")
    obs += obligation("claim two copies", prem, M == _sub(M, finals2), budget, "the M the combinator reads is the same")
    return obs


def _ranking(oldest: FreeClaim, head: FreeClaim) -> FreeClaim:
    """No livelock from the oldest request's progress and the head's progress in an empty server."""
    for part in (oldest, head):
        if not isinstance(part.verdict, Proved):
            reason = part.verdict.reason if isinstance(part.verdict, Unknown) else str(part.verdict)
            return FreeClaim(Unknown(reason), part.obligations)
    argument = "ranking: with these, (N, r) falls lexicographically in every slot without arrivals (docs/proofs.md)"
    return FreeClaim(Proved(METHOD), oldest.obligations + head.obligations, oldest.facts + head.facts + (argument,))


def free_claims(
    scheduler: Scheduler,
    setting: Setting,
    budget: Budget,
    wanted: Collection[str],
    check: ClassCheck | None = None,
) -> tuple[ClassCheck, dict[str, FreeClaim]]:
    """Each claim in ``wanted`` (keys of :data:`CLAIM_KEYS`) for any number of
    requests; a rule outside the class gets none (the check says why)."""
    check = check or classify(scheduler, setting)
    out: dict[str, FreeClaim] = {}
    if not check.member or check.program is None:
        return check, out
    prog, sides = check.program, check.sides
    base = _base(prog, scheduler, setting)
    aligned = sides is None or not sides.grants
    try:
        if "fcfs" in wanted:
            budget.group("claims for any number of requests: FCFS")
            out["fcfs"] = _fcfs(prog, sides, setting, budget, base)
        if "non-clairvoyant" in wanted:
            budget.group("claims for any number of requests: two copies")
            out["non-clairvoyant"] = _two_copies(prog, setting, budget, base, aligned)
        if "oldest" in wanted or "ranking" in wanted:
            budget.group("claims for any number of requests: progress")
            # the projection form never preempts and runs every request one full unit
            oldest = _oldest(prog, sides, setting, budget, base) if sides else _oldest_full_units(prog, setting, budget, base)
            if "oldest" in wanted:
                out["oldest"] = oldest
            if "ranking" in wanted:
                out["ranking"] = _ranking(oldest, _lone_head(prog, sides, setting, budget, base, ranking=True))
        if "lone-head" in wanted:
            out["lone-head"] = _lone_head(prog, sides, setting, budget, base, ranking=False)
    except NotAFold as exc:  # a structure the claims' argument does not cover (the memory theorem may)
        reason = f"not proved for any number of requests ({exc})"
        out = {k: FreeClaim(Unknown(reason)) for k in wanted}
    return check, out


def _oldest_full_units(prog: Program, setting: Setting, budget: Budget, base: list[z3.BoolRef]) -> FreeClaim:
    """The projection form: no preemption, one full unit each; the first entry advances."""
    x = _host_entry(prog, None, "oldest", True)
    obs = obligation(
        "claim oldest", base + _wf(x, setting, True, True), _after(x, None, setting) > x.p, budget,
        "the first active entry: one full unit advances it (the projection form never preempts)",
    )
    if not _proved(obs):
        return _not_applicable(obs)
    return FreeClaim(Proved(METHOD), tuple(obs), ("oldest: no preemption (the projection form), a full unit advances",))
