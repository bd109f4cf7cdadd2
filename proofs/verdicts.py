"""Verdicts are values, with three states.

* :class:`Proved` — every obligation came back ``unsat`` with satisfiable
  premises; it names the method and the assumptions the proof carries
  (bounds ``K``/``Q``, the concrete ``ŝ``/``B`` it fixed, …).
* :class:`Refuted` — ``sat``: a counterexample exists.  It carries the decoded
  :class:`Trace`, which has been replayed through the reference simulator.
* :class:`Unknown` — the solver ran out of budget (or a premise was vacuous):
  it keeps the query as an ``.smt2`` file.  ``Unknown`` never counts as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Proved",
    "Refuted",
    "Unknown",
    "Verdict",
    "Trace",
    "SlotState",
    "Obligation",
    "passed",
    "verdict_json",
]


@dataclass(frozen=True, slots=True)
class SlotState:
    """One slot of a decoded trace: the state the rule saw and what the slot charged."""

    slot: int
    active: tuple[tuple[int, int, int], ...]  # (s, o, progress) in admission order, at decision time
    waiting: tuple[tuple[int, int], ...]  # (s, o) in queue order, at decision time (arrivals included)
    arrivals: tuple[tuple[int, int], ...]  # (s, o) that arrived this slot
    admitted: tuple[int, ...]  # indices into ``waiting``
    preempted: tuple[int, ...]  # indices into ``active``
    memory: int  # Σ tokens held after this slot's work
    state: tuple[int | float, ...] = ()  # the scheduler's own state the rule saw (stateful rules)
    next_state: tuple[int | float, ...] = ()  # the state its decision gives (stateful rules)


@dataclass(frozen=True, slots=True)
class Trace:
    """A concrete counterexample decoded from a z3 model.

    ``kind`` is ``"reachable"`` (a run from the empty system, found by bounded
    model checking) or ``"cti"`` (a counterexample to induction: one step from
    a state that satisfies the candidate invariant but need not be reachable).
    ``replayed`` is set once the reference simulator reproduced the violation
    at ``violation_slot`` with the same memory.
    """

    kind: str
    M: int
    chunk: int
    block: int
    arrivals: tuple[tuple[int, int, int], ...]  # (slot, s, o), for a reachable trace
    initial_active: tuple[tuple[int, int, int], ...]  # (s, o, progress), for a CTI
    initial_waiting: tuple[tuple[int, int], ...]  # (s, o), for a CTI
    slots: tuple[SlotState, ...]
    violation_slot: int
    violation_memory: int
    replay_command: str
    replayed: bool
    replay_message: str = ""
    #: the scheduler's own state the run starts from (a stateful rule's CTI; a
    #: reachable trace starts from the declared initial state)
    initial_state: tuple[int | float, ...] = ()
    #: the state variable whose next value leaves its declared bounds, when
    #: that (and not memory) is the violation
    broken_state: str = ""

    def describe(self) -> str:
        """A few lines a reader can follow."""
        lines = [f"{self.kind} counterexample (M={self.M}, ŝ={self.chunk}, B={self.block}):"]
        for st in self.slots:
            state = f" state {list(st.state)} -> {list(st.next_state)}" if st.state else ""
            lines.append(
                f"  slot {st.slot}: active {list(st.active)} waiting {list(st.waiting)} "
                f"admit {list(st.admitted)} preempt {list(st.preempted)} -> memory {st.memory}{state}"
            )
        if self.broken_state:
            last = self.slots[-1]
            lines.append(
                f"  violation at slot {self.violation_slot}: state variable {self.broken_state!r} leaves its "
                f"declared bounds (next state {list(last.next_state)})"
            )
        else:
            lines.append(f"  violation at slot {self.violation_slot}: memory {self.violation_memory} > M={self.M}")
        lines.append(f"  simulator: {'reproduced' if self.replayed else 'NOT reproduced'} {self.replay_message}")
        lines.append(f"  replay: {self.replay_command}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "kind": self.kind,
            "M": self.M,
            "chunk": self.chunk,
            "block": self.block,
            "arrivals": [list(a) for a in self.arrivals],
            "initial_active": [list(a) for a in self.initial_active],
            "initial_waiting": [list(w) for w in self.initial_waiting],
            "slots": [
                {
                    "slot": st.slot,
                    "active": [list(a) for a in st.active],
                    "waiting": [list(w) for w in st.waiting],
                    "arrivals": [list(a) for a in st.arrivals],
                    "admitted": list(st.admitted),
                    "preempted": list(st.preempted),
                    "memory": st.memory,
                    "state": list(st.state),
                    "next_state": list(st.next_state),
                }
                for st in self.slots
            ],
            "violation_slot": self.violation_slot,
            "violation_memory": self.violation_memory,
            "replay_command": self.replay_command,
            "replayed": self.replayed,
            "initial_state": list(self.initial_state),
            "broken_state": self.broken_state,
        }


@dataclass(frozen=True, slots=True)
class Proved:
    """Every obligation was ``unsat`` over satisfiable premises."""

    method: str
    assumptions: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"Proved ({self.method})"


@dataclass(frozen=True, slots=True)
class Refuted:
    """A counterexample exists (``sat``); ``trace`` is decoded (and replayed when it
    is a memory violation).  ``trace`` is ``None`` only for obligations whose
    counterexample is not a run (an invariant conjunct that is not preserved)."""

    trace: Trace | None
    detail: str = ""

    def __str__(self) -> str:
        return f"Refuted ({self.trace.kind if self.trace else self.detail})"


@dataclass(frozen=True, slots=True)
class Unknown:
    """The solver could not decide (budget) or the premises were vacuous.
    ``smt2`` is the saved query.  Never a pass."""

    reason: str
    smt2: str | None = None

    def __str__(self) -> str:
        return f"Unknown ({self.reason})"


Verdict = Proved | Refuted | Unknown


def passed(v: Verdict) -> bool:
    """Only :class:`Proved` is a pass."""
    return isinstance(v, Proved)


@dataclass(frozen=True, slots=True)
class Obligation:
    """One solver query and its verdict: which check, which branch, which conjunct."""

    name: str
    verdict: Verdict
    seconds: float
    branch: str = ""
    conjunct: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """``name [branch] conjunct``."""
        parts = [self.name]
        if self.branch:
            parts.append(f"[{self.branch}]")
        if self.conjunct:
            parts.append(self.conjunct)
        return " ".join(parts)


def verdict_json(v: Verdict) -> dict[str, Any]:
    """A verdict as JSON-ready data: its kind, and its method and assumptions,
    its detail and trace, or its reason and saved query (``kvstab prove --json``
    and ``kvstab audit``'s report use this one form)."""
    out: dict[str, Any] = {"verdict": type(v).__name__}
    match v:
        case Proved():
            out.update(method=v.method, assumptions=list(v.assumptions))
        case Refuted():
            out.update(detail=v.detail, trace=v.trace.to_json() if v.trace else None)
        case Unknown():
            out.update(reason=v.reason, smt2=v.smt2)
    return out
