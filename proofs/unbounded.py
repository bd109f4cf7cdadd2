"""The memory invariant for any number of active and queued requests.

A bounded proof (``proofs/induction.py``) covers states with at most ``K``
active and ``Q`` queued requests.  This module proves the per-slot memory
invariant with no bound at all, for the **prefix-fold class** of rules, by an
argument whose only solver queries are about *one* request and *one*
accumulator value — so nothing in them mentions ``K`` or ``Q``.

The class (every premise is checked mechanically on the rule itself, by
:func:`classify`):

* **P1 — the decision is the contract's folds.**  Run on a symbolic view, the
  rule returns exactly (by object identity) the preempt flags of
  :func:`kvstab.contract.preempt_newest` and the admit flags of
  :func:`kvstab.contract.fcfs_admit`, and the accumulator that admission
  starts from is exactly the ``kept`` memory ``preempt_newest`` returned.  No
  grants (every running request does one full unit), no token budget and no
  ``max_num_seqs`` cap.  The helper calls are observed by wrapping the names
  the rule's module imported for the duration of one symbolic run.
* **P2 — the admission test is local.**  ``fits(w, acc)`` depends only on the
  candidate ``w``, the accumulator ``acc`` and ``M`` (the free variables of
  its terms are checked), so it is the same function at every position of
  every queue.
* **O1 — the admission test is sound for the engine's charge** (a solver
  obligation over one request and one accumulator): for every well-formed
  ``w`` and every ``0 ≤ acc ≤ M``, if ``fits`` accepts ``w`` then the new
  accumulator is ``≥ acc + tokens_held(progress after w's first unit)`` and
  ``≤ M``.
* **O2 — per-request facts** (one request each): a request's post-unit
  memory is ``≥ 0``; a running request that stays is still well-formed; what
  a request keeps after the slot is at most what the slot charged it.

The theorem (argued by hand in ``docs/proofs.md``, by induction over the
running list and then over the queue): ``preempt_newest`` keeps the longest
admission-order prefix whose post-slot memory fits, so its ``kept`` is the
engine's charge of the survivors and ``kept ≤ M`` (loop invariant
``0 ≤ kept ≤ prefix``, ``kept ≤ M``; needs O2's ``≥ 0``); ``fcfs_admit``
changes its accumulator only on an admission, and by O1 the accumulator then
stays ``≤ M`` and grows by at least the admitted request's charge (loop
invariant ``kept + Σ admitted charges ≤ acc ≤ M``).  So every slot from every
well-formed state charges at most ``M``; with O2 the next state is again
well-formed and holds at most that.  The window of the queue the engine shows
is a prefix of the queue, and the argument holds for any list.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import z3

from kvstab import contract
from kvstab.contract import Scheduler, View, WaitingEntry
from kvstab.errors import KvstabError
from kvstab.model import progress_after
from kvstab.proofs.encoding import OPS, Entry, Setting, SymState, fresh_state, held, view_of, well_formed
from kvstab.proofs.solver import Budget, Status, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict, passed
from kvstab.symbolic import Sym, Z3Ops, unwrap

__all__ = ["ClassCheck", "UnboundedResult", "classify", "prove_unbounded", "THEOREM"]

#: the name of the argument, as verdicts and reports print it
THEOREM = "prefix-fold theorem (per-request obligations + induction over the running list and the queue)"

# the symbolic run that observes the helper calls patches module globals: one at a time
_TRACE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class ClassCheck:
    """Whether a rule is in the prefix-fold class, and why not when it is not.
    ``fits`` is the observed admission test (for the obligations)."""

    member: bool
    reason: str
    fits: Callable[[WaitingEntry, Any], tuple[Any, Any]] | None = None
    premises: tuple[str, ...] = ()
    #: P1b: the per-request term ``c`` and the entry whose variables it is written in
    cost: tuple[z3.ArithRef, Entry] | None = None


@dataclass(frozen=True, slots=True)
class UnboundedResult:
    """The verdict for every ``K`` and ``Q``, the class check and the obligations."""

    verdict: Verdict
    check: ClassCheck
    obligations: tuple[Obligation, ...] = field(default=())


@dataclass(slots=True)
class _Calls:
    preempt: list[tuple[tuple[Any, ...], Any, View]] = field(default_factory=list)  # (flags, kept, view)
    admit: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def _observed(decide: Callable[..., Any], calls: _Calls) -> Iterator[None]:
    """Wrap the contract helpers *as the rule's module sees them* for one run."""
    real_preempt, real_admit = contract.preempt_newest, contract.fcfs_admit

    def spy_preempt(view: View, ops: Any) -> Any:
        out = real_preempt(view, ops)
        calls.preempt.append((out[0], out[1], view))
        return out

    def spy_admit(view: View, ops: Any, fits: Any, start: Any, allowed: Any = True) -> Any:
        out = real_admit(view, ops, fits, start, allowed)
        calls.admit.append({"view": view, "fits": fits, "start": start, "result": out})
        return out

    func = getattr(decide, "__func__", decide)
    glb: dict[str, Any] = getattr(func, "__globals__", {})
    saved: dict[str, Any] = {}
    with _TRACE_LOCK:
        for name, value in list(glb.items()):
            if value is real_preempt:
                saved[name] = value
                glb[name] = spy_preempt
            elif value is real_admit:
                saved[name] = value
                glb[name] = spy_admit
        try:
            yield
        finally:
            glb.update(saved)


def _free_constants(*terms: Any) -> set[str]:
    """Names of the uninterpreted constants in ``terms``."""
    seen: set[int] = set()
    names: set[str] = set()
    stack = [unwrap(t) for t in terms if isinstance(unwrap(t), z3.ExprRef)]
    while stack:
        t = stack.pop()
        key = t.get_id()
        if key in seen:
            continue
        seen.add(key)
        if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            names.add(str(t))
        stack.extend(t.children())
    return names


class _RecordingOps(Z3Ops):
    """:class:`Z3Ops` that remembers every ``sum`` it built (to recognise an
    accumulator that is a sum of one per-request term over the running list)."""

    def __init__(self) -> None:
        self.sums: list[tuple[list[Any], Any]] = []

    def sum(self, xs: Iterable[Any]) -> Any:
        items = list(xs)
        out = super().sum(items)
        self.sums.append((items, out))
        return out


def _entry_vars(e: Entry) -> list[z3.ExprRef]:
    return [e.present, e.rid, e.s, e.o, e.p]


def _uniform_cost(items: list[Any], state: SymState, setting: Setting) -> z3.ArithRef | None:
    """The per-request term ``c(a₀)`` if ``items[i]`` is that same term of
    ``state.active[i]`` for every ``i`` (checked structurally), else ``None``."""
    if len(items) != len(state.active) or not items:
        return None
    terms = [unwrap(x) if not isinstance(x, int) else z3.IntVal(x) for x in items]
    m = {"M"} if setting.M is None else set()
    for term, e in zip(terms, state.active):
        if not isinstance(term, z3.ArithRef):
            return None
        if _free_constants(term) - ({str(v) for v in _entry_vars(e)} | m):
            return None
        back = z3.substitute(term, *zip(_entry_vars(e), _entry_vars(state.active[0])))
        if not z3.eq(z3.simplify(back), z3.simplify(terms[0])):
            return None
    return terms[0]


#: the view sizes (K, Q) at which the class premises are observed; the first is the one the obligations use
SIZES: tuple[tuple[int, int], ...] = ((2, 2), (0, 1), (1, 0), (1, 1), (1, 3), (3, 1), (4, 4))


def _reads_sizes(scheduler: Scheduler) -> str | None:
    """Where the rule's own module reads how many entries a view has, or ``None``.

    The symbolic runs below observe the rule at a handful of sizes; Python code
    that branches on ``len(view.active)`` at a size beyond them would pass
    unseen.  So P0 is also checked statically: the rule's classes (its MRO)
    and the functions of their own modules they call may not call ``len``,
    read ``n_waiting``, or index ``active``/``waiting`` by position (the
    contract's helpers live elsewhere and fold over the whole view).  Code
    whose source cannot be read is outside the class.
    """
    import ast
    import inspect
    import textwrap

    # the rule's classes, and the module-level functions of their modules they call (transitively)
    todo: list[Any] = [c for c in type(scheduler).__mro__ if c is not object]
    seen: set[int] = set()
    sources: list[tuple[str, int, str]] = []  # (who, first line, source)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            lines, first = inspect.getsourcelines(obj)
            src = textwrap.dedent("".join(lines))
        except (OSError, TypeError):
            return f"source of {getattr(obj, '__qualname__', obj)!r} cannot be read, so P0 cannot be checked statically"
        sources.append((getattr(obj, "__qualname__", repr(obj)), first, src))
        module = inspect.getmodule(obj)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Name) and module is not None:
                fn = getattr(module, node.id, None)
                if inspect.isfunction(fn) and fn.__module__ == module.__name__:
                    todo.append(fn)
    for who, first, src in sources:
        for node in ast.walk(ast.parse(src)):
            where = f"{who} (line {first + getattr(node, 'lineno', 1) - 1})"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
                return f"{where} calls len() (the number of entries may change the rule's structure)"
            if isinstance(node, ast.Attribute) and node.attr == "n_waiting":
                return f"{where} reads n_waiting"
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("active", "waiting")
            ):
                return f"{where} indexes view.{node.value.attr} by position"
    return None


def classify(scheduler: Scheduler, setting: Setting) -> ClassCheck:
    """Check premises P0, P1 and P2 on the rule itself.

    P1 and P2 are observed on symbolic runs at every size in :data:`SIZES`;
    P0 — the rule's structure does not change with the number of entries (a
    rule may loop over the view, but must not branch on its length) — is
    checked there too: the same form, the same admission test and (P1b) the
    same per-request term at every size.
    """
    if contract.state_vars_of(scheduler):
        # the theorem's obligations are about one request and one accumulator;
        # a rule's own state (and its bounds obligation) is not among them
        return ClassCheck(False, "the rule keeps its own state (state_vars); the class is stateless")
    static = _reads_sizes(scheduler)
    if static is not None:
        return ClassCheck(False, f"P0 (static): {static}")
    first = _classify_at(scheduler, setting, *SIZES[0])
    if not first.member:
        return first
    w, acc = _candidate()
    ok0, acc0 = first.fits(w, acc) if first.fits else (None, None)
    for K, Q in SIZES[1:]:
        other = _classify_at(scheduler, setting, K, Q)
        if not other.member or other.fits is None:
            return ClassCheck(False, f"at K = {K}, Q = {Q}: {other.reason} (P0: the structure changes with size)")
        if other.premises[0].split(":")[0] != first.premises[0].split(":")[0]:
            return ClassCheck(False, f"P0: the rule's form differs at K = {K}, Q = {Q}")
        ok1, acc1 = other.fits(w, acc)
        if not (
            z3.eq(z3.simplify(_as_bool(ok1)), z3.simplify(_as_bool(ok0)))
            and z3.eq(z3.simplify(unwrap(acc1)), z3.simplify(unwrap(acc0)))
        ):
            return ClassCheck(False, f"P0: the admission test differs at K = {K}, Q = {Q}")
        if first.cost is not None and other.cost is not None and K > 0:
            canon = _entry("canon")
            if not z3.eq(z3.simplify(_cost_of(first.cost, canon)), z3.simplify(_cost_of(other.cost, canon))):
                return ClassCheck(False, f"P0: the per-request term differs at K = {K}, Q = {Q}")
    sizes = ", ".join(f"({k}, {q})" for k, q in SIZES)
    return dataclasses.replace(
        first,
        premises=first.premises
        + (
            f"P0: the same form, admission test and per-request term at (K, Q) = {sizes}, checked; "
            "the rule's module never reads the number of entries (no len(), n_waiting or positional index), "
            "checked on its source",
        ),
    )


def _classify_at(scheduler: Scheduler, setting: Setting, K: int, Q: int) -> ClassCheck:
    """P1 and P2 observed on one symbolic run with ``K`` active and ``Q`` queued entries."""
    if setting.token_budget is not None or setting.max_num_seqs is not None:
        return ClassCheck(False, "a token budget or a max_num_seqs cap is set (the class has neither)")
    state = fresh_state(f"cls{K}x{Q}", K, Q)
    view = view_of(state, setting)
    calls = _Calls()
    ops = _RecordingOps()
    try:
        with _observed(scheduler.decide, calls):
            d = scheduler.decide(view, ops)
    except KvstabError:
        raise
    except Exception as exc:  # the bounded flow reports a failing rule properly
        return ClassCheck(False, f"the rule failed on symbolic values ({type(exc).__name__}: {exc})")
    if not isinstance(d, contract.Decision):
        return ClassCheck(False, "the rule did not return a Decision")
    if d.grants is not None:
        return ClassCheck(False, "the rule gives grants (the class runs every request one full unit)")
    adm = next((c for c in calls.admit if c["result"] is d.admit), None)
    if adm is None:
        return ClassCheck(False, "its admit flags are not those of contract.fcfs_admit")
    if adm["view"] is not view:
        return ClassCheck(False, "fcfs_admit ran on another view than the rule's")
    pre = next((c for c in calls.preempt if c[0] is d.preempt), None)
    cost: z3.ArithRef | None = None
    if pre is not None:
        if pre[2] is not view:
            return ClassCheck(False, "preempt_newest ran on another view than the rule's")
        if adm["start"] is not pre[1]:
            return ClassCheck(
                False, "admission does not start from the memory preempt_newest kept (the class needs start = kept)"
            )
        form = "P1a: decision = (preempt_newest, fcfs_admit from its kept memory), checked by observing the calls"
    elif all(z3.is_false(unwrap(x)) if not isinstance(x, bool) else not x for x in d.preempt):
        made = next((items for items, out in ops.sums if out is adm["start"]), None)
        cost = None if made is None else _uniform_cost(made, state, setting)
        empty_sum = K == 0 and made == []  # no active entry: the sum of no terms
        if cost is None and not empty_sum:
            return ClassCheck(
                False,
                "it never preempts, but admission does not start from a sum of one per-request term over the "
                "running list",
            )
        form = (
            "P1b: no preemption; decision = fcfs_admit from Σ_active c(a), c one per-request term "
            f"(c = {cost if cost is not None else 'no active entry'}), checked by observing the calls and "
            "comparing the terms"
        )
    else:
        return ClassCheck(False, "its preempt flags are not those of contract.preempt_newest (nor all false)")
    fits = adm["fits"]
    w, acc = _candidate()
    try:
        ok, acc_if = fits(w, acc)
    except KvstabError:
        raise
    except Exception as exc:
        return ClassCheck(
            False, f"its admission test is not a function of (candidate, accumulator) alone ({type(exc).__name__})"
        )
    allowed = {"w.present", "w.rid", "w.s", "w.o", "acc"} | ({"M"} if setting.M is None else set())
    stray = _free_constants(ok, acc_if) - allowed
    if stray:
        return ClassCheck(
            False, f"its admission test reads more than the candidate and the accumulator: {', '.join(sorted(stray))}"
        )
    return ClassCheck(
        True,
        "preempt_newest, then fcfs_admit from the kept memory"
        if pre is not None
        else "no preemption, fcfs_admit from a per-request sum",
        fits,
        (form, "P2: the admission test reads only (candidate, accumulator, M), checked on its terms"),
        None if cost is None else (cost, state.active[0]),
    )


def _candidate() -> tuple[WaitingEntry, Sym]:
    e = Entry(z3.Bool("w.present"), z3.Int("w.rid"), z3.Int("w.s"), z3.Int("w.o"), z3.IntVal(0))
    return WaitingEntry(Sym(e.rid), Sym(e.s), Sym(e.o), Sym(e.present)), Sym(z3.Int("acc"))


def _entry(name: str) -> Entry:
    return Entry(
        z3.Bool(f"{name}.present"), z3.Int(f"{name}.rid"), z3.Int(f"{name}.s"), z3.Int(f"{name}.o"), z3.Int(f"{name}.p")
    )


def _after(e: Entry, setting: Setting) -> z3.ArithRef:
    return unwrap(progress_after(Sym(e.s), Sym(e.p), setting.chunk, None, OPS))


def _obligation(
    name: str, premises: list[z3.BoolRef], goal: z3.BoolRef, budget: Budget, conjunct: str
) -> list[Obligation]:
    """A vacuity guard on ``premises``, then ``premises ∧ ¬goal`` unsat."""
    t0 = time.perf_counter()
    g = solve(premises, budget, f"unbounded-{name}-premises")
    t1 = time.perf_counter()
    if g.status is not Status.SAT:
        why = "vacuous premises" if g.status is Status.UNSAT else f"solver: {g.reason}"
        return [Obligation(name, Unknown(why, g.smt2), t1 - t0, conjunct=conjunct)]
    a = solve(premises + [z3.Not(goal)], budget, f"unbounded-{name}")
    secs = time.perf_counter() - t1
    match a.status:
        case Status.UNSAT:
            v: Verdict = Proved("unsat")
        case Status.SAT:
            v = Refuted(None, f"{conjunct}: false for some request")
        case _:
            v = Unknown(f"solver: {a.reason}", a.smt2)
    return [
        Obligation(name, Proved("premises satisfiable (vacuity guard)"), t1 - t0, conjunct=conjunct + " [guard]"),
        Obligation(name, v, secs, conjunct=conjunct),
    ]


def _per_request(setting: Setting, budget: Budget) -> list[Obligation]:
    """O2: the facts about one request the induction uses."""
    M = setting.M_term
    x = _entry("x")
    one = _one(x)
    wf = [M >= max(1, setting.block), x.present, well_formed(one, setting, True)]
    a = _after(x, setting)
    obs = _obligation("per request", wf, held(a, setting) >= 0, budget, "post-unit memory ≥ 0")
    stays = a < x.s + x.o
    moved = fresh_state("x'", 1, 0).active[0]
    keep = [moved.present == stays, moved.s == x.s, moved.o == x.o, moved.p == z3.If(stays, a, 0)]
    obs += _obligation(
        "per request",
        wf + keep,
        z3.Implies(moved.present, well_formed(_one(moved), setting, True)),
        budget,
        "a running request that stays is well-formed",
    )
    obs += _obligation(
        "per request",
        wf + keep,
        z3.If(moved.present, held(moved.p, setting), 0) <= held(a, setting),
        budget,
        "what it keeps ≤ what the slot charged it",
    )
    # an admitted request starts from progress 0: the same facts from there
    fresh = Entry(x.present, x.rid, x.s, x.o, z3.IntVal(0))
    a0 = _after(fresh, setting)
    obs += _obligation(
        "per request",
        [M >= max(1, setting.block), x.present, x.s >= 1, x.o >= 1, held(x.s + x.o, setting) <= M],
        z3.And(a0 > 0, z3.Implies(a0 < x.s, a0 % setting.chunk == 0)),
        budget,
        "an admitted request's first unit leaves it well-formed",
    )
    return obs


def _one(e: Entry) -> SymState:
    """A state with the single active entry ``e``."""
    return SymState(active=(e,), waiting=())


def _admission(check: ClassCheck, setting: Setting, budget: Budget) -> list[Obligation]:
    """O1: one admission keeps the fold's loop invariant, for one candidate and any accumulator."""
    assert check.fits is not None
    M = setting.M_term
    w, acc = _candidate()
    ok, acc_if = check.fits(w, acc)
    s, o = unwrap(w.s), unwrap(w.o)
    fresh = Entry(unwrap(w.present), unwrap(w.rid), s, o, z3.IntVal(0))
    # what the fold must set aside for w: the engine's charge (P1a) or c(w) (P1b)
    need = held(_after(fresh, setting), setting) if check.cost is None else _cost_of(check.cost, fresh)
    prem = [
        M >= max(1, setting.block),
        unwrap(w.present),
        s >= 1,
        o >= 1,
        held(s + o, setting) <= M,
        unwrap(acc) >= 0,
        unwrap(acc) <= M,
        _as_bool(ok),
    ]
    goal = z3.And(unwrap(acc_if) >= unwrap(acc) + need, unwrap(acc_if) <= M)
    what = "charge(w)" if check.cost is None else "c(w)"
    return _obligation("admission", prem, goal, budget, f"fits(w, acc) ⇒ acc + {what} ≤ acc′ ≤ M")


def _cost_of(cost: tuple[z3.ArithRef, Entry], e: Entry) -> z3.ArithRef:
    """``c(e)``: the per-request term, written for ``e``."""
    term, base = cost
    out = z3.substitute(term, *zip(_entry_vars(base), _entry_vars(e)))
    assert isinstance(out, z3.ArithRef)
    return out


def _cost_facts(cost: tuple[z3.ArithRef, Entry], setting: Setting, budget: Budget) -> list[Obligation]:
    """P1b's per-request facts about ``c``, for a request at any progress (a
    fresh one included): ``c ≥ 0``, ``c ≥`` the engine's charge, and ``c`` does
    not grow while the request stays."""
    M = setting.M_term
    x = _entry("y")
    prem = [
        M >= max(1, setting.block),
        x.present,
        x.s >= 1,
        x.o >= 1,
        held(x.s + x.o, setting) <= M,
        x.p >= 0,
        x.p < x.s + x.o,
        z3.Implies(x.p < x.s, x.p % setting.chunk == 0),
    ]
    a = _after(x, setting)
    c = _cost_of(cost, x)
    obs = _obligation("cost", prem, c >= 0, budget, "c(a) ≥ 0")
    obs += _obligation("cost", prem, c >= held(a, setting), budget, "c(a) ≥ the engine's charge of a")
    moved = Entry(x.present, x.rid, x.s, x.o, a)
    obs += _obligation(
        "cost", prem + [a < x.s + x.o], _cost_of(cost, moved) <= c, budget, "c does not grow while a stays"
    )
    return obs


def _as_bool(x: Any) -> z3.BoolRef:
    if isinstance(x, bool):
        return z3.BoolVal(x)
    z = unwrap(x)
    return z if isinstance(z, z3.BoolRef) else z3.BoolVal(False)


def prove_unbounded(scheduler: Scheduler, setting: Setting, budget: Budget | None = None) -> UnboundedResult:
    """Prove the per-slot memory invariant for every number of requests, or say
    why the rule is outside the class (then only a bounded proof applies)."""
    budget = budget or Budget()
    check = classify(scheduler, setting)
    if not check.member or check.fits is None:
        return UnboundedResult(Unknown(f"outside the prefix-fold class: {check.reason}"), check)
    obs = _per_request(setting, budget) + _admission(check, setting, budget)
    if check.cost is not None:
        obs += _cost_facts(check.cost, setting, budget)
    bad = [o for o in obs if not passed(o.verdict)]
    if bad:
        first = bad[0]
        v = first.verdict
        if isinstance(v, Refuted):
            # a failed one-request obligation is not a run: the bounded flow looks for one
            v = Unknown(f"the unbounded argument does not apply: {first.conjunct} is false for some request")
        return UnboundedResult(v, check, tuple(obs))
    assumptions = (
        "M is any integer ≥ B" if setting.M is None else f"M = {setting.M}",
        f"ŝ = {setting.chunk} (fixed)",
        f"B = {setting.block} (fixed)",
        "any number of active and queued requests (no K, no Q)",
        "request peaks fit: B⌈(s+o)/B⌉ ≤ M (the engine rejects other requests)",
        "every running request does one full unit per slot",
        "the rule sees any prefix of the queue (the engine's window)",
    ) + check.premises
    if check.cost is not None:
        assumptions += ("invariant Σ_active c(a) ≤ M (initiation: no request is active; consecution: O1, c-facts)",)
    return UnboundedResult(Proved(THEOREM, assumptions), check, tuple(obs))
