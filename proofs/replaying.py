"""Decode z3 models into concrete runs and replay them in the reference simulator.

A counterexample is only reported once the simulator (``kvstab/simulator.py``)
has reproduced it: the same violation, in the same slot, with the same
memory.  A model that does not reproduce means the encoding and the engine
disagree — :attr:`~kvstab.proofs.verdicts.Trace.replayed` is then ``False``
and the message says where they part.
"""

from __future__ import annotations

from collections.abc import Sequence

import z3

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import Scheduler
from kvstab.errors import InvariantViolation
from kvstab.proofs.encoding import Entry, Setting, StepTerms
from kvstab.proofs.verdicts import SlotState, Trace
from kvstab.replay import ReplayOutcome, replay, replay_command
from kvstab.simulator import Engine

__all__ = ["decode_int", "decode_slot", "replay_trace"]


def decode_int(m: z3.ModelRef, t: z3.ExprRef) -> int:
    """The value of integer term ``t`` in ``m`` (unconstrained terms take their default)."""
    return m.eval(t, model_completion=True).as_long()  # type: ignore[union-attr]


def _true(m: z3.ModelRef, b: z3.ExprRef) -> bool:
    return z3.is_true(m.eval(b, model_completion=True))


def decode_slot(m: z3.ModelRef, step: StepTerms, slot: int, arrivals: Sequence[Entry] = ()) -> SlotState:
    """The concrete state the rule saw in one encoded slot, its decision and its charge."""
    act_idx = [i for i, e in enumerate(step.pre.active) if _true(m, e.present)]
    wait_idx = [j for j, e in enumerate(step.pre.waiting) if _true(m, e.present)]
    active = tuple(
        (decode_int(m, step.pre.active[i].s), decode_int(m, step.pre.active[i].o), decode_int(m, step.pre.active[i].p))
        for i in act_idx
    )
    waiting = tuple((decode_int(m, step.pre.waiting[j].s), decode_int(m, step.pre.waiting[j].o)) for j in wait_idx)
    arr = tuple((decode_int(m, e.s), decode_int(m, e.o)) for e in arrivals if _true(m, e.present))
    return SlotState(
        slot=slot,
        active=active,
        waiting=waiting,
        arrivals=arr,
        admitted=tuple(k for k, j in enumerate(wait_idx) if _true(m, step.admit[j])),
        preempted=tuple(k for k, i in enumerate(act_idx) if _true(m, step.preempt[i])),
        memory=decode_int(m, step.charged),
    )


def _run(
    scheduler: Scheduler,
    spec: str | None,
    setting: Setting,
    M: int,
    rows: list[tuple[int, int, int]],
    active: list[tuple[int, int, int]],
    waiting: list[tuple[int, int]],
    slots: int,
) -> ReplayOutcome:
    params = setting.params(M)
    plan = fixed_arrivals(rows) if rows else fixed_arrivals([])
    if spec is not None:
        return replay(spec, params, plan, active=active, waiting=waiting, slots=slots)
    # a scheduler object with no loadable spec: the same loop as replay(), on the object
    eng = Engine(scheduler, params)
    if active or waiting:
        eng.load_state(active, waiting)
    i = 0
    try:
        for t in range(slots):
            while i < len(rows) and rows[i][0] == t:
                eng.arrive(rows[i][1], rows[i][2])
                i += 1
            eng.step()
    except InvariantViolation as exc:
        return ReplayOutcome(tuple(eng.records), exc)
    return ReplayOutcome(tuple(eng.records), None)


def replay_trace(
    scheduler: Scheduler,
    spec: str | None,
    setting: Setting,
    *,
    kind: str,
    M: int,
    slots: Sequence[SlotState],
    initial_active: Sequence[tuple[int, int, int]] = (),
    initial_waiting: Sequence[tuple[int, int]] = (),
) -> Trace:
    """Replay decoded ``slots`` (the last one violates) and build the :class:`Trace`.

    For a reachable trace the arrivals come from the slots; for a CTI the run
    starts from ``initial_active``/``initial_waiting``.  ``replayed`` is true
    only if every slot charged the memory the model says and the simulator
    raised :class:`InvariantViolation` in the last slot with that memory.
    """
    rows = [(st.slot, s, o) for st in slots for (s, o) in st.arrivals]
    act, wait = list(initial_active), list(initial_waiting)
    out = _run(scheduler, spec, setting, M, rows, act, wait, len(slots))
    last = slots[-1]
    problems: list[str] = []
    for st, rec in zip(slots, out.records):
        if rec.memory != st.memory:
            problems.append(f"slot {st.slot}: model charges {st.memory}, simulator {rec.memory}")
    v = out.violation
    if v is None:
        problems.append(f"the simulator ran {len(out.records)} slots without a violation")
    elif v.slot != last.slot or v.memory != last.memory:
        problems.append(
            f"simulator violation at slot {v.slot} with memory {v.memory}; model: slot {last.slot}, memory {last.memory}"
        )
    name = spec if spec is not None else getattr(scheduler, "name", "?")
    cmd = replay_command(name, setting.params(M), rows, active=act or None, waiting=wait or None)
    if not rows:
        cmd += " --slots 1"
    return Trace(
        kind=kind,
        M=M,
        chunk=setting.chunk,
        block=setting.block,
        arrivals=tuple(rows),
        initial_active=tuple(act),
        initial_waiting=tuple(wait),
        slots=tuple(slots),
        violation_slot=last.slot,
        violation_memory=last.memory,
        replay_command=cmd,
        replayed=not problems,
        replay_message="; ".join(problems) if problems else f"(InvariantViolation: {v})",
    )
