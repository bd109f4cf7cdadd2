"""Replay a concrete workload (and optionally a starting state) slot by slot, and
build the one-line command that does it.

Every counterexample kvstab reports — a z3 refutation, a shrunk Hypothesis
failure — comes with such a command, so that a reader can re-run it and watch
the violation happen slot by slot.  The replay runs on the reference simulator,
or (``engine="fast"``/``"auto"``) on the compiled fast engine where that gives
the same records: a built-in with a compiled path, no starting state, no
``decide_timeout``.  The fast engine's per-slot counts then name the requests
as the reference does, because every compiled rule admits a prefix of the queue
and preempts a suffix of the admission order (``docs/engine.md``).
"""

from __future__ import annotations

import shlex
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvstab.arrivals import MAX_ARRIVAL_SLOT, ArrivalPlan, fixed_arrivals
from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import DEFAULT_WINDOW, Engine, SimResult, SlotRecord
from kvstab.validation import MAX_TOKENS, as_int

__all__ = ["ReplayOutcome", "replay", "replay_command", "parse_requests", "parse_state", "ReplayEngine"]

ReplayEngine = Literal["auto", "fast", "reference"]

#: the fast engine replays plans whose arrivals and drain fit in this many slots (its own
#: horizon); a plan reaching further (an idle gap of 10¹¹ slots costs the reference nothing) is
#: replayed on the reference engine
FAST_SPAN = 10_000_000


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What a replay did: the slot records, the violation it hit (if any), how
    many requests had not arrived or not finished when it stopped, and in how
    many slots the queue window hid waiting requests from the rule."""

    records: tuple[SlotRecord, ...]
    violation: InvariantViolation | None
    pending: int = 0
    window: int = DEFAULT_WINDOW
    window_hid_slots: int = 0
    engine: str = "reference"  # "fast" (the compiled engine) or "reference"
    engine_reason: str = ""


def _rows(text: str, names: tuple[str, ...], what: str) -> list[tuple[int, ...]]:
    """``"a:b:c,a:b:c"`` → integer tuples, each field validated (one line on error)."""
    out: list[tuple[int, ...]] = []
    if not text.strip():
        return out
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != len(names):
            raise InvalidArgument(
                f"{what} item {item.strip()!r} must have {len(names)} ':'-separated integers ({':'.join(names)})"
            )
        row = []
        for name, part in zip(names, parts):
            least = 0 if name in ("SLOT", "PROGRESS") else 1
            top = MAX_ARRIVAL_SLOT if name == "SLOT" else MAX_TOKENS
            try:
                row.append(as_int(name, part, minimum=least, maximum=top))
            except InvalidArgument as exc:
                raise InvalidArgument(f"{what} item {item.strip()!r}: {exc}") from None
        out.append(tuple(row))
    return out


def parse_requests(text: str) -> ArrivalPlan:
    """``"SLOT:S:O,SLOT:S:O,…"`` → an arrival plan (slots ≥ 0, lengths ≥ 1)."""
    rows = _rows(text, ("SLOT", "S", "O"), "--requests")
    return fixed_arrivals([(r[0], r[1], r[2]) for r in rows])


def parse_state(active: str, waiting: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """``"S:O:P,…"`` and ``"S:O,…"`` → a starting state."""
    act = [(r[0], r[1], r[2]) for r in _rows(active, ("S", "O", "PROGRESS"), "--active")]
    wait = [(r[0], r[1]) for r in _rows(waiting, ("S", "O"), "--waiting")]
    return act, wait


def replay(
    scheduler: str | Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    *,
    active: list[tuple[int, int, int]] | None = None,
    waiting: list[tuple[int, int]] | None = None,
    slots: int | None = None,
    max_slots: int = 100_000,
    window: int = DEFAULT_WINDOW,
    spec: str | None = None,
    decide_timeout: float | None = None,
    engine: ReplayEngine = "reference",
) -> ReplayOutcome:
    """Run ``plan`` (from ``active``/``waiting`` if given) until it drains, the
    slot limit, or the first invariant violation (``max_slots`` slots simulated,
    idle gaps skipped).  ``scheduler`` is a spec (registered name or
    ``module:attr``) or a scheduler object (then ``spec`` names it in messages).
    ``engine``: ``"reference"`` (the simulator), ``"fast"`` (the compiled engine;
    refused where it cannot give the reference's records) or ``"auto"`` (fast
    where it can); the outcome says which ran and why."""
    if engine not in ("auto", "fast", "reference"):
        raise InvalidArgument(f"engine must be 'auto', 'fast' or 'reference', got {engine!r}")
    sched = load_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
    name = scheduler if isinstance(scheduler, str) else spec
    why = "asked for"
    if engine != "reference":
        why = _no_fast_replay(sched, plan, slots, active, waiting, decide_timeout)
        if not why:
            out = _fast_replay(sched, params, plan, slots, max_slots, window)
            if out is not None:
                return out
            why = f"the plan does not drain within the fast engine's {FAST_SPAN} slots"
        if engine == "fast":
            raise InvalidArgument(f"no fast replay for this run: {why}; use --engine reference (or auto)")
    eng = Engine(sched, params, window=window, spec=name, decide_timeout=decide_timeout)
    if active or waiting:
        eng.load_state(list(active or []), list(waiting or []))
    fed = 0
    try:
        fed = eng.run(plan, slots, drain=slots is None, skip_idle=True, max_slots=max_slots)
    except InvariantViolation as exc:
        return ReplayOutcome(tuple(eng.records), exc, 0, eng.window, eng.window_hid_slots, "reference", why)
    unfinished = sum(1 for r in eng.requests if r.finish < 0)
    pending = (len(plan) - fed) + unfinished if slots is None else 0
    return ReplayOutcome(tuple(eng.records), None, pending, eng.window, eng.window_hid_slots, "reference", why)


def _no_fast_replay(
    sched: Scheduler,
    plan: ArrivalPlan,
    slots: int | None,
    active: list[tuple[int, int, int]] | None,
    waiting: list[tuple[int, int]] | None,
    decide_timeout: float | None,
) -> str:
    """Why the fast engine cannot give this replay's records ("" if it can)."""
    from kvstab.engine import fast_rule

    if fast_rule(sched) is None:
        return "the scheduler has no compiled fast path (plug-ins replay on the reference engine)"
    if active or waiting:
        return "the fast engine starts from the empty system (--active/--waiting need the reference engine)"
    if decide_timeout is not None:
        return "--decide-timeout limits calls of the rule's decide, which only the reference engine makes"
    if len(plan) and int(plan.slot[-1]) >= FAST_SPAN:
        return f"arrivals reach slot {int(plan.slot[-1])}, past the fast engine's {FAST_SPAN} slots"
    if slots is not None and slots > FAST_SPAN:
        return f"--slots {slots} is past the fast engine's {FAST_SPAN} slots"
    return ""


def _fast_replay(
    sched: Scheduler, params: ModelParams, plan: ArrivalPlan, slots: int | None, max_slots: int, window: int
) -> ReplayOutcome | None:
    """The replay on the compiled engine (``None`` if the plan does not drain within its span).

    A violation is found by the checked run and its slot's row by an unchecked run to that
    slot (the engines agree past a violation too); the records are then built from the rows."""
    from kvstab.engine import run

    why = "compiled fast path of a built-in rule"
    violation: InvariantViolation | None = None
    try:
        try:
            res = run(
                sched, params, plan, slots, drain=slots is None, window=window, engine="fast", max_slots=FAST_SPAN
            ).result
        except InvariantViolation as exc:
            violation = exc
            res = run(sched, params, plan, exc.slot + 1, check=False, window=window, engine="fast").result
    except InvalidArgument as exc:
        if "did not drain" in str(exc):
            return None
        raise
    assert res is not None
    return _records(res, plan, window, max_slots, slots is None, violation, why)


def _records(
    res: SimResult,
    plan: ArrivalPlan,
    window: int,
    max_slots: int,
    drained: bool,
    violation: InvariantViolation | None,
    why: str,
) -> ReplayOutcome:
    """The reference engine's records of ``res`` (a run of a head-of-line rule that preempts the
    newest): the slots it would simulate (not the idle ones, at most ``max_slots``), each naming
    the requests admitted (the queue's first ``admitted``), preempted (the newest ``preempted``,
    oldest first; back to the queue head) and completed (those whose finish is the slot, in
    running order), and the slots in which the queue window hid waiting requests."""
    T = res.slots if violation is None else violation.slot + 1
    after = res.running[:T] - res.completed[:T]  # active at the end of each slot
    idle_start = np.ones(T, dtype=bool)  # nothing waits or runs at the start of the slot
    idle_start[1:] = (res.queue[: T - 1] == 0) & (after[: T - 1] == 0)
    stepped = np.flatnonzero(~idle_start | (res.arrived[:T] > 0))
    queue: deque[int] = deque()
    active: list[int] = []
    records: list[SlotRecord] = []
    hid = 0
    fed = 0
    for t in stepped[:max_slots].tolist():
        while fed < len(plan) and int(plan.slot[fed]) <= t:
            queue.append(fed)
            fed += 1
        n_adm, n_pre = int(res.admitted[t]), int(res.preempted[t])
        waiting = len(queue)  # what the rule's decision sees
        shown = min(window, waiting)  # the window doubles while the rule admits all it sees
        while 0 < shown < waiting and n_adm >= shown:
            shown = min(2 * shown, waiting)
        hid += shown < waiting
        victims = active[len(active) - n_pre :] if n_pre else []
        del active[len(active) - n_pre :]
        admitted = [queue.popleft() for _ in range(n_adm)]
        queue.extendleft(reversed(victims))
        running = active + admitted
        done = [r for r in running if res.finish[r] == t]
        active = [r for r in running if res.finish[r] != t]
        assert len(running) == res.running[t] and len(done) == res.completed[t] and len(queue) == res.queue[t], t
        rec = SlotRecord(
            slot=t,
            arrived=int(res.arrived[t]),
            admitted=tuple(admitted),
            preempted=tuple(victims),
            completed=tuple(done),
            running=len(running),
            memory=int(res.memory[t]),
            wasted=int(res.wasted[t]),
            tokens=int(res.tokens[t]),
            queue=len(queue),
            active_after=len(active),
            hidden=waiting - shown,
        )
        if violation is not None and t == violation.slot:
            exc = InvariantViolation(
                str(violation), slot=violation.slot, memory=violation.memory, capacity=violation.capacity,
                requests=violation.requests, record=rec,
            )  # fmt: skip
            return ReplayOutcome(tuple(records), exc, 0, window, hid, "fast", why)
        records.append(rec)
    pending = 0
    if drained:
        last = records[-1].slot if records else -1
        pending = (len(plan) - fed) + int(((res.finish[:fed] < 0) | (res.finish[:fed] > last)).sum())
    return ReplayOutcome(tuple(records), None, pending, window, hid, "fast", why)


def replay_command(
    scheduler: str,
    params: ModelParams,
    plan: ArrivalPlan | list[tuple[int, int, int]],
    *,
    active: list[tuple[int, int, int]] | None = None,
    waiting: list[tuple[int, int]] | None = None,
    window: int = DEFAULT_WINDOW,
    command: str = "replay",
) -> str:
    """The one-line ``kvstab replay …`` command for this workload
    (``command="check"``: the same flags for ``kvstab check``).  ``--window``
    is written when it differs from the default (8)."""
    if isinstance(plan, ArrivalPlan):
        rows = [(int(a), int(b), int(c)) for a, b, c in zip(plan.slot, plan.s, plan.o)]
    else:
        rows = list(plan)
    parts = ["kvstab", command, "--scheduler", scheduler, "--M", str(params.M), "--chunk", str(params.chunk)]
    if params.block != 1:
        parts += ["--block", str(params.block)]
    if params.max_num_seqs is not None:
        parts += ["--max-num-seqs", str(params.max_num_seqs)]
    if params.token_budget is not None:
        parts += ["--token-budget", str(params.token_budget)]
    if window != DEFAULT_WINDOW:
        parts += ["--window", str(window)]
    parts += ["--requests", ",".join(f"{a}:{b}:{c}" for a, b, c in rows)]
    if active:
        parts += ["--active", ",".join(f"{s}:{o}:{p}" for s, o, p in active)]
    if waiting:
        parts += ["--waiting", ",".join(f"{s}:{o}" for s, o in waiting)]
    return " ".join(shlex.quote(p) for p in parts)
