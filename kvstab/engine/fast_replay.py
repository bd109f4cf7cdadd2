"""``kvstab replay`` on the fast engine: the reference simulator's records, from per-slot counts.

:func:`why_not_fast` says whether the compiled engine gives the reference's
records for a replay (a built-in with a compiled path, no starting state, no
``decide_timeout``, a plan within :data:`FAST_SPAN` slots); :func:`replay_fast`
runs it there (``kvstab replay --engine`` chooses; :func:`kvstab.replay.replay`
is the reference simulator's).  The compiled engine keeps counts per slot; the records name the requests
from them, because every compiled rule admits a prefix of the queue, preempts a
suffix of the admission order (victims back to the queue head, oldest first)
and completes a request once, in its finish slot (``docs/engine.md``, "Why the
shortcuts are exact"); the slots in which the queue window hid requests are
counted the way the reference widens it (doubling while the rule admits all it
sees).  ``tests/test_replay_engine.py`` holds every field to the reference's.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import Scheduler, state_vars_of
from kvstab.engine.driver import fast_rule, has_fast_path, run
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.replay import ReplayOutcome
from kvstab.simulator import SimResult, SlotRecord

__all__ = ["why_not_fast", "replay_fast", "FAST_SPAN"]

#: the fast engine replays plans whose arrivals and drain fit in this many slots: it records
#: every slot (~80 MB here), where the reference engine skips idle ones, so a plan reaching
#: further (an idle gap of 10¹¹ slots costs the reference nothing) replays on the reference
FAST_SPAN = 1_000_000


def why_not_fast(
    sched: Scheduler,
    plan: ArrivalPlan,
    slots: int | None,
    active: list[tuple[int, int, int]] | None,
    waiting: list[tuple[int, int]] | None,
    decide_timeout: float | None,
) -> str:
    """Why the fast engine cannot give this replay's records ("" if it can)."""
    if state_vars_of(sched) and has_fast_path(sched):
        # the records carry the rule's state after every slot; the compiled engine keeps it only as it goes
        return "a stateful rule: the records show its state after every slot, which only the reference engine keeps"
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


def replay_fast(
    sched: Scheduler, params: ModelParams, plan: ArrivalPlan, slots: int | None, max_slots: int, window: int
) -> ReplayOutcome | None:
    """The replay on the compiled engine (``None`` if the plan does not drain within its span).

    A violation is found by the checked run and its slot's row by an unchecked run to that
    slot (the engines agree past a violation too); the records are then built from the rows."""
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
