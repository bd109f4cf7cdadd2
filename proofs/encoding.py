"""The symbolic state and the engine's slot transition, encoded once.

A :class:`SymState` holds ``K`` active-request slots and ``Q`` queue slots,
each with a ``present`` flag and symbolic ``s``, ``o``, progress ``p`` (``0``
for a queued request).  The scheduler's decision is computed by running **its
own rule** (``scheduler.decide``) on :class:`~kvstab.symbolic.Sym` values
through :class:`~kvstab.symbolic.Z3Ops` — there is no second copy of any rule.
:func:`encode_step` is the engine's slot (``kvstab/simulator.py``,
``Engine.step``) written as constraints over fresh post-state variables:

1. preempted requests lose their progress and go back to the queue head
   (oldest admission first); admitted requests join the active set after the
   kept ones;
2. every running request advances by its grant (:func:`kvstab.model.progress_after`);
3. the slot is charged ``Σ tokens_held(progress after the work)``
   (:func:`kvstab.model.tokens_held`);
4. requests with ``p = s + o`` release their memory at the end of the slot.

Every post-state variable is pinned by an explicit, named equation — the
frame conditions (``s' = s``, ``o' = o`` for every request that stays) are
written out rather than implied by sharing terms.  The post state keeps the
old active slots first (``K``) and the admitted queue slots after them
(``Q``), with empty slots where requests left, so it has ``K + Q`` active
slots; rules and invariants mask by ``present``, so gaps are harmless, and
:func:`compact` packs a state back into ``K`` slots where a run is unrolled.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from types import FrameType
from typing import Any

import z3

from kvstab.contract import (
    ActiveEntry,
    Decision,
    Scheduler,
    StateVar,
    View,
    WaitingEntry,
    check_decision_shape,
    state_vars_of,
)
from kvstab.errors import InvalidArgument, InvalidScheduler, KvstabError
from kvstab.model import PAPER_CHUNK, ModelParams, progress_after, tokens_held
from kvstab.proofs.solver import register_bounds
from kvstab.symbolic import Sym, Z3Ops, unwrap

__all__ = [
    "decide_time_limit",
    "call_decide",
    "Setting",
    "Entry",
    "SymState",
    "StepTerms",
    "encode_step",
    "compact",
    "fresh_state",
    "held",
    "state_terms",
    "state_in_bounds",
    "var_in_bounds",
    "state_at_initial",
]

#: the one operations instance (stateless)
OPS = Z3Ops()


#: the server's limits a :class:`Setting` takes over from :class:`ModelParams` by name
_LIMITS = ("chunk", "block", "token_budget", "max_num_seqs")


@dataclass(frozen=True, slots=True)
class Setting:
    """The server as the encoding sees it: ``M`` symbolic (``None``) or fixed;
    ``ŝ`` and ``B`` fixed (a symbolic ``ŝ`` or ``B`` would make ``⌈x/ŝ⌉`` and
    ``x mod ŝ`` non-linear)."""

    M: int | None = field(default=None, metadata={"help": "KV capacity; None = a symbolic positive integer"})
    chunk: int = field(default=PAPER_CHUNK, metadata={"help": "chunked-prefill size ŝ (fixed)"})
    block: int = field(default=1, metadata={"help": "KV block size B (fixed)"})
    token_budget: int | None = field(default=None, metadata={"help": "tokens per slot, None = unlimited"})
    max_num_seqs: int | None = field(default=None, metadata={"help": "cap on running requests, None = none"})
    prefix_caching: bool = field(
        default=False,
        metadata={
            "help": "views with shared KV blocks (docs/MODEL.md, 'The model with prefix caching'): every entry "
            "carries a symbolic shared (tokens an older request holds, whole blocks) and a waiting one a "
            "symbolic cached prefix (whole blocks, at most s − 1); memory is the pool's distinct blocks"
        },
    )

    def __post_init__(self) -> None:
        # ModelParams validates the numbers (M only when fixed)
        ModelParams(M=self.M if self.M is not None else max(self.block, 1), **self._limits())

    @classmethod
    def from_params(cls, params: ModelParams, *, symbolic_M: bool = False, caching: bool = False) -> Setting:
        """The encoding's view of the server ``params``: ``M`` left symbolic
        (``symbolic_M``, the proof then holds for every ``M ≥ B``) or fixed to
        ``params.M``; ``ŝ``, ``B``, the token budget and ``max_num_seqs`` as
        given.  ``b̄`` and the ``g`` convention do not enter a slot's step.  Views with
        shared blocks only with ``caching`` (``kvstab prove --prefix-caching on``) and
        ``params.prefix_caching``: a caller that does not ask keeps the proofs of the
        model without sharing, as before prefix caching existed."""
        limits = {k: getattr(params, k) for k in _LIMITS}
        return cls(M=None if symbolic_M else params.M, prefix_caching=caching and params.prefix_caching, **limits)

    def _limits(self) -> dict[str, Any]:
        """The server's limits a setting takes over from :class:`ModelParams` unchanged."""
        return {k: getattr(self, k) for k in _LIMITS}

    @property
    def M_term(self) -> z3.ArithRef:
        """``M`` as a z3 term: the constant ``M`` (shared by every frame) or its value."""
        return z3.Int("M") if self.M is None else z3.IntVal(self.M)

    def base_constraints(self) -> list[z3.BoolRef]:
        """What ``M`` must satisfy: ``M ≥ B`` (and ``M ≥ 1``)."""
        return [self.M_term >= max(1, self.block)]

    def params(self, M: int) -> ModelParams:
        """The concrete :class:`ModelParams` for ``M`` (to replay a model in the simulator);
        ``Setting.from_params(s.params(M))`` is ``s`` with ``M`` fixed."""
        return ModelParams(M=M, prefix_caching=self.prefix_caching, **self._limits())

    def assumptions(self) -> tuple[str, ...]:
        """The assumptions a proof in this setting carries."""
        out = [
            "M is any integer ≥ B" if self.M is None else f"M = {self.M}",
            f"ŝ = {self.chunk} (fixed)",
            f"B = {self.block} (fixed)",
        ]
        if self.token_budget is not None:
            out.append(f"token budget = {self.token_budget}")
        if self.max_num_seqs is not None:
            out.append(f"max_num_seqs = {self.max_num_seqs}")
        if self.prefix_caching:
            out.append(
                "prefix caching: memory is the pool's distinct blocks, each charged to its oldest holder "
                "(the view's shared), cached free blocks evictable (free); any shared and cached a view can show"
            )
        return tuple(out)


def held(x: Any, setting: Setting) -> z3.ArithRef:
    """``tokens_held(x)`` as a z3 term — the model's one accounting function, run on z3."""
    return unwrap(tokens_held(Sym(unwrap(x)), setting.block, OPS))


@dataclass(frozen=True, slots=True)
class Entry:
    """One slot of a symbolic state (active or queued)."""

    present: z3.BoolRef
    rid: z3.ArithRef
    s: z3.ArithRef
    o: z3.ArithRef
    p: z3.ArithRef
    #: prefix caching: tokens of its blocks an older request holds (the view's ``shared``);
    #: a waiting entry's ``p`` is then its cached prefix (the view's ``cached``, where its prefill starts)
    shared: z3.ArithRef = z3.IntVal(0)


@dataclass(frozen=True, slots=True)
class SymState:
    """Active slots in admission order and queue slots in queue order, at decision
    time, and the scheduler's own state (one term per declared
    :class:`~kvstab.contract.StateVar`, in declaration order; ``()`` for a
    stateless rule)."""

    active: tuple[Entry, ...]
    waiting: tuple[Entry, ...]
    sched: tuple[z3.ArithRef, ...] = ()
    svars: tuple[StateVar, ...] = ()


def state_terms(prefix: str, svars: Sequence[StateVar]) -> tuple[z3.ArithRef, ...]:
    """Fresh variables ``prefix.state.<name>`` for the declared state: ``Int``,
    or ``Real`` for a variable declared ``real=True``."""
    out = tuple(z3.Real(f"{prefix}.state.{v.name}") if v.real else z3.Int(f"{prefix}.state.{v.name}") for v in svars)
    for v, x in zip(svars, out):
        register_bounds(x, v.lo, v.hi)  # so that queries get linear facts on its products
    return out


def _num(v: StateVar, x: int | float) -> z3.ArithRef:
    """A declared bound or initial value as an exact z3 number of the variable's sort."""
    if v.real:
        return z3.RealVal(Fraction(x))  # a float's exact value, not its decimal rendering
    return z3.IntVal(int(x))


def var_in_bounds(v: StateVar, x: z3.ArithRef) -> z3.BoolRef:
    """``lo ≤ x ≤ hi``: the declared invariant of one state variable."""
    return z3.And(_num(v, v.lo) <= x, x <= _num(v, v.hi))


def state_in_bounds(state: SymState) -> z3.BoolRef:
    """Every state variable within its declared ``[lo, hi]`` (true when stateless)."""
    return z3.And(*[var_in_bounds(v, x) for v, x in zip(state.svars, state.sched)]) if state.svars else z3.BoolVal(True)


def state_at_initial(state: SymState) -> z3.BoolRef:
    """Every state variable at its declared ``initial`` value (the empty system's state)."""
    cs = [x == _num(v, v.initial) for v, x in zip(state.svars, state.sched)]
    return z3.And(*cs) if cs else z3.BoolVal(True)


def _fresh_entry(name: str, queued: bool, caching: bool = False) -> Entry:
    if queued:
        p = z3.Int(f"{name}.cached") if caching else z3.IntVal(0)
    else:
        p = z3.Int(f"{name}.p")
    return Entry(
        present=z3.Bool(f"{name}.present"),
        rid=z3.Int(f"{name}.rid"),
        s=z3.Int(f"{name}.s"),
        o=z3.Int(f"{name}.o"),
        p=p,
        shared=z3.Int(f"{name}.shared") if caching else z3.IntVal(0),
    )


def fresh_state(prefix: str, K: int, Q: int, svars: Sequence[StateVar] = (), caching: bool = False) -> SymState:
    """A state of fresh variables named ``prefix.a<i>.*``, ``prefix.w<j>.*`` and
    (for a stateful rule, ``svars``) ``prefix.state.<name>``.  With ``caching`` every
    entry has a symbolic ``shared`` and a queued one a symbolic cached prefix (its ``p``):
    the view of a state with shared blocks (:attr:`Setting.prefix_caching`)."""
    return SymState(
        active=tuple(_fresh_entry(f"{prefix}.a{i}", False, caching) for i in range(K)),
        waiting=tuple(_fresh_entry(f"{prefix}.w{j}", True, caching) for j in range(Q)),
        sched=state_terms(prefix, svars),
        svars=tuple(svars),
    )


def well_formed(state: SymState, setting: Setting, aligned: bool) -> z3.BoolRef:
    """Every present entry is a valid request the engine could hold: ``s, o ≥ 1``,
    its peak fits in ``M`` (the engine rejects others), an active one has
    ``0 < p < s + o`` and — with full-unit grants — a prefilling one has done
    whole chunks (``p < s ⇒ ŝ | p``)."""
    M = setting.M_term
    cs: list[z3.BoolRef] = []
    caching = setting.prefix_caching
    for e in state.active + state.waiting:
        c = [e.s >= 1, e.o >= 1, held(e.s + e.o, setting) <= M]
        if caching:
            c += [e.shared >= 0, e.shared % setting.block == 0]
        cs.append(z3.Implies(e.present, z3.And(*c)))
    if caching:  # a queued entry's cached prefix: whole blocks, at most s − 1 (the last token is recomputed)
        for e in state.waiting:
            c = [e.p >= 0, e.p <= e.s - 1, e.p % setting.block == 0]
            cs.append(z3.Implies(e.present, z3.And(*c)))
    for e in state.active:
        c = [e.p > 0, e.p < e.s + e.o]
        if aligned and not caching:
            c.append(z3.Implies(e.p < e.s, e.p % setting.chunk == 0))
        cs.append(z3.Implies(e.present, z3.And(*c)))
    return z3.And(*cs)


def memory(state: SymState, setting: Setting) -> z3.ArithRef:
    """Σ tokens held by the present active entries."""
    return z3.Sum([z3.If(e.present, held(e.p, setting), 0) for e in state.active] + [z3.IntVal(0)])


def view_of(state: SymState, setting: Setting) -> View:
    """The :class:`View` the rule sees: every value wrapped as :class:`Sym`."""
    if setting.prefix_caching:
        active = tuple(
            ActiveEntry(Sym(e.rid), Sym(e.s), Sym(e.o), Sym(e.p), Sym(e.present), 0, Sym(e.shared)) for e in state.active
        )
        waiting = tuple(
            WaitingEntry(Sym(e.rid), Sym(e.s), Sym(e.o), Sym(e.present), 0, Sym(e.p), Sym(e.shared))
            for e in state.waiting
        )
    else:
        active = tuple(ActiveEntry(Sym(e.rid), Sym(e.s), Sym(e.o), Sym(e.p), Sym(e.present)) for e in state.active)
        waiting = tuple(WaitingEntry(Sym(e.rid), Sym(e.s), Sym(e.o), Sym(e.present)) for e in state.waiting)
    return View(
        active=active,
        waiting=waiting,
        M=Sym(setting.M_term) if setting.M is None else setting.M,
        chunk=setting.chunk,
        block=setting.block,
        token_budget=setting.token_budget,
        max_num_seqs=setting.max_num_seqs,
        n_waiting=Sym(z3.Sum([z3.If(e.present, 1, 0) for e in state.waiting] + [z3.IntVal(0)])),
        state=tuple(Sym(x) for x in state.sched),
    )


#: the wall-clock limit on one call of a rule's ``decide`` inside a proof (seconds; ``None``: none)
_DECIDE_LIMIT: list[float | None] = [None]


@contextmanager
def decide_time_limit(seconds: float | None) -> Iterator[None]:
    """Within this block every call of a rule's ``decide`` that a proof makes
    (:func:`call_decide`: on symbolic values, or on a decoded state) raises
    :class:`InvalidScheduler` after ``seconds`` of wall time (``kvstab prove
    --decide-timeout``), so a rule that never returns ends the run with one line.
    It needs ``SIGALRM``, so it limits calls in the main thread only."""
    before = _DECIDE_LIMIT[0]
    _DECIDE_LIMIT[0] = seconds
    try:
        yield
    finally:
        _DECIDE_LIMIT[0] = before


def call_decide(scheduler: Scheduler, view: View, ops: Any) -> Any:
    """``scheduler.decide(view, ops)`` under :func:`decide_time_limit`'s limit."""
    limit = _DECIDE_LIMIT[0]
    if limit is None or threading.current_thread() is not threading.main_thread():
        return scheduler.decide(view, ops)
    name = getattr(scheduler, "name", repr(scheduler))

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise InvalidScheduler(f"scheduler {name!r}: decide did not return within the {limit:g} s limit "
                               "(--decide-timeout) in the proof")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return scheduler.decide(view, ops)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_rule(scheduler: Scheduler, view: View) -> Decision:
    """Run ``scheduler.decide`` on the symbolic view.

    Python control flow on a symbolic value raises :class:`InvalidScheduler`
    (from :class:`Sym`) naming the rule's line; any other failure of the rule
    on z3 terms becomes an :class:`InvalidScheduler` one-liner too.
    """
    name = getattr(scheduler, "name", repr(scheduler))
    try:
        decision = call_decide(scheduler, view, OPS)
    except KvstabError:
        raise
    except Exception as exc:
        raise InvalidScheduler(
            f"scheduler {name!r} failed when run on symbolic values: {type(exc).__name__}: {exc}; "
            "a rule must use only the ops interface on view values"
        ) from None
    return check_decision_shape(decision, view, name)


def _bool(x: Any) -> z3.BoolRef:
    z = unwrap(x)
    if not isinstance(z, z3.BoolRef):
        raise InvalidScheduler(f"a decision entry must be a truth value, got {x!r}")
    return z


@dataclass(frozen=True, slots=True)
class StepTerms:
    """One encoded slot: the decision, the work, the charge and the post state."""

    pre: SymState
    post: SymState
    preempt: tuple[z3.BoolRef, ...]  # per pre.active, masked by present
    admit: tuple[z3.BoolRef, ...]  # per pre.waiting, masked by present
    after: tuple[z3.ArithRef, ...]  # progress after the work: pre.active then pre.waiting
    running: tuple[z3.BoolRef, ...]  # does work this slot: pre.active then pre.waiting
    charged: z3.ArithRef  # Σ tokens held after the work
    tokens: z3.ArithRef  # tokens processed
    n_running: z3.ArithRef
    frame: tuple[tuple[str, z3.BoolRef], ...]  # named equations pinning the post state
    branches: tuple[tuple[str, z3.BoolRef], ...]  # the decision's branches (a partition)
    full_units: bool  # the rule gave no grants (every running request does one full unit)

    def constraints(self) -> list[z3.BoolRef]:
        """The transition relation: the conjunction of the frame equations."""
        return [c for _, c in self.frame]

    def safety(self, setting: Setting) -> list[tuple[str, z3.BoolRef]]:
        """The per-slot invariants the engine checks, as (name, term)."""
        out = [("memory ≤ M in the slot", self.charged <= setting.M_term)]
        if setting.max_num_seqs is not None:
            out.append(("running ≤ max_num_seqs", self.n_running <= setting.max_num_seqs))
        if setting.token_budget is not None:
            out.append(("tokens ≤ token budget", self.tokens <= setting.token_budget))
        return out


def _next_value(v: StateVar, x: Any, who: str) -> z3.ArithRef:
    """The rule's next value of ``v`` as a z3 term of ``v``'s sort.

    The engine rejects a non-integer next value of an integer variable
    (``check_next_state``); a real-sorted term for one is rejected here for
    the same reason (z3 would otherwise coerce the equation and silently
    restrict the proof to the models where the term happens to be integral).
    """
    if isinstance(x, bool) or (not isinstance(x, (int, float, Sym)) and not isinstance(x, z3.ArithRef)):
        raise InvalidScheduler(f"scheduler {who!r}: next value of state variable {v.name!r} is {x!r}, not a number")
    if isinstance(x, float):
        if not v.real:
            raise InvalidScheduler(
                f"scheduler {who!r}: next value of state variable {v.name!r} is {x!r}, not an integer"
            )
        return z3.RealVal(Fraction(x))
    z = unwrap(x)
    if not isinstance(z, z3.ArithRef):
        raise InvalidScheduler(f"scheduler {who!r}: next value of state variable {v.name!r} is {x!r}, not a number")
    if z.is_real() and not v.real:
        raise InvalidScheduler(
            f"scheduler {who!r}: state variable {v.name!r} is an integer but the rule gives it a real-valued "
            "term (declare it StateVar(..., real=True), or keep its arithmetic in integers)"
        )
    return z3.ToReal(z) if v.real and z.is_int() else z


def encode_step(scheduler: Scheduler, pre: SymState, setting: Setting, prefix: str) -> StepTerms:
    """Encode one engine slot from ``pre`` (the state the rule sees) into fresh
    post-state variables named ``prefix.*``.

    With prefix caching ``pre`` is a view with shared blocks (:func:`fresh_state` with
    ``caching``): entries net of what older holders hold, a queued entry starting at its
    cached prefix.  The slot's charge is then the pool's distinct blocks when the victims
    are a suffix (``docs/MODEL.md``, "The model with prefix caching", item 4); the post
    state keeps each entry's shift (its memory is the pool's after the release; the next
    slot's view charges the blocks a finished request shared to their next holder)."""
    svars = state_vars_of(scheduler)
    if tuple(svars) != pre.svars:
        # a programming error in kvstab (every caller builds the pre state from
        # the rule's own declaration), never a user's
        raise ValueError(
            f"pre state carries state {[v.name for v in pre.svars]}, the rule declares {[v.name for v in svars]}"
        )
    view = view_of(pre, setting)
    d = run_rule(scheduler, view)
    K, Q = len(pre.active), len(pre.waiting)
    preempt = tuple(z3.And(e.present, _bool(x)) for e, x in zip(pre.active, d.preempt))
    admit = tuple(z3.And(e.present, _bool(x)) for e, x in zip(pre.waiting, d.admit))
    raw_preempt = [unwrap(x) for x in d.preempt]
    raw_admit = [unwrap(x) for x in d.admit]
    grants: list[Any] = [None] * (K + Q) if d.grants is None else list(d.grants)

    entries = pre.active + pre.waiting
    running = tuple([z3.And(e.present, z3.Not(v)) for e, v in zip(pre.active, preempt)] + list(admit))
    # a grant the rule computed is a term (or an int); None is one full unit
    grant_terms = [g if g is None or isinstance(g, int) else Sym(unwrap(g)) for g in grants]
    after = tuple(
        unwrap(progress_after(Sym(e.s), Sym(e.p), setting.chunk, g, OPS)) for e, g in zip(entries, grant_terms)
    )
    charged = z3.Sum([z3.If(r, held(a, setting), 0) for r, a in zip(running, after)] + [z3.IntVal(0)])
    tokens = z3.Sum([z3.If(r, a - e.p, 0) for r, a, e in zip(running, after, entries)] + [z3.IntVal(0)])
    n_running = z3.Sum([z3.If(r, 1, 0) for r in running] + [z3.IntVal(0)])

    post = fresh_state(prefix, K + Q, K + Q, svars)
    frame: list[tuple[str, z3.BoolRef]] = []
    # the rule's own state moves with the slot: Decision.state, or unchanged
    rule_name = getattr(scheduler, "name", repr(scheduler))
    nxt = pre.sched if d.state is None else tuple(_next_value(v, x, rule_name) for v, x in zip(svars, d.state))
    for v, dst, val in zip(svars, post.sched, nxt):
        frame.append((f"state {v.name}' = decision.state", dst == val))
    # active slots: the kept old ones (slot i), then the admitted (slot K + j)
    for i, (src, r, a, dst) in enumerate(zip(entries, running, after, post.active)):
        who = f"active {i}" if i < K else f"admitted queue {i - K}"
        stays = z3.And(r, a < src.s + src.o)  # finished requests release at slot end
        frame.append((f"{who}: present' = runs ∧ unfinished", dst.present == stays))
        frame.append((f"{who}: progress' = progress_after", dst.p == z3.If(stays, a, 0)))
        frame.append((f"{who}: s' = s, o' = o, rid' = rid", z3.And(dst.s == src.s, dst.o == src.o, dst.rid == src.rid)))
    # queue slots: the preempted (oldest admission first), then the queue minus the admitted
    for i, (src, dst) in enumerate(zip(entries, post.waiting)):
        stays_q = preempt[i] if i < K else z3.And(src.present, z3.Not(admit[i - K]))
        who = f"preempted active {i}" if i < K else f"queue {i - K}"
        frame.append((f"{who}: queued'", dst.present == stays_q))
        frame.append((f"{who}: s' = s, o' = o, rid' = rid", z3.And(dst.s == src.s, dst.o == src.o, dst.rid == src.rid)))

    any_p = z3.Or(*preempt) if preempt else z3.BoolVal(False)
    any_a = z3.Or(*admit) if admit else z3.BoolVal(False)
    can_preempt = any(not z3.is_false(x) for x in raw_preempt)
    can_admit = any(not z3.is_false(x) for x in raw_admit)
    # the branches partition the decisions; a branch the rule's structure rules
    # out (every entry the literal False) is not generated, so that a vacuity
    # guard failure always means something.  Cheapest first: a counterexample
    # to induction usually shows up in a slot that only runs.
    branches: list[tuple[str, z3.BoolRef]] = [("holds", z3.And(z3.Not(any_p), z3.Not(any_a)))]
    if can_preempt:
        branches.append(("preempts", any_p))
    if can_admit:
        branches.append(("admits", z3.And(z3.Not(any_p), any_a)))

    return StepTerms(
        pre=pre,
        post=post,
        preempt=preempt,
        admit=admit,
        after=after,
        running=running,
        charged=charged,
        tokens=tokens,
        n_running=n_running,
        frame=tuple(frame),
        branches=tuple(branches),
        full_units=d.grants is None,
    )


def compact(
    entries: Sequence[Entry], n: int, prefix: str, queued: bool
) -> tuple[tuple[Entry, ...], list[z3.BoolRef], z3.BoolRef]:
    """Pack the present ``entries`` (in order) into ``n`` fresh slots.

    Returns the slots, the constraints that define them, and the condition
    that they all fit (``#present ≤ n``); a run that needs more slots lies
    outside the bounded model.
    """
    out = tuple(_fresh_entry(f"{prefix}.{'w' if queued else 'a'}{k}", queued) for k in range(n))
    cs: list[z3.BoolRef] = []
    rank: z3.ArithRef = z3.IntVal(0)
    for e in entries:
        for k, dst in enumerate(out):
            same = [dst.s == e.s, dst.o == e.o, dst.rid == e.rid]
            if not queued:
                same.append(dst.p == e.p)
            cs.append(z3.Implies(z3.And(e.present, rank == k), z3.And(*same)))
        rank = rank + z3.If(e.present, 1, 0)
    total = rank
    for k, dst in enumerate(out):
        cs.append(dst.present == (total > k))
        # empty slots are pinned, so that decoded states are canonical
        empty = [dst.s == 0, dst.o == 0, dst.rid == -1]
        if not queued:
            empty.append(dst.p == 0)
        cs.append(z3.Implies(z3.Not(dst.present), z3.And(*empty)))
    return out, cs, total <= n


def check_bounds(K: int, Q: int) -> None:
    """``K ≥ 1`` and ``Q ≥ 1``, as one clear line."""
    for name, v in (("K (active slots)", K), ("Q (queue slots)", Q)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgument(f"{name} must be a positive integer, got {v!r}")
