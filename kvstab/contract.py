"""The scheduler contract: an immutable view in, a decision out.

Each slot the engine shows a scheduler a :class:`View` — the active requests
with their progress (oldest admission first), the head of the waiting queue in
queue order, ``M``, ``ŝ`` and the other server parameters — and the scheduler
returns a :class:`Decision`: which waiting requests to admit, which active
requests to preempt, and (optionally) how many tokens of work each request is
granted this slot.  The engine applies it: preempted requests lose their memory
and progress and go back to the queue; admitted ones join the active set;
every active request advances by its grant (one unit by default); memory is
charged; finished requests release it.

The rule is written once, against :class:`kvstab.ops.Ops`, and must not use
Python control flow on values it reads from the view.  Every entry of a view
carries a ``present`` flag: in the simulator it is always ``True`` (views hold
only real requests); in the z3 encoding an entry is a *slot* that may be empty.
A rule therefore masks with ``present`` (``ops.and_(r.present, …)``), which is
what makes it correct for both.  See ``docs/scheduler-contract.md``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn, Protocol, runtime_checkable

import numpy as np

from kvstab.errors import InvalidScheduler
from kvstab.model import first_chunk_tokens, progress_after, tokens_held
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = [
    "ActiveEntry",
    "WaitingEntry",
    "View",
    "Decision",
    "Scheduler",
    "Traits",
    "traits_of",
    "DecideFn",
    "held_now",
    "held_next",
    "held_first",
    "used_now",
    "used_next",
    "fcfs_admit",
    "fcfs_admit_with_grants",
    "fcfs_admit_projected",
    "Projected",
    "preempt_newest",
    "retract_until_fits",
    "pops_before",
    "select",
    "scan",
    "zipped",
    "sum_of",
    "count_of",
    "any_of",
    "no_preemption",
    "check_decision_shape",
    "check_decision_values",
    "HiddenOutput",
    "visible_view",
    "hidden_output",
    "StateVar",
    "state_vars_of",
    "initial_state",
    "check_next_state",
]


#: what ``prior`` means on a view entry (one text for both kinds of entry)
PRIOR_HELP = (
    "output tokens produced before a preemption and kept: a lifecycle that resumes a victim by "
    "recomputing its prompt and outputs (vLLM, SGLang) folds them into s and o as s + prior, o - prior; "
    "0 under kvstab's restart-from-scratch lifecycle"
)


@dataclass(frozen=True, slots=True)
class ActiveEntry:
    """An active (admitted, unfinished) request as a scheduler sees it."""

    rid: IntLike = field(metadata={"help": "request id (arrival order)"})
    s: IntLike = field(metadata={"help": "prompt length"})
    o: IntLike = field(metadata={"help": "output length (a non-clairvoyant policy must not read it)"})
    progress: IntLike = field(metadata={"help": "tokens processed so far, 0 < progress < s + o"})
    present: BoolLike = field(default=True, metadata={"help": "whether this slot holds a request"})
    prior: IntLike = field(default=0, metadata={"help": PRIOR_HELP})


@dataclass(frozen=True, slots=True)
class WaitingEntry:
    """A waiting request (never admitted, or preempted and reset to progress 0)."""

    rid: IntLike = field(metadata={"help": "request id (arrival order)"})
    s: IntLike = field(metadata={"help": "prompt length"})
    o: IntLike = field(metadata={"help": "output length (a non-clairvoyant policy must not read it)"})
    present: BoolLike = field(default=True, metadata={"help": "whether this slot holds a request"})
    prior: IntLike = field(default=0, metadata={"help": PRIOR_HELP})


@dataclass(frozen=True, slots=True)
class View:
    """What a scheduler sees at the start of a slot (after this slot's arrivals)."""

    active: tuple[ActiveEntry, ...] = field(metadata={"help": "active requests, oldest admission first"})
    waiting: tuple[WaitingEntry, ...] = field(
        metadata={"help": "head of the waiting queue in queue order (the whole queue, or a window of it)"}
    )
    M: IntLike = field(metadata={"help": "KV capacity in tokens"})
    chunk: IntLike = field(metadata={"help": "chunked-prefill size ŝ"})
    block: IntLike = field(default=1, metadata={"help": "allocation block size B"})
    token_budget: IntLike | None = field(default=None, metadata={"help": "tokens per slot, None = unlimited"})
    max_num_seqs: IntLike | None = field(default=None, metadata={"help": "cap on active requests, None = none"})
    n_waiting: IntLike = field(default=0, metadata={"help": "length of the whole queue (≥ len(waiting))"})
    state: tuple[Any, ...] = field(
        default=(),
        metadata={"help": "the scheduler's own state, one value per declared StateVar, in declaration order"},
    )


@dataclass(frozen=True, slots=True)
class Decision:
    """A scheduler's decision for one slot.

    ``admit[j]`` refers to ``view.waiting[j]``, ``preempt[i]`` to
    ``view.active[i]``.  ``grants`` (optional) gives the tokens of work granted
    to each request that runs this slot, in the order: the active entries, then
    the waiting entries (an entry that is not admitted, or is preempted, gets
    nothing whatever its grant).  ``None`` grants one full unit to everyone.
    A grant is clamped to one unit (``≤ ŝ`` prompt tokens, ``≤ 1`` output token).
    ``state`` (optional) is the rule's next state (see :class:`StateVar`): the
    engine shows it in the next slot's ``view.state``.
    """

    admit: tuple[BoolLike, ...]
    preempt: tuple[BoolLike, ...]
    grants: tuple[IntLike, ...] | None = None
    #: the scheduler's state after this slot, one value per declared
    #: :class:`StateVar` (``None``: unchanged; a stateless rule leaves it ``None``)
    state: tuple[Any, ...] | None = None


DecideFn = Callable[[View, Ops], Decision]


@dataclass(frozen=True, slots=True)
class Traits:
    """What a scheduler claims about itself; kvstab checks each claim it can.

    Declared once, as ``traits = Traits(...)`` on the scheduler.  A misspelled
    trait is a ``TypeError`` where it is written, and the registry rejects a
    scheduler that sets a trait-like attribute outside ``traits`` (a flat
    ``work_conserving = True`` would otherwise be silently ignored).
    """

    fcfs: bool = field(default=False, metadata={"help": "first admissions follow arrival order"})
    work_conserving: bool = field(
        default=False, metadata={"help": "never leaves a request waiting that its own admission test would accept"}
    )
    clairvoyant: bool = field(
        default=True, metadata={"help": "reads output lengths o (False: the rule is never shown o)"}
    )
    preempts: bool = field(default=False, metadata={"help": "may preempt running requests"})
    negative_control: bool = field(
        default=False, metadata={"help": "deliberately broken (excluded from default audits, expected to fail)"}
    )
    stalls_running: bool = field(
        default=False,
        metadata={
            "help": "may give running requests no work in a slot that no token budget forces "
            "(SGLang's prefill-only steps); liveness is then bounded by total work, not by n(s) + o"
        },
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, bool):
                raise InvalidScheduler(f"trait {f.name} must be True or False, got {v!r}")

    def tags(self) -> list[str]:
        """The traits that hold, as short tags (for listings)."""
        names = ("fcfs", "clairvoyant", "preempts", "work_conserving", "stalls_running", "negative_control")
        return [
            n if n in ("fcfs", "clairvoyant", "preempts", "work_conserving") else n.replace("_", "-")
            for n in names
            if getattr(self, n)
        ]


TRAIT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Traits))

#: a scheduler that declares nothing: may read ``o``, claims no order, no conservation, no preemption
NO_TRAITS = Traits()


def traits_of(scheduler: object) -> Traits:
    """The :class:`Traits` a scheduler declares (``Traits()`` if it declares none).

    Raises :class:`InvalidScheduler` when ``traits`` is not a ``Traits``, or
    when a trait is set as a plain attribute (``fcfs = True``) or a near miss
    of one (``work_conservng``), which would otherwise be ignored.
    """
    who = getattr(scheduler, "name", type(scheduler).__name__)
    declared = getattr(scheduler, "traits", NO_TRAITS)
    if not isinstance(declared, Traits):
        raise InvalidScheduler(f"scheduler {who!r}: traits must be a kvstab.Traits(...), got {type(declared).__name__}")
    for attr in dir(scheduler):
        if attr.startswith("_") or attr == "traits":
            continue
        close = difflib.get_close_matches(attr, TRAIT_NAMES, n=1, cutoff=0.8)
        if not close:
            continue
        try:
            value = getattr(scheduler, attr)
        except Exception:  # a property that fails is not a trait declaration
            continue
        if isinstance(value, bool):
            hint = "" if attr == close[0] else f" (did you mean {close[0]!r}?)"
            raise InvalidScheduler(
                f"scheduler {who!r}: {attr} = {value} is a plain attribute{hint}; declare traits as "
                f"traits = Traits({close[0]}={value}, ...) — known traits: {', '.join(TRAIT_NAMES)}"
            )
    return declared


class HiddenOutput(int):
    """What a non-clairvoyant rule sees in place of an output length ``o``.

    A rule whose traits declare ``clairvoyant=False`` is never shown ``o``
    (:func:`visible_view`): the true length is not in its view at all, so no
    rule can learn it.  Any use of the placeholder — arithmetic, comparison,
    ``bool``, ``int``, indexing, formatting, or coercion into a z3 term —
    raises :class:`InvalidScheduler` naming the scheduler, so a rule that
    declares the wrong trait is caught the first time it reads ``o``.

    It subclasses ``int`` (value 0) so that z3's coercion of a Python integer,
    which calls ``str`` on it, reaches :meth:`__str__` and raises too.
    """

    who: str
    rid: object

    def __new__(cls, who: str, rid: object) -> HiddenOutput:
        obj = super().__new__(cls, 0)
        obj.who = who
        obj.rid = rid
        return obj

    def _read(self, *_: object) -> NoReturn:
        raise InvalidScheduler(
            f"scheduler {self.who!r} declares clairvoyant=False but read the output length o of request "
            f"{self.rid!r}; a non-clairvoyant rule is never shown o (declare traits = Traits(clairvoyant=True, ...) "
            "if the rule needs it)"
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _read
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _read
    __divmod__ = __rdivmod__ = __pow__ = __rpow__ = __lshift__ = __rshift__ = _read
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _read
    __neg__ = __pos__ = __abs__ = __invert__ = _read
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _read  # type: ignore[assignment]
    __bool__ = __int__ = __index__ = __float__ = __complex__ = _read  # type: ignore[assignment]
    __round__ = __trunc__ = __floor__ = __ceil__ = __format__ = __str__ = _read  # type: ignore[assignment]

    def __hash__(self) -> int:
        return id(self)  # hashing an entry reveals nothing about o

    def __repr__(self) -> str:
        return "<o hidden: not clairvoyant>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (HiddenOutput, (self.who, self.rid))


@functools.lru_cache(maxsize=1 << 16)
def _hidden(who: str, rid: int) -> HiddenOutput:
    return HiddenOutput(who, rid)


def hidden_output(who: str, rid: object) -> HiddenOutput:
    """The placeholder shown instead of request ``rid``'s ``o`` to scheduler ``who``
    (one per pair: placeholders are immutable, and making one costs more than an entry)."""
    # a symbolic rid (a z3 term) is not hashable: make a fresh placeholder
    return _hidden(who, rid) if type(rid) is int else HiddenOutput(who, rid)


def visible_view(view: View, traits: Traits, who: str = "the scheduler") -> View:
    """The view a rule with ``traits`` may see: ``view`` itself for a
    clairvoyant rule; otherwise a copy whose every entry's ``o`` is a
    :class:`HiddenOutput` that raises :class:`InvalidScheduler` on any use.

    Only ``o`` is replaced and no other value is inspected, so it works
    unchanged on views whose values are z3 terms (``kvstab.symbolic.Sym``):
    the simulator, the fast engine and the z3 encoding all call it before
    ``decide``.  ``who`` names the scheduler in the error (its spec).  It is
    idempotent: a view whose ``o`` are all hidden already is returned as is.
    """
    if traits.clairvoyant:
        return view
    if all(isinstance(e.o, HiddenOutput) for e in view.active) and all(
        isinstance(e.o, HiddenOutput) for e in view.waiting
    ):
        return view  # already hidden (an engine may build the view that way; see Engine.view)
    # direct constructors, not dataclasses.replace: this runs before every decision
    return View(
        active=tuple(
            ActiveEntry(a.rid, a.s, hidden_output(who, a.rid), a.progress, a.present, a.prior) for a in view.active
        ),
        waiting=tuple(WaitingEntry(w.rid, w.s, hidden_output(who, w.rid), w.present, w.prior) for w in view.waiting),
        M=view.M,
        chunk=view.chunk,
        block=view.block,
        token_budget=view.token_budget,
        max_num_seqs=view.max_num_seqs,
        n_waiting=view.n_waiting,
        state=view.state,
    )


@dataclass(frozen=True, slots=True)
class StateVar:
    """One variable of a scheduler's own state, carried by the engine from slot to slot.

    Many real schedulers keep state across steps (SGLang's ``new_token_ratio``,
    a token bucket, an adaptive watermark).  A rule stays pure: it declares its
    state as ``state_vars = (StateVar(...), ...)``, reads the current values in
    ``view.state`` (declaration order) and returns the next values in
    ``Decision.state``.  The engine starts every run at ``initial`` and checks,
    every slot, that each next value is a finite number within ``[lo, hi]`` (an
    integer unless ``real``) — the bounds are the state invariant the proofs
    assume of the pre-state and must re-establish in the post-state, so a
    concrete run checks the same declaration z3 relies on.
    """

    name: str = field(metadata={"help": "the variable's name (unique within the scheduler)"})
    initial: int | float = field(metadata={"help": "its value in the empty system, at the start of every run"})
    lo: int | float = field(metadata={"help": "least value the rule may ever give it"})
    hi: int | float = field(metadata={"help": "greatest value the rule may ever give it"})
    real: bool = field(default=False, metadata={"help": "a real number (float; z3 Real) rather than an integer"})
    help: str = field(default="", metadata={"help": "one line saying what it is"})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InvalidScheduler(f"a state variable's name must be an identifier, got {self.name!r}")
        for attr in ("initial", "lo", "hi"):
            bad = _bad_state_value(getattr(self, attr), self.real)
            if bad is not None:
                raise InvalidScheduler(f"state variable {self.name!r}: {attr} is {bad}")
        if not (self.lo <= self.initial <= self.hi):
            raise InvalidScheduler(
                f"state variable {self.name!r}: initial value {self.initial!r} is outside its bounds "
                f"[{self.lo!r}, {self.hi!r}]"
            )


def _bad_state_value(v: object, real: bool) -> str | None:
    """What is wrong with ``v`` as a concrete value of a state variable, or ``None``."""
    if isinstance(v, HiddenOutput):
        v._read()
    if isinstance(v, bool) or not isinstance(v, (numbers.Integral, float) if real else numbers.Integral):
        kind = "a finite number" if real else "an integer"
        return f"{v!r} ({type(v).__name__}), not {kind}"
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v!r}, not finite"
    return None


def state_vars_of(scheduler: object) -> tuple[StateVar, ...]:
    """The :class:`StateVar` s a scheduler declares (``()`` for a stateless rule).

    Raises :class:`InvalidScheduler` unless ``state_vars`` is a tuple of
    ``StateVar`` with distinct names.
    """
    who = getattr(scheduler, "name", type(scheduler).__name__)
    declared = getattr(scheduler, "state_vars", ())
    if not isinstance(declared, tuple) or not all(isinstance(v, StateVar) for v in declared):
        raise InvalidScheduler(
            f"scheduler {who!r}: state_vars must be a tuple of kvstab.StateVar(...), got {declared!r}"
        )
    names = [v.name for v in declared]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidScheduler(f"scheduler {who!r}: state variable names must be distinct, repeated: {dup}")
    return declared


def initial_state(state_vars: Sequence[StateVar]) -> tuple[int | float, ...]:
    """The state every run starts from: each variable's ``initial``."""
    return tuple(v.initial for v in state_vars)


def check_next_state(
    decision: Decision, current: tuple[Any, ...], state_vars: Sequence[StateVar], who: str
) -> tuple[Any, ...]:
    """The state after a *concrete* decision: ``current`` if ``decision.state``
    is ``None``, else its values once checked against ``state_vars`` (one per
    variable, finite, an integer unless ``real``, within ``[lo, hi]``);
    :class:`InvalidScheduler` names the variable otherwise."""
    nxt = decision.state
    if nxt is None:
        return current
    if not isinstance(nxt, tuple) or len(nxt) != len(state_vars):
        names = ", ".join(v.name for v in state_vars) or "none"
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.state must be a tuple of {len(state_vars)} values "
            f"(declared state variables: {names}), got {nxt!r}"
        )
    out: list[Any] = []
    for var, value in zip(state_vars, nxt):
        if isinstance(value, np.generic):
            value = value.item()
        bad = _bad_state_value(value, var.real)
        if bad is None and not (var.lo <= value <= var.hi):
            bad = f"{value!r}, outside its declared bounds [{var.lo!r}, {var.hi!r}]"
        if bad is not None:
            raise InvalidScheduler(f"scheduler {who!r}: next value of state variable {var.name!r} is {bad}")
        out.append(value)
    return tuple(out)


@runtime_checkable
class Scheduler(Protocol):
    """A scheduler: a name, a one-line description, and a pure decision rule.

    Optional attributes the rest of kvstab reads when present:

    * ``traits: Traits`` — what the rule claims (FCFS, work conservation,
      clairvoyance, preemption, negative control); see :class:`Traits` and
      :func:`traits_of`;
    * ``margin(params, max_s, max_o) -> int`` — a declared
      work-conservation margin ``Δ`` (tokens) for props until a proof gives one;
    * ``state_vars: tuple[StateVar, ...]`` — the rule's own state, carried by
      the engine (``view.state`` in, ``Decision.state`` out); see :class:`StateVar`.
    """

    @property
    def name(self) -> str:
        """Registry name (e.g. ``current-fit``)."""

    @property
    def description(self) -> str:
        """One line saying what the policy does."""

    def decide(self, view: View, ops: Ops) -> Decision:
        """The decision for one slot; pure, and written against ``ops``."""


# --- combinators: how a rule reads the view's sequences
#
# A rule may loop over ``view.active`` and ``view.waiting`` in plain Python, but
# a rule that reads them only through these combinators has a decision whose
# *structure* is the same for every number of requests: for ``n`` entries it is
# the ``n``-fold unrolling of one step.  ``kvstab.proofs.unbounded`` runs such a
# rule once on a view whose sequences cannot be iterated, measured or indexed
# (each combinator then records its step instead of unrolling it) and proves the
# memory invariant for any number of requests from obligations about one step.
# Concretely every combinator is the plain loop its docstring states.


def _lazy(xs: object) -> bool:
    """Whether ``xs`` is a sequence the proofs stand in for (it folds itself)."""
    return hasattr(type(xs), "__kvstab_scan__")


def scan(
    xs: Sequence[Any], step: Callable[[Any, Any], tuple[Any, Any]], init: Any, *, width: int | None = None
) -> tuple[Any, Any]:
    """A left fold over ``xs`` that also emits one output per element.

    ``step(x, acc)`` returns ``(out, acc′)``; ``scan`` runs it on every element
    in order, starting from ``init``, and returns the outputs in order and the
    final accumulator.  With ``width=k`` every ``out`` is a ``k``-tuple and the
    outputs come back as ``k`` tuples, one per component (so a step can emit a
    preempt flag and a grant).  ``step`` must be a pure function of its two
    arguments (it may read the view and ``ops``): it is the one place where the
    rule's decision may depend on an entry.  An accumulator may be a tuple.
    """
    hook = getattr(type(xs), "__kvstab_scan__", None)
    if hook is not None:
        return hook(xs, step, init, width)  # type: ignore[no-any-return]
    acc = init
    outs: list[Any] = []
    for x in xs:
        out, acc = step(x, acc)
        outs.append(out)
    if width is None:
        return tuple(outs), acc
    return tuple(tuple(o[i] for o in outs) for i in range(width)), acc


def zipped(*seqs: Sequence[Any]) -> tuple[Any, ...]:
    """The elements of equally long sequences side by side (``zip``), e.g. the
    active entries with the flags a scan emitted for them, to scan again."""
    hook = getattr(type(seqs[0]), "__kvstab_zip__", None) if seqs else None
    if hook is not None:
        return hook(*seqs)  # type: ignore[no-any-return]
    return tuple(zip(*seqs, strict=True))


def sum_of(xs: Sequence[Any], term: Callable[[Any], IntLike], ops: Ops) -> IntLike:
    """``Σ term(x)`` over ``xs`` (``ops.sum``, a fold with ``acc + term(x)``)."""
    if _lazy(xs):
        return scan(xs, lambda x, acc: (None, acc + term(x)), 0)[1]
    return ops.sum(term(x) for x in xs)


def count_of(xs: Sequence[Any], pred: Callable[[Any], BoolLike], ops: Ops) -> IntLike:
    """How many ``x`` in ``xs`` satisfy ``pred`` (``ops.count``)."""
    if _lazy(xs):
        return scan(xs, lambda x, acc: (None, acc + ops.ite(pred(x), 1, 0)), 0)[1]
    return ops.count(pred(x) for x in xs)


def any_of(flags: Sequence[BoolLike], ops: Ops) -> BoolLike:
    """Whether any of ``flags`` holds (``ops.or_``), e.g. "this slot preempted"."""
    if _lazy(flags):
        return scan(flags, lambda x, acc: (None, ops.or_(acc, x)), False)[1]
    return ops.or_(*flags)


def no_preemption(view: View) -> tuple[BoolLike, ...]:
    """Preempt flags that preempt nobody (one ``False`` per active entry)."""
    if _lazy(view.active):
        return scan(view.active, lambda a, acc: (False, acc), ())[0]  # type: ignore[no-any-return]
    return tuple(False for _ in view.active)


def select(cond: BoolLike, then: Sequence[Any], other: Sequence[Any], ops: Ops) -> tuple[Any, ...]:
    """Element by element, ``then[i]`` where ``cond`` holds and ``other[i]`` where it
    does not (``ops.ite``): one choice, the same for every entry, between two
    sequences — e.g. the active list's grants of a prefill step or of a decode step.

    ``cond`` is a value of the rule (a fold's result), not of one entry.  The proofs
    for any number of requests split the slot on it: in each case the decision comes
    from one of the two sequences (``docs/proofs.md``)."""
    hook = getattr(type(then), "__kvstab_select__", None)
    if hook is not None:
        return hook(then, cond, other)  # type: ignore[no-any-return]
    return tuple(ops.ite(cond, a, b) for a, b in zip(then, other, strict=True))


def pops_before(ops: Ops, kj: Sequence[IntLike], ki: Sequence[IntLike], j_later: bool) -> BoolLike:
    """The order :func:`retract_until_fits` pops in: whether the entry with key ``kj``
    goes before the one with key ``ki`` — a smaller key (compared lexicographically),
    or an equal key and ``j`` later in the list (``j_later``).  A strict total order on
    the entries whatever the keys are (``kvstab.proofs.loops.retraction_lemma`` checks it)."""
    less: BoolLike = False
    same: BoolLike = True
    for a, b in zip(kj, ki, strict=True):
        less = ops.or_(less, ops.and_(same, ops.lt(a, b)))
        same = ops.and_(same, ops.eq(a, b))
    return ops.or_(less, same) if j_later else less


def retract_until_fits(
    view: View,
    ops: Ops,
    cost: Callable[[ActiveEntry], IntLike],
    key: Callable[[ActiveEntry], Sequence[IntLike]],
    cap: IntLike,
    allowed: BoolLike = True,
) -> tuple[BoolLike, ...]:
    """Retraction in a strict total order, written against ``ops``: the preempt flags.

    Pop the active requests one by one, in ascending order of ``key(a)`` (a tuple of
    values, compared lexicographically; of two equal keys the later entry goes
    first, as a stable sort by descending key popped from its end), while the
    requests not popped yet cost more than ``cap`` together (``Σ cost(a)``); never
    pop the last one.  Nobody is popped when ``allowed`` is false or everything
    fits.  Popping only makes the rest cheaper, so entry ``i`` is popped iff it is
    not last in the order and the requests from ``i`` on (itself included) cost more
    than ``cap`` — what this computes, one flag per entry.

    The memory bound it gives (``docs/proofs.md``, proved for any number of
    requests by ``kvstab.proofs``): when every request's cost lies in
    ``[0, cap]``, the requests kept cost at most ``cap`` — whatever the keys,
    since only the order's totality is used.  ``cost`` and ``key`` read one entry
    (pure functions); an empty slot costs nothing and is never popped.

    Concretely it returns at once when nobody is popped (the common case); only a
    step that retracts compares the entries pairwise (``O(K²)`` operations, which
    is also what a symbolic run unrolls).
    """
    hook = getattr(type(view.active), "__kvstab_retract__", None)
    if hook is not None:
        return hook(view.active, view, ops, cost, key, cap, allowed)  # type: ignore[no-any-return]
    actives = view.active
    n = len(actives)
    if allowed is False:
        return (False,) * n
    costs = [ops.ite(a.present, cost(a), 0) for a in actives]
    over = ops.and_(allowed, ops.lt(cap, ops.sum(costs)))
    if over is False:
        return (False,) * n  # the concrete common case: every flag below has `over` as a conjunct
    keys = [tuple(key(a)) for a in actives]
    present = [a.present for a in actives]
    # earlier[i][j]: entry j is popped before entry i
    earlier = [
        [ops.and_(present[j], pops_before(ops, keys[j], keys[i], j > i)) if j != i else False for j in range(n)]
        for i in range(n)
    ]
    flags: list[BoolLike] = []
    for i in range(n):
        # i is last when no present entry is popped after it
        last = ops.not_(ops.or_(*[ops.and_(present[j], earlier[j][i]) for j in range(n) if j != i]))
        # what is left when i's turn comes: the requests not popped before it, itself included
        rest = ops.sum(ops.ite(earlier[i][j], 0, costs[j]) for j in range(n))
        # `over` first: a tape skips the rows behind it when it is false (kvstab.engine._guards)
        flags.append(ops.and_(over, present[i], ops.not_(last), ops.lt(cap, rest)))
    return tuple(flags)


# --- helpers every rule may use; each calls the one memory-accounting function


def held_now(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """Tokens ``a`` holds now (before this slot's work); 0 for an empty slot."""
    return ops.ite(a.present, tokens_held(a.progress, view.block, ops), 0)


def held_next(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """Tokens ``a`` will hold after one full unit of work this slot; 0 for an empty slot."""
    nxt = progress_after(a.s, a.progress, view.chunk, None, ops)
    return ops.ite(a.present, tokens_held(nxt, view.block, ops), 0)


def held_first(view: View, w: WaitingEntry, ops: Ops) -> IntLike:
    """Tokens a waiting request would hold after its first slot (its first chunk)."""
    return ops.ite(w.present, tokens_held(first_chunk_tokens(w.s, view.chunk, ops), view.block, ops), 0)


def used_now(view: View, ops: Ops) -> IntLike:
    """Memory in use at the start of the slot."""
    return sum_of(view.active, lambda a: held_now(view, a, ops), ops)


def used_next(view: View, ops: Ops) -> IntLike:
    """Memory the active requests will hold after one full unit each."""
    return sum_of(view.active, lambda a: held_next(view, a, ops), ops)


def preempt_newest(view: View, ops: Ops) -> tuple[tuple[BoolLike, ...], IntLike]:
    """Recompute preemption as vLLM v1 does it, written against ``ops``.

    vLLM walks the running list oldest first and preempts from the tail until
    the current request's blocks fit; because memory only grows, the survivors
    are the longest prefix (in admission order) whose post-slot memory fits in
    ``M``.  Returns the preempt flags (one per active entry) and the post-slot
    memory of the survivors.  One :func:`scan` over the active list, carrying
    ``(prefix, kept)``: the post-slot memory of every entry so far and of the
    survivors so far; an entry is a victim iff ``prefix`` exceeds ``M`` with it.
    """

    def step(a: ActiveEntry, acc: tuple[IntLike, IntLike]) -> tuple[BoolLike, tuple[IntLike, IntLike]]:
        prefix, kept = acc
        nxt = held_next(view, a, ops)
        prefix = prefix + nxt
        victim = ops.and_(a.present, ops.lt(view.M, prefix))
        return victim, (prefix, kept + ops.ite(victim, 0, nxt))

    preempt, (_, kept) = scan(view.active, step, (0, 0))
    return preempt, kept


def fcfs_admit(
    view: View,
    ops: Ops,
    fits: Callable[[WaitingEntry, IntLike], tuple[BoolLike, IntLike]],
    start: IntLike,
    allowed: BoolLike = True,
) -> tuple[BoolLike, ...]:
    """Head-of-line FCFS admission written against ``ops``.

    Walk the queue in order carrying an accumulator (``start``, e.g. memory
    committed so far; a tuple of values is fine).  ``fits(w, acc)`` returns whether ``w`` may be admitted
    on top of ``acc`` and the accumulator if it is.  The first present request
    that does not fit blocks everyone behind it.  ``allowed=False`` admits no
    one (e.g. in a slot that preempted).  ``max_num_seqs`` is respected.
    One :func:`scan` over the queue.
    """
    admits, _ = _fcfs(view, ops, lambda w, acc: (*fits(w, acc), None), start, allowed, granting=False)
    return admits  # type: ignore[no-any-return]


def fcfs_admit_with_grants(
    view: View,
    ops: Ops,
    fits: Callable[[WaitingEntry, Any], tuple[BoolLike, Any, IntLike]],
    start: Any,
    allowed: BoolLike = True,
) -> tuple[tuple[BoolLike, ...], tuple[IntLike, ...]]:
    """:func:`fcfs_admit` for a rule that grants tokens: ``fits(w, acc)`` returns
    ``(ok, acc_if_admitted, grant_if_admitted)``, and the result is the admit
    flags and each waiting entry's grant (0 unless admitted), from one walk."""
    admits, grants = _fcfs(view, ops, fits, start, allowed, granting=True)
    return admits, grants


def _fcfs(
    view: View, ops: Ops, fits: Callable[[WaitingEntry, Any], tuple[Any, Any, Any]], start: Any, allowed: BoolLike,
    *, granting: bool,
) -> tuple[Any, Any]:
    """The one FCFS walk behind :func:`fcfs_admit` and :func:`fcfs_admit_with_grants`."""
    running0 = count_of(view.active, lambda a: a.present, ops)
    cap = view.max_num_seqs  # a configuration fact, not a value of the state

    def step(w: WaitingEntry, state: tuple[Any, BoolLike, IntLike]) -> tuple[Any, tuple[Any, BoolLike, IntLike]]:
        acc, blocked, running = state
        ok, acc_if, grant_if = fits(w, acc)
        if cap is not None:
            ok = ops.and_(ok, ops.lt(running, cap))
        take = ops.and_(w.present, ops.not_(blocked), ok)
        out = (take, ops.ite(take, grant_if, 0)) if granting else take
        return out, (
            _select(ops, take, acc_if, acc),
            ops.or_(blocked, ops.and_(w.present, ops.not_(take))),
            running + ops.ite(take, 1, 0),
        )

    outs, _ = scan(view.waiting, step, (start, ops.not_(allowed), running0), width=2 if granting else None)
    return (outs[0], outs[1]) if granting else (outs, None)


def _select(ops: Ops, cond: BoolLike, then: Any, other: Any) -> Any:
    """``ops.ite`` lifted to (nested) tuples, so accumulators may be tuples."""
    if isinstance(then, tuple):
        return tuple(_select(ops, cond, a, b) for a, b in zip(then, other))
    return ops.ite(cond, then, other)


@runtime_checkable
class Projected(Protocol):
    """A request's projected future, as :func:`fcfs_admit_projected` reads it."""

    @property
    def f(self) -> IntLike:
        """Slots until the request finishes, this one counted."""

    @property
    def present(self) -> BoolLike:
        """Whether the entry holds a request (an empty slot of a symbolic view projects nothing)."""

    def held_at(self, view: View, tau: IntLike, ops: Ops) -> IntLike:
        """Memory it holds ``tau ≥ 1`` slots from now (0 once finished, or for an empty slot)."""


def fcfs_admit_projected(
    view: View, ops: Ops, project: Callable[[IntLike, IntLike, IntLike, BoolLike], Projected]
) -> tuple[BoolLike, ...]:
    """FCFS admission that keeps the projected memory within ``M`` at every future slot.

    ``project(s, o, progress, present)`` projects one request (an active one
    at its progress, a waiting one at 0).  Walk the queue in order
    (:func:`fcfs_admit`): the head ``w`` is admitted while the projected total
    of the active requests, the ones admitted so far and ``w`` itself, checked
    at the finish slot ``f`` of every one of them, stays ``≤ M``.  A projection
    that grows until its finish slot and is 0 after it makes a total of them
    largest at one of their finish slots, so this bounds every future slot
    (``docs/proofs.md``).  The accumulator holds the totals at the active
    requests' finish slots and which queued requests were admitted.
    """
    hook = getattr(type(view.waiting), "__kvstab_projected__", None)
    if hook is not None:
        return hook(view.waiting, view, ops, project)  # type: ignore[no-any-return]
    act = [project(a.s, a.o, a.progress, a.present) for a in view.active]
    # totals[k]: projected memory at the finish slot of act[k]
    totals = tuple(ops.sum(q.held_at(view, k.f, ops) for q in act) for k in act)
    cands = [project(w.s, w.o, 0, w.present) for w in view.waiting]
    index = {id(w): j for j, w in enumerate(view.waiting)}
    # the accumulator: (totals at the active finish slots, admitted flags of the queue)
    start: tuple[Any, ...] = (totals, tuple(False for _ in cands))

    def fits(w: WaitingEntry, acc: tuple[Any, ...]) -> tuple[BoolLike, tuple[Any, ...]]:
        tot_act, incl = acc
        j = index[id(w)]
        c = cands[j]
        # the candidate's own memory at every active finish slot
        new_act = tuple(t + c.held_at(view, k.f, ops) for t, k in zip(tot_act, act))
        earlier = list(zip(incl[:j], cands[:j]))
        # the total at the candidate's own finish slot: everyone admitted, itself too
        at_own = (
            ops.sum(q.held_at(view, c.f, ops) for q in act)
            + ops.sum(ops.ite(flag, ci.held_at(view, c.f, ops), 0) for flag, ci in earlier)
            + c.held_at(view, c.f, ops)
        )
        # the totals at the finish slots of earlier admitted candidates, with c added
        ok_cands = [
            ops.or_(
                ops.not_(flag),
                ops.le(
                    ops.sum(q.held_at(view, ci.f, ops) for q in act)
                    + ops.sum(ops.ite(fl2, cj.held_at(view, ci.f, ops), 0) for fl2, cj in earlier)
                    + c.held_at(view, ci.f, ops),
                    view.M,
                ),
            )
            for flag, ci in earlier
        ]
        ok = ops.and_(c.present, ops.le(at_own, view.M), *[ops.le(t, view.M) for t in new_act], *ok_cands)
        return ok, (new_act, tuple(True if i == j else f for i, f in enumerate(incl)))

    return fcfs_admit(view, ops, fits, start)


def check_decision_shape(decision: object, view: View, who: str) -> Decision:
    """Raise :class:`InvalidScheduler` unless ``decision`` has the contract's shape."""
    if not isinstance(decision, Decision):
        raise InvalidScheduler(f"scheduler {who!r} returned {type(decision).__name__}, expected kvstab.Decision")
    if len(decision.admit) != len(view.waiting):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.admit has {len(decision.admit)} entries, the view has "
            f"{len(view.waiting)} waiting requests"
        )
    if len(decision.preempt) != len(view.active):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.preempt has {len(decision.preempt)} entries, the view has "
            f"{len(view.active)} active requests"
        )
    if decision.state is not None and (not isinstance(decision.state, tuple) or len(decision.state) != len(view.state)):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.state must be None or a tuple of {len(view.state)} values "
            f"(one per declared state variable), got {decision.state!r}"
        )
    if decision.grants is not None and len(decision.grants) != len(view.active) + len(view.waiting):
        raise InvalidScheduler(
            f"scheduler {who!r}: decision.grants has {len(decision.grants)} entries, expected "
            f"{len(view.active) + len(view.waiting)} (active, then waiting)"
        )
    return decision


def _bad_grant(g: object) -> str | None:
    """What is wrong with ``g`` as a concrete grant (an integer ``≥ 0``), or ``None``."""
    if isinstance(g, HiddenOutput):
        g._read()
    if isinstance(g, bool) or not isinstance(g, numbers.Integral):
        if isinstance(g, float) and math.isnan(g):
            return "NaN"
        return f"{g!r} ({type(g).__name__}), not an integer"
    if g < 0:
        return f"{int(g)}, negative"
    return None


def check_decision_values(decision: Decision, who: str) -> Decision:
    """Raise :class:`InvalidScheduler` unless a *concrete* decision holds
    booleans in ``admit``/``preempt`` and integers ``≥ 0`` in ``grants``
    (an engine calls it after :func:`check_decision_shape`; symbolic
    decisions hold z3 terms and are not checked here)."""
    for name, vals in (("admit", decision.admit), ("preempt", decision.preempt)):
        for v in vals:
            if type(v) is bool:  # the common case, first: this runs every slot
                continue
            if isinstance(v, HiddenOutput):
                v._read()
            if not isinstance(v, (bool, np.bool_)):
                raise InvalidScheduler(f"scheduler {who!r}: decision.{name} must hold booleans, got {v!r}")
    if decision.grants is not None:
        for i, g in enumerate(decision.grants):
            if type(g) is int and g >= 0:
                continue
            bad = _bad_grant(g)
            if bad is not None:
                raise InvalidScheduler(
                    f"scheduler {who!r}: decision.grants[{i}] is {bad}; a grant is an integer >= 0 tokens"
                )
    return decision


def check_scheduler_shape(obj: Any) -> str | None:
    """What is wrong with ``obj`` as a scheduler, or ``None`` if it fits the contract."""
    for attr in ("name", "description"):
        val = getattr(obj, attr, None)
        if not isinstance(val, str) or not val.strip():
            return f"it needs a non-empty string attribute {attr!r}"
    try:
        traits_of(obj)
        state_vars_of(obj)
    except InvalidScheduler as exc:
        return str(exc).split(": ", 1)[-1]
    decide = getattr(obj, "decide", None)
    if not callable(decide):
        return "it needs a method decide(view, ops) -> Decision"
    try:
        sig = inspect.signature(decide)
    except (TypeError, ValueError):
        return None
    params = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    has_var = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(params) != 2 and not has_var:
        names = ", ".join(p.name for p in params) or "nothing"
        return f"decide must take exactly (view, ops), it takes ({names})"
    return None


def as_sequence(xs: Sequence[Any]) -> tuple[Any, ...]:
    """A tuple of ``xs`` (decisions may be given as lists)."""
    return tuple(xs)
