"""Invariant conjuncts: the base invariant, user strengthenings and the Houdini menu.

A :class:`Conjunct` is a named function of a symbolic state.  It must work for
a state of any number of slots (the post state of a step has ``K + Q`` active
slots) and mask by ``present``.  Conjuncts only ever appear as *premises* and
*goals* of obligations: a wrong candidate can make a proof fail, never make
a wrong proof pass, which is why the menu below may use closed-form
projections of future memory (the transition itself never does).  A conjunct
may carry a *lemma*: a formula over free variables that is proved once (its
own obligation) and whose instances are then added as premises, so that the
solver need not rediscover it inside a large query.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import z3

from kvstab.contract import StateVar, View
from kvstab.errors import InvalidArgument, plugin_fault
from kvstab.model import progress_after
from kvstab.proofs.encoding import (
    OPS,
    Entry,
    Setting,
    StepTerms,
    SymState,
    held,
    memory,
    var_in_bounds,
    well_formed,
)
from kvstab.schedulers.lookahead import Projection
from kvstab.symbolic import Sym, unwrap

__all__ = ["Conjunct", "CaseSplit", "earliest_first", "base_conjuncts", "state_conjunct_name", "MENU", "menu", "load_conjunct"]

ConjunctFn = Callable[[SymState, Setting], z3.BoolRef]


@dataclass(frozen=True, slots=True)
class CaseSplit:
    """Named cases of one step, and a query whose ``unsat`` shows that they cover every state."""

    cases: list[tuple[str, z3.BoolRef]]
    cover: list[z3.BoolRef]


@dataclass(frozen=True, slots=True)
class Conjunct:
    """A named invariant conjunct over a :class:`~kvstab.proofs.encoding.SymState`."""

    name: str
    fn: ConjunctFn
    origin: str = "user"  # "base", "user" or "menu"
    #: a lemma (a formula over free variables, proved once, valid for all
    #: values) whose instances help the solver preserve this conjunct
    lemma: Callable[[Setting], z3.BoolRef] | None = None
    #: the lemma's instances for one encoded step (premises of consecution)
    hints: Callable[[StepTerms, Setting], list[z3.BoolRef]] | None = None
    #: whether the instances also help the engine's safety goals (else only
    #: this conjunct's own goal gets them)
    hints_for_safety: bool = False
    #: a case split of the slot's memory goal: named conditions on one encoded
    #: step whose disjunction is valid (proved as its own obligation, never
    #: assumed); the goal is then proved case by case — small queries where
    #: the whole one would need the solver to find the split itself
    cases: Callable[[StepTerms, Setting], CaseSplit] | None = None

    def __call__(self, state: SymState, setting: Setting) -> z3.BoolRef:
        return self.fn(state, setting)


def _release_bound(r: z3.BoolRef, a: z3.ArithRef, src: Entry, dst: Entry, se: Setting) -> z3.BoolRef:
    """Lemma instance: what a slot leaves held is at most what it charged
    (finished requests release, the others keep exactly their charge)."""
    frame = z3.And(a >= 0, dst.present == z3.And(r, a < src.s + src.o), dst.p == z3.If(dst.present, a, 0))
    return z3.Implies(frame, z3.If(dst.present, held(dst.p, se), 0) <= z3.If(r, held(a, se), 0))


def _release_lemma(se: Setting) -> z3.BoolRef:
    def e(n: str) -> Entry:
        return Entry(z3.Bool(f"{n}.present"), z3.Int(f"{n}.rid"), z3.Int(f"{n}.s"), z3.Int(f"{n}.o"), z3.Int(f"{n}.p"))

    return _release_bound(z3.Bool("runs"), z3.Int("after"), e("x"), e("x'"), se)


def _release_hints(step: StepTerms, se: Setting) -> list[z3.BoolRef]:
    srcs = step.pre.active + step.pre.waiting
    return [_release_bound(r, a, x, y, se) for r, a, x, y in zip(step.running, step.after, srcs, step.post.active)]


def _active_count(st: SymState, se: Setting) -> z3.BoolRef:
    """Active requests ≤ max_num_seqs (true when no cap is set)."""
    if se.max_num_seqs is None:
        return z3.BoolVal(True)
    return z3.Sum([z3.If(e.present, 1, 0) for e in st.active] + [z3.IntVal(0)]) <= se.max_num_seqs


def state_conjunct_name(v: StateVar) -> str:
    """The name of the conjunct (and obligation) that keeps ``v`` within its bounds."""
    return f"state {v.name} ∈ [{v.lo!r}, {v.hi!r}]"


def _state_bound(i: int, v: StateVar) -> Conjunct:
    """The declared invariant of the ``i``-th state variable: assumed of the
    pre state, an obligation on the post state."""
    return Conjunct(state_conjunct_name(v), lambda st, se: var_in_bounds(v, st.sched[i]), "base")


def base_conjuncts(aligned: bool, setting: Setting | None = None, svars: Sequence[StateVar] = ()) -> list[Conjunct]:
    """Well-formedness and the memory invariant itself, in its state form; with a
    ``max_num_seqs`` cap, also the cap on the active requests (the state form of
    the engine's per-slot check: whoever is active after a slot ran in it); for
    a stateful rule, one conjunct per state variable: its declared ``[lo, hi]``."""
    out = [
        Conjunct("well-formed", lambda st, se: well_formed(st, se, aligned), "base"),
        Conjunct("memory ≤ M", lambda st, se: memory(st, se) <= se.M_term, "base", _release_lemma, _release_hints),
    ]
    if setting is not None and setting.max_num_seqs is not None:
        out.append(Conjunct("active ≤ max_num_seqs", _active_count, "base"))
    out += [_state_bound(i, v) for i, v in enumerate(svars)]
    return out


# --- the built-in menu of candidate strengthenings


def _reserved_peaks(st: SymState, se: Setting) -> z3.BoolRef:
    """Σ B⌈(s + o)/B⌉ over active requests ≤ M: their peaks fit together."""
    return z3.Sum([z3.If(e.present, held(e.s + e.o, se), 0) for e in st.active] + [z3.IntVal(0)]) <= se.M_term


def _peak_bound(e: Entry, se: Setting) -> z3.BoolRef:
    """Lemma instance: a request never holds more than its peak after a unit."""
    after = unwrap(progress_after(Sym(e.s), Sym(e.p), se.chunk, None, OPS))
    wf = z3.And(e.s >= 1, e.o >= 1, e.p >= 0, e.p < e.s + e.o)
    return z3.Implies(wf, held(after, se) <= held(e.s + e.o, se))


def _peak_kept(r: z3.BoolRef, a: z3.ArithRef, src: Entry, dst: Entry, se: Setting) -> z3.BoolRef:
    """Lemma instance: a request still active after the slot ran in it, with its peak unchanged."""
    frame = z3.And(src.s >= 1, src.o >= 1, dst.present == z3.And(r, a < src.s + src.o), dst.s == src.s, dst.o == src.o)
    return z3.Implies(frame, z3.If(dst.present, held(dst.s + dst.o, se), 0) <= z3.If(r, held(src.s + src.o, se), 0))


def _peak_lemma(se: Setting) -> z3.BoolRef:
    """The peak bound and the kept-peak fact over arbitrary requests (free variables)."""

    def e(n: str) -> Entry:
        return Entry(z3.Bool(f"{n}.present"), z3.Int(f"{n}.rid"), z3.Int(f"{n}.s"), z3.Int(f"{n}.o"), z3.Int(f"{n}.p"))

    return z3.And(_peak_bound(e("x"), se), _peak_kept(z3.Bool("runs"), z3.Int("after"), e("x"), e("x'"), se))


def _peak_hints(step: StepTerms, se: Setting) -> list[z3.BoolRef]:
    """Instances of both for every request that may run this slot."""
    srcs = step.pre.active + step.pre.waiting
    out = [_peak_bound(e, se) for e in srcs]
    out += [_peak_kept(r, a, x, y, se) for r, a, x, y in zip(step.running, step.after, srcs, step.post.active)]
    return out


def _next_slot(st: SymState, se: Setting) -> z3.BoolRef:
    """The active requests fit after one more full unit each."""
    terms = [
        z3.If(e.present, held(unwrap(progress_after(Sym(e.s), Sym(e.p), se.chunk, None, OPS)), se), 0)
        for e in st.active
    ]
    return z3.Sum(terms + [z3.IntVal(0)]) <= se.M_term


def _pview(se: Setting) -> View:
    """A view that carries only ``ŝ`` and ``B`` (all a :class:`Projection` reads)."""
    return View(active=(), waiting=(), M=0, chunk=se.chunk, block=se.block)


def _proj(e: Entry, se: Setting) -> Projection:
    """The full-unit projection of an entry's future (``lookahead``'s, so that
    the terms coincide with those its rule builds)."""
    return Projection.of(_pview(se), Sym(e.s), Sym(e.o), Sym(e.p), Sym(e.present), OPS)


def _projected(st: SymState, se: Setting) -> z3.BoolRef:
    """Projected memory fits at every active request's finish slot — where the
    total peaks, since each request's memory grows until it finishes."""
    v = _pview(se)
    ps = [_proj(e, se) for e in st.active]
    cs = []
    for e, k in zip(st.active, ps):
        total = OPS.sum(q.held_at(v, k.f, OPS) for q in ps)
        cs.append(z3.Implies(e.present, unwrap(total) <= se.M_term))
    return z3.And(*cs) if cs else z3.BoolVal(True)


def _shift_premise(src: Entry, dst: Entry, se: Setting) -> z3.BoolRef:
    """``dst`` is ``src`` after one full unit, both present and unfinished."""
    after = unwrap(progress_after(Sym(src.s), Sym(src.p), se.chunk, None, OPS))
    return z3.And(
        src.present,
        dst.present,
        src.s >= 1,
        src.o >= 1,
        src.p >= 0,
        src.p < src.s + src.o,
        z3.Implies(src.p < src.s, src.p % se.chunk == 0),
        dst.s == src.s,
        dst.o == src.o,
        dst.p == after,
        dst.p < dst.s + dst.o,
    )


def _pair_shift(xs: Entry, xd: Entry, ys: Entry, yd: Entry, se: Setting) -> z3.BoolRef:
    """Lemma instance: after one slot, ``x``'s projected memory at ``y``'s finish
    slot is what it was (both moved one slot closer)."""
    v = _pview(se)
    concl = unwrap(_proj(xd, se).held_at(v, _proj(yd, se).f, OPS)) == unwrap(
        _proj(xs, se).held_at(v, _proj(ys, se).f, OPS)
    )
    return z3.Implies(z3.And(_shift_premise(xs, xd, se), _shift_premise(ys, yd, se)), concl)


def _valid(e: Entry, se: Setting) -> z3.BoolRef:
    """``e`` is a present request with ``0 ≤ p < s + o`` and whole prefill chunks."""
    return z3.And(e.present, e.s >= 1, e.o >= 1, e.p >= 0, e.p < e.s + e.o, z3.Implies(e.p < e.s, e.p % se.chunk == 0))


def _mono(q: Entry, k: Entry, se: Setting) -> z3.BoolRef:
    """Lemma instance: the projection of ``q`` one slot ahead is what ``q`` holds
    after this slot's unit, and it only grows up to ``q``'s finish slot — so
    the total this slot is at most the total at the earliest finish slot."""
    v = _pview(se)
    pq, pk = _proj(q, se), _proj(k, se)
    one = unwrap(pq.held_at(v, 1, OPS))
    after = unwrap(progress_after(Sym(q.s), Sym(q.p), se.chunk, None, OPS))
    fk, fq = unwrap(pk.f), unwrap(pq.f)
    return z3.And(
        z3.Implies(_valid(q, se), one == held(after, se)),
        z3.Implies(z3.And(_valid(q, se), _valid(k, se), fk <= fq), one <= unwrap(pq.held_at(v, pk.f, OPS))),
    )


def _projected_lemma(se: Setting) -> z3.BoolRef:
    """The pair-shift and monotonicity lemmas over two arbitrary requests."""

    def e(n: str) -> Entry:
        return Entry(z3.Bool(f"{n}.present"), z3.Int(f"{n}.rid"), z3.Int(f"{n}.s"), z3.Int(f"{n}.o"), z3.Int(f"{n}.p"))

    return z3.And(_pair_shift(e("x"), e("x'"), e("y"), e("y'"), se), _mono(e("x"), e("y"), se))


def _projected_hints(step: StepTerms, se: Setting) -> list[z3.BoolRef]:
    """Instances of both lemmas for every pair of slots."""
    srcs = list(step.pre.active) + list(step.pre.waiting)
    pairs = list(zip(srcs, step.post.active))
    out = [_pair_shift(xs, xd, ys, yd, se) for xs, xd in pairs for ys, yd in pairs]
    out += [_mono(q, k, se) for q in srcs for k in srcs]
    return out


def earliest_first(runs: Sequence[z3.BoolRef], fs: Sequence[z3.ArithRef]) -> list[tuple[str, z3.BoolRef]]:
    """Nobody runs, or the ``k``-th request is the first that runs and finishes
    no later than any other that runs (one case per ``k``; disjoint and covering)."""
    out: list[tuple[str, z3.BoolRef]] = [("nobody runs", z3.Not(z3.Or(*runs)))]
    for k, (rk, fk) in enumerate(zip(runs, fs)):
        # ties go to the first such request, so the cases are disjoint as well as covering
        earliest = [z3.Implies(rj, fk < fj if j < k else fk <= fj) for j, (rj, fj) in enumerate(zip(runs, fs)) if j != k]
        out.append((f"earliest finish: slot {k}", z3.And(rk, *earliest)))
    return out


def _earliest_finish_cases(step: StepTerms, se: Setting) -> CaseSplit:
    """The slot's memory goal split at the earliest finish slot of the requests
    that run, where the projected total bounds this slot's charge (by the
    monotonicity lemma).  The cover is proved on fresh variables: the cases are
    the same function's instance at the step's terms, so they cover too."""
    srcs = list(step.pre.active) + list(step.pre.waiting)
    fs = [unwrap(_proj(e, se).f) for e in srcs]
    n = len(srcs)
    free = earliest_first([z3.Bool(f"cover.runs{k}") for k in range(n)], [z3.Int(f"cover.f{k}") for k in range(n)])
    return CaseSplit(earliest_first(list(step.running), fs), [z3.Not(z3.Or(*[c for _, c in free]))])


#: the candidates Houdini starts from (name → conjunct)
MENU: dict[str, Conjunct] = {
    c.name: c
    for c in (
        Conjunct("reserved peaks fit", _reserved_peaks, "menu", _peak_lemma, _peak_hints, True),
        Conjunct(
            "projected memory fits", _projected, "menu", _projected_lemma, _projected_hints, True, _earliest_finish_cases
        ),
        Conjunct("next slot fits", _next_slot, "menu"),
    )
}


#: the candidates Houdini tries by default ("next slot fits" is left out: it is
#: implied by the others where they hold and only makes the queries bigger)
DEFAULT_MENU = ("reserved peaks fit", "projected memory fits")


def menu() -> list[Conjunct]:
    """The candidate conjuncts Houdini starts from, in a fixed order."""
    return [MENU[n] for n in DEFAULT_MENU]


def load_conjunct(spec: str) -> Conjunct:
    """A menu conjunct by name, or a user conjunct by ``module:attr`` (a
    :class:`Conjunct` or a function ``(state, setting) -> z3.BoolRef``)."""
    if spec in MENU:
        return MENU[spec]
    if ":" not in spec:
        raise InvalidArgument(
            f"strengthening {spec!r} is neither a menu conjunct ({', '.join(repr(n) for n in MENU)}) nor 'module:attr'"
        )
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit at import too: one line naming the module
        raise InvalidArgument(f"cannot import conjunct module {mod_name!r}: {plugin_fault(exc)}") from None
    obj = getattr(mod, attr, None)
    if obj is None:
        raise InvalidArgument(f"module {mod_name!r} has no attribute {attr!r}")
    if isinstance(obj, Conjunct):
        return obj
    if callable(obj):
        return Conjunct(spec, obj, "user")
    raise InvalidArgument(f"{spec!r} is neither a Conjunct nor a function (state, setting) -> z3.BoolRef")
