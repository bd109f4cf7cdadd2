"""Plug-in rules on a faster path: the rule traced once per view shape, run as straight-line code.

A rule written against :class:`kvstab.ops.Ops` may not branch on the values
it reads (the contract; z3 could not run it otherwise), so for a given *shape*
of view — how many active entries, how many waiting entries shown, and the
server's fixed parameters — it computes one fixed expression of the values.
:class:`TracingOps` runs the rule once on placeholder values and records that
expression as Python source, one assignment per operation; the source is
compiled and cached per shape, and every later slot with that shape calls the
compiled function on plain lists of ``s``, ``o`` and progress instead of
building a :class:`~kvstab.contract.View` and dispatching every operation
through ``ops``.

Soundness: the traced function performs the same operations as
:data:`kvstab.ops.CONCRETE` on the same inputs (``ConcreteOps``' own
semantics: ``all``/``any`` for the connectives, floor and ceiling division as
there), so its decision is the rule's decision.  A rule that does anything
else with a value — converts it to ``bool``/``int``, indexes with it, hashes
it, calls a non-ops function on it — raises :class:`Untraceable` while being
traced, and the run falls back to the reference engine (the :class:`Run` says
so).  Everything else of the slot (preemption, admission, work, invariant
checks) is the reference engine's own code: :class:`PluginEngine` overrides
only how the decision is computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import ActiveEntry, Decision, Scheduler, View, WaitingEntry, check_decision_shape, traits_of
from kvstab.errors import InvalidArgument, InvalidScheduler
from kvstab.model import ModelParams
from kvstab.simulator import Engine, SimResult

__all__ = ["plugin_path", "PluginPath", "PluginEngine", "TracingOps", "Untraceable", "trace_rule"]


class Untraceable(Exception):
    """The rule did something with a value that a fixed expression cannot record."""


class _Node:
    """A value of the traced rule: the name of a local of the generated code."""

    __slots__ = ("name", "tracer")

    def __init__(self, name: str, tracer: TracingOps) -> None:
        self.name = name
        self.tracer = tracer

    def _bin(self, other: Any, op: str, swap: bool = False) -> _Node:
        a, b = self.name, self.tracer.term(other)
        return self.tracer.emit(f"{b} {op} {a}" if swap else f"{a} {op} {b}")

    def __add__(self, o: Any) -> _Node:
        return self._bin(o, "+")

    def __radd__(self, o: Any) -> _Node:
        return self._bin(o, "+", True)

    def __sub__(self, o: Any) -> _Node:
        return self._bin(o, "-")

    def __rsub__(self, o: Any) -> _Node:
        return self._bin(o, "-", True)

    def __mul__(self, o: Any) -> _Node:
        return self._bin(o, "*")

    def __rmul__(self, o: Any) -> _Node:
        return self._bin(o, "*", True)

    def __floordiv__(self, o: Any) -> _Node:
        return self._bin(o, "//")

    def __rfloordiv__(self, o: Any) -> _Node:
        return self._bin(o, "//", True)

    def __mod__(self, o: Any) -> _Node:
        return self._bin(o, "%")

    def __neg__(self) -> _Node:
        return self.tracer.emit(f"-{self.name}")

    def __lt__(self, o: Any) -> _Node:
        return self._bin(o, "<")

    def __le__(self, o: Any) -> _Node:
        return self._bin(o, "<=")

    def __gt__(self, o: Any) -> _Node:
        return self._bin(o, ">")

    def __ge__(self, o: Any) -> _Node:
        return self._bin(o, ">=")

    def __eq__(self, o: Any) -> _Node:  # type: ignore[override]
        return self._bin(o, "==")

    def __ne__(self, o: Any) -> _Node:  # type: ignore[override]
        return self._bin(o, "!=")

    def _refuse(self, *_: Any) -> Any:
        raise Untraceable(f"the rule used a value with Python control flow or conversion ({self.name})")

    __bool__ = __index__ = __int__ = __float__ = __hash__ = __iter__ = __len__ = _refuse  # type: ignore[assignment]


class TracingOps:
    """The ops interface recording straight-line Python (``ConcreteOps``' semantics)."""

    symbolic = False  # engines build concrete views for it; rules must not look

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._n = 0

    def emit(self, expr: str) -> _Node:
        self._n += 1
        name = f"v{self._n}"
        self.lines.append(f"    {name} = {expr}")
        return _Node(name, self)

    def term(self, x: Any) -> str:
        if isinstance(x, _Node):
            if x.tracer is not self:
                raise Untraceable("a value from another trace")
            return x.name
        if isinstance(x, (bool, np.bool_)):
            return "True" if x else "False"
        if isinstance(x, (int, np.integer)):
            return str(int(x))
        raise Untraceable(f"the rule combined a value with {type(x).__name__} {x!r}")

    def _all(self, xs: Iterable[Any]) -> list[str]:
        return [self.term(x) for x in xs]

    def const(self, value: int) -> Any:
        return int(value)

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(cond, (bool, np.bool_)):  # decided by the shape alone
            return then if cond else other
        if isinstance(then, tuple) or isinstance(other, tuple):
            raise Untraceable("ite on tuples")
        return self.emit(f"{self.term(then)} if {self.term(cond)} else {self.term(other)}")

    def min(self, *xs: Any) -> Any:
        return self.emit(f"min({', '.join(self._all(xs))},)") if any(isinstance(x, _Node) for x in xs) else min(xs)

    def max(self, *xs: Any) -> Any:
        return self.emit(f"max({', '.join(self._all(xs))},)") if any(isinstance(x, _Node) for x in xs) else max(xs)

    def and_(self, *xs: Any) -> Any:
        if not any(isinstance(x, _Node) for x in xs):
            return all(xs)
        return self.emit(f"all(({', '.join(self._all(xs))},))")

    def or_(self, *xs: Any) -> Any:
        if not any(isinstance(x, _Node) for x in xs):
            return any(xs)
        return self.emit(f"any(({', '.join(self._all(xs))},))")

    def not_(self, x: Any) -> Any:
        return self.emit(f"not {x.name}") if isinstance(x, _Node) else (not x)

    def sum(self, xs: Iterable[Any]) -> Any:
        items = list(xs)
        if not any(isinstance(x, _Node) for x in items):
            return sum(items)
        return self.emit(f"sum(({', '.join(self._all(items))},))")

    def lt(self, a: Any, b: Any) -> Any:
        return self._cmp(a, b, "<")

    def le(self, a: Any, b: Any) -> Any:
        return self._cmp(a, b, "<=")

    def eq(self, a: Any, b: Any) -> Any:
        return self._cmp(a, b, "==")

    def _cmp(self, a: Any, b: Any, op: str) -> Any:
        if not isinstance(a, _Node) and not isinstance(b, _Node):
            return {"<": a < b, "<=": a <= b, "==": a == b}[op]
        return self.emit(f"{self.term(a)} {op} {self.term(b)}")

    def div(self, a: Any, b: Any) -> Any:
        if not isinstance(a, _Node) and not isinstance(b, _Node):
            return a // b
        return self.emit(f"{self.term(a)} // {self.term(b)}")

    def ceil_div(self, a: Any, b: Any) -> Any:
        if not isinstance(a, _Node) and not isinstance(b, _Node):
            return -(-a // b)
        return self.emit(f"-(-{self.term(a)} // {self.term(b)})")

    def count(self, xs: Iterable[Any]) -> Any:
        items = list(xs)
        if not any(isinstance(x, _Node) for x in items):
            return sum(1 for x in items if x)
        return self.emit(f"sum(1 for x in ({', '.join(self._all(items))},) if x)")


#: a compiled decision: (s, o, progress of the actives; s, o of the waiting; n_waiting)
#: -> (admit flags, preempt flags, grants or None)
Compiled = Callable[..., tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...] | None]]


def trace_rule(scheduler: Scheduler, params: ModelParams, K: int, Q: int) -> Compiled:
    """The rule's decision for views of ``K`` active and ``Q`` shown waiting
    entries, as a compiled function; raises :class:`Untraceable`."""
    tr = TracingOps()
    leaf = lambda name: _Node(name, tr)  # noqa: E731
    view = View(
        active=tuple(
            ActiveEntry(leaf(f"ar[{i}]"), leaf(f"as_[{i}]"), leaf(f"ao[{i}]"), leaf(f"ap[{i}]")) for i in range(K)
        ),
        waiting=tuple(WaitingEntry(leaf(f"wr[{j}]"), leaf(f"ws[{j}]"), leaf(f"wo[{j}]")) for j in range(Q)),
        M=params.M,
        chunk=params.chunk,
        block=params.block,
        token_budget=params.token_budget,
        max_num_seqs=params.max_num_seqs,
        n_waiting=leaf("nw"),
    )
    try:
        decision = scheduler.decide(view, tr)  # type: ignore[arg-type]
    except Untraceable:
        raise
    except InvalidScheduler:
        raise
    except Exception as exc:
        raise Untraceable(f"{type(exc).__name__}: {exc}") from None
    decision = check_decision_shape(decision, view, scheduler.name)
    parts = [
        "(" + "".join(f"{tr.term(x)}, " for x in decision.admit) + ")",
        "(" + "".join(f"{tr.term(x)}, " for x in decision.preempt) + ")",
        "None" if decision.grants is None else "(" + "".join(f"{tr.term(x)}, " for x in decision.grants) + ")",
    ]
    src = "def decide(ar, as_, ao, ap, wr, ws, wo, nw):\n" + "\n".join(tr.lines) + f"\n    return {', '.join(parts)}\n"
    env: dict[str, Any] = {}
    exec(compile(src, f"<kvstab trace of {scheduler.name} K={K} Q={Q}>", "exec"), env)  # noqa: S102
    return env["decide"]  # type: ignore[no-any-return]


#: traces shared by runs (a sweep runs one rule at many rates): (scheduler, params, K, Q) -> code
_TRACES: dict[tuple[Any, ModelParams, int, int], Compiled] = {}
_TRACES_MAX = 20_000


def _traced(scheduler: Scheduler, params: ModelParams, K: int, Q: int) -> Compiled:
    """:func:`trace_rule`, cached across runs when the scheduler is hashable (frozen dataclasses are)."""
    try:
        key = (scheduler, params, K, Q)
        hit = _TRACES.get(key)
    except TypeError:  # an unhashable scheduler: trace per engine only
        return trace_rule(scheduler, params, K, Q)
    if hit is None:
        if len(_TRACES) >= _TRACES_MAX:
            _TRACES.clear()
        hit = _TRACES[key] = trace_rule(scheduler, params, K, Q)
    return hit


class PluginEngine(Engine):
    """The reference engine with the decision computed by the traced rule
    (one compiled function per view shape, cached)."""

    def __init__(self, scheduler: Scheduler, params: ModelParams, *, check: bool = True, window: int = 8) -> None:
        super().__init__(scheduler, params, check=check, window=window)
        self._compiled: dict[tuple[int, int], Compiled] = {}

    def _decision(self, K: int, Q: int) -> Decision:
        fn = self._compiled.get((K, Q))
        if fn is None:
            fn = self._compiled[(K, Q)] = _traced(self.scheduler, self.params, K, Q)
        act = self.active
        head = [self.waiting[i] for i in range(Q)]
        admit, preempt, grants = fn(
            [r.rid for r in act], [r.s for r in act], [r.o for r in act], [r.progress for r in act],
            [r.rid for r in head], [r.s for r in head], [r.o for r in head], len(self.waiting),
        )  # fmt: skip
        return Decision(admit=admit, preempt=preempt, grants=grants)

    def decide(self) -> tuple[View, Decision]:
        """The window-widening loop of :meth:`Engine.decide`, on the compiled rule."""
        w = self.window
        while True:
            Q = min(w, len(self.waiting))
            decision = self._decision(len(self.active), Q)
            for name, vals in (("admit", decision.admit), ("preempt", decision.preempt)):
                for v in vals:
                    if not isinstance(v, (bool, np.bool_)):
                        raise InvalidScheduler(
                            f"scheduler {self.scheduler.name!r}: decision.{name} must hold booleans, got {v!r}"
                        )
            if Q < len(self.waiting) and Q > 0 and all(decision.admit):
                w *= 2
                continue
            return _WindowView(Q), decision  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _WindowView:
    """What :meth:`Engine.step` reads of the view: how many waiting entries were shown."""

    shown: int

    @property
    def waiting(self) -> range:
        return range(self.shown)


@dataclass(frozen=True, slots=True)
class PluginPath:
    """A plug-in rule's faster path (see the module docstring)."""

    scheduler: Scheduler

    def simulate(
        self,
        params: ModelParams,
        plan: ArrivalPlan,
        slots: int | None,
        *,
        drain: bool,
        check: bool,
        window: int,
        max_slots: int,
        progress: Callable[[int, int | None], None] | None = None,
    ) -> SimResult:
        """:func:`kvstab.simulator.simulate` on :class:`PluginEngine` (same loop, same result)."""
        if slots is None and not drain:
            raise InvalidArgument("simulate needs a number of slots, or drain=True")
        plan = plan.fit_to(params)
        eng = PluginEngine(self.scheduler, params, check=check, window=window)
        n, i, t = len(plan), 0, 0
        arr_slot = plan.slot
        while True:
            if slots is not None and not drain and t >= slots:
                break
            if drain and i >= n and eng.idle and (slots is None or t >= slots):
                break
            if t >= max_slots:
                raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
            while i < n and arr_slot[i] == t:
                eng.arrive(int(plan.s[i]), int(plan.o[i]))
                i += 1
            eng.step()
            t += 1
            if progress is not None and t % 4096 == 0:
                progress(t, slots)
        return eng.result(dropped=plan.dropped)


def plugin_path(scheduler: Scheduler, lifecycle: str) -> tuple[PluginPath | None, str]:
    """The faster path for a plug-in rule, or ``None`` and the reason there is none.

    The rule is traced on a small view (2 active, 2 waiting entries) to find out
    early whether it is traceable at all; every other shape is traced when the
    run first meets it, and an untraceable shape there also falls back."""
    if lifecycle != "kvstab":
        return None, "the plug-in path runs kvstab's lifecycle only"
    try:
        traits_of(scheduler)
        trace_rule(scheduler, ModelParams(M=64, chunk=4), 2, 2)
    except (Untraceable, InvalidScheduler) as exc:
        return None, f"the rule cannot be traced ({exc})"
    return PluginPath(scheduler), "the rule traced to straight-line code once per view shape"
