"""What a scheduler sees and returns: the :class:`View` in, the :class:`Decision` out.

Also the :class:`Scheduler` protocol that holds the rule, and the view a rule
is actually shown (:func:`visible_view`): a rule that declares
``clairvoyant=False`` gets a :class:`HiddenOutput` in place of every ``o``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, runtime_checkable

from kvstab.contract.traits import Traits
from kvstab.errors import InvalidScheduler
from kvstab.ops import BoolLike, IntLike, Ops

if TYPE_CHECKING:
    from kvstab.model import ModelParams

__all__ = [
    "ActiveEntry",
    "WaitingEntry",
    "View",
    "Decision",
    "DecideFn",
    "Scheduler",
    "HiddenOutput",
    "hidden_output",
    "visible_view",
]


#: what ``prior`` means on a view entry (one text for both kinds of entry)
PRIOR_HELP = (
    "output tokens produced before a preemption and kept: a lifecycle that resumes a victim by "
    "recomputing its prompt and outputs (vLLM, SGLang) folds them into s and o as s + prior, o - prior; "
    "0 under kvstab's restart-from-scratch lifecycle"
)

#: what ``shared`` means on a view entry (prefix caching, docs/MODEL.md "Prefix caching")
SHARED_HELP = (
    "tokens of this request's KV blocks that requests ahead of it (active requests, oldest admission first, "
    "then the waiting entries before it) already hold: they add no memory, so the entry is shown with them "
    "taken off its s and its progress (or cached), a multiple of B; 0 without prefix caching"
)


@dataclass(frozen=True, slots=True)
class _Entry:
    """The fields every entry of a view starts with: which request, and its lengths."""

    rid: IntLike = field(metadata={"help": "request id (arrival order)"})
    s: IntLike = field(metadata={"help": "prompt length"})
    o: IntLike = field(metadata={"help": "output length (a non-clairvoyant policy must not read it)"})


@dataclass(frozen=True, slots=True)
class ActiveEntry(_Entry):
    """An active (admitted, unfinished) request as a scheduler sees it."""

    progress: IntLike = field(metadata={"help": "tokens processed so far, 0 < progress < s + o"})
    present: BoolLike = field(default=True, metadata={"help": "whether this slot holds a request"})
    prior: IntLike = field(default=0, metadata={"help": PRIOR_HELP})
    shared: IntLike = field(default=0, metadata={"help": SHARED_HELP})


@dataclass(frozen=True, slots=True)
class WaitingEntry(_Entry):
    """A waiting request (never admitted, or preempted and reset to progress 0)."""

    present: BoolLike = field(default=True, metadata={"help": "whether this slot holds a request"})
    prior: IntLike = field(default=0, metadata={"help": PRIOR_HELP})
    cached: IntLike = field(
        default=0,
        metadata={
            "help": "prompt tokens whose KV the prefix cache already has (whole blocks, at most s - 1): admitted, "
            "the request starts at this progress, so its first grant computes s - cached tokens at most; they "
            "count against M like any held token (0 without prefix caching)"
        },
    )
    shared: IntLike = field(default=0, metadata={"help": SHARED_HELP})


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

    @classmethod
    def under(
        cls,
        params: ModelParams,
        active: tuple[ActiveEntry, ...],
        waiting: tuple[WaitingEntry, ...],
        n_waiting: IntLike,
        state: tuple[Any, ...] = (),
    ) -> View:
        """The view of these entries on ``params``'s server: the one place a concrete engine copies
        the server object's limits (``M``, ``ŝ``, ``B``, token budget, ``max_num_seqs``) into a view."""
        return cls(
            active, waiting, params.M, params.chunk, params.block, params.token_budget, params.max_num_seqs,
            n_waiting, state,
        )  # fmt: skip


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
            ActiveEntry(a.rid, a.s, hidden_output(who, a.rid), a.progress, a.present, a.prior, a.shared)
            for a in view.active
        ),
        waiting=tuple(
            WaitingEntry(w.rid, w.s, hidden_output(who, w.rid), w.present, w.prior, w.cached, w.shared)
            for w in view.waiting
        ),
        M=view.M,
        chunk=view.chunk,
        block=view.block,
        token_budget=view.token_budget,
        max_num_seqs=view.max_num_seqs,
        n_waiting=view.n_waiting,
        state=view.state,
    )
