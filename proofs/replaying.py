"""Decode z3 models into concrete runs and replay them in the reference simulator.

A counterexample is only reported once the simulator (``kvstab/simulator.py``)
has reproduced it: the same violation, in the same slot, with the same
memory.  A model that does not reproduce means the encoding and the engine
disagree — :attr:`~kvstab.proofs.verdicts.Trace.replayed` is then ``False``
and the message says where they part.

With prefix caching there is no z3 model to decode when the theorem does not
apply (the bounded encoding has no block pool: a run it decodes need not behave
the same on the engine with caching, where a preempted request finds its own
cached blocks again, rule 10 of ``docs/MODEL.md``).  :func:`search_shared` looks
for a counterexample where it can be replayed exactly: small workloads whose
prompts share one prefix (the ``SLOT:S:O:P`` items ``kvstab replay
--prefix-caching on`` reads), run on the reference engine with its block pool,
which checks the pool's invariant every slot.  The search is deterministic (a
seeded generator, a fixed number of tries) and shrinks what it finds greedily
(fewer requests, then smaller ``M``, lengths, shared prefixes and arrival
slots), so the replay line is short.  Finding nothing is an ``Unknown``, never a
pass.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import z3

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import Scheduler, initial_state, state_vars_of
from kvstab.errors import InvalidScheduler, InvariantViolation
from kvstab.proofs.encoding import Entry, Setting, StepTerms
from kvstab.proofs.verdicts import SlotState, Trace
from kvstab.replay import ReplayOutcome, parse_requests, replay, replay_command
from kvstab.simulator import Engine

__all__ = [
    "decode_int",
    "decode_number",
    "decode_state",
    "decode_slot",
    "replay_trace",
    "same_state",
    "SEARCH_TRIES",
    "Workload",
    "search_shared",
    "violates",
]


def decode_int(m: z3.ModelRef, t: z3.ExprRef) -> int:
    """The value of integer term ``t`` in ``m`` (unconstrained terms take their default)."""
    return m.eval(t, model_completion=True).as_long()  # type: ignore[union-attr]


def decode_number(m: z3.ModelRef, t: z3.ExprRef) -> int | float:
    """The value of ``t`` in ``m``: an ``int`` for an integer term, a ``float``
    for a real one (what the engine carries for a ``real=True`` state variable)."""
    v = m.eval(t, model_completion=True)
    if z3.is_int_value(v):
        return v.as_long()  # type: ignore[attr-defined]
    if z3.is_rational_value(v):
        return float(v.as_fraction())  # type: ignore[attr-defined]
    # an algebraic number (only from non-linear constraints): its decimal approximation
    return float(v.approx(20).as_fraction())  # type: ignore[attr-defined]


def same_state(a: Sequence[int | float], b: Sequence[int | float]) -> bool:
    """Two scheduler states agree: integers exactly, reals up to float rounding
    (the engine computes a real state in floats, z3 in exact rationals)."""
    return len(a) == len(b) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
        for x, y in zip(a, b)
    )


def decode_state(m: z3.ModelRef, terms: Sequence[z3.ExprRef]) -> tuple[int | float, ...]:
    """The scheduler state ``terms`` take in ``m``."""
    return tuple(decode_number(m, t) for t in terms)


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
        state=decode_state(m, step.pre.sched),
        next_state=decode_state(m, step.post.sched),
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
    sched_state: tuple[int | float, ...] | None = None,
) -> tuple[ReplayOutcome, InvalidScheduler | None]:
    """Run the slots; returns the outcome and the engine's rejection of a next
    state outside its declared bounds (``InvalidScheduler``), if that is what stopped it."""
    params = setting.params(M)
    plan = fixed_arrivals(rows) if rows else fixed_arrivals([])
    if spec is not None and not state_vars_of(scheduler):
        return replay(spec, params, plan, active=active, waiting=waiting, slots=slots), None
    # a scheduler object with no loadable spec, or a stateful rule (started from
    # the decoded state): the same loop as replay(), on the object
    eng = Engine(scheduler, params, spec=spec)
    if active or waiting or sched_state is not None:
        eng.load_state(active, waiting, sched_state=sched_state)
    i = 0
    try:
        for t in range(slots):
            while i < len(rows) and rows[i][0] == t:
                eng.arrive(rows[i][1], rows[i][2])
                i += 1
            eng.step()
    except InvariantViolation as exc:
        return ReplayOutcome(tuple(eng.records), exc), None
    except InvalidScheduler as exc:
        if "state variable" not in str(exc):
            raise
        return ReplayOutcome(tuple(eng.records), None), exc
    return ReplayOutcome(tuple(eng.records), None), None


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
    broken_state: str = "",
) -> Trace:
    """Replay decoded ``slots`` (the last one violates) and build the :class:`Trace`.

    For a reachable trace the arrivals come from the slots; for a CTI the run
    starts from ``initial_active``/``initial_waiting`` and (for a stateful
    rule) the first slot's decoded scheduler state.  ``replayed`` is true only
    if every slot charged the memory the model says and the simulator raised
    :class:`InvariantViolation` in the last slot with that memory — or, when
    ``broken_state`` names a state variable, the engine rejected that
    variable's next value in the last slot (``check_next_state``), after every
    earlier slot left the state the model says.
    """
    rows = [(st.slot, s, o) for st in slots for (s, o) in st.arrivals]
    act, wait = list(initial_active), list(initial_waiting)
    start = slots[0].state if kind == "cti" and slots[0].state else None
    out, rejected = _run(scheduler, spec, setting, M, rows, act, wait, len(slots), start)
    last = slots[-1]
    problems: list[str] = []
    for st, rec in zip(slots, out.records):
        if rec.memory != st.memory:
            problems.append(f"slot {st.slot}: model charges {st.memory}, simulator {rec.memory}")
        if st.next_state and not same_state(tuple(rec.state), st.next_state):
            problems.append(f"slot {st.slot}: model's next state {list(st.next_state)}, simulator {list(rec.state)}")
    v = out.violation
    if broken_state:
        if rejected is None or f"state variable {broken_state!r}" not in str(rejected):
            problems.append(
                f"the simulator did not reject the next value of state variable {broken_state!r} "
                f"({'it raised: ' + str(rejected) if rejected else 'no rejection'})"
            )
        elif len(out.records) != last.slot:
            problems.append(f"the simulator rejected the state in slot {len(out.records)}; model: slot {last.slot}")
    elif v is None:
        problems.append(f"the simulator ran {len(out.records)} slots without a violation")
    elif v.slot != last.slot or v.memory != last.memory:
        problems.append(
            f"simulator violation at slot {v.slot} with memory {v.memory}; model: slot {last.slot}, memory {last.memory}"
        )
    name = spec if spec is not None else getattr(scheduler, "name", "?")
    cmd = replay_command(name, setting.params(M), rows, active=act or None, waiting=wait or None)
    if not rows:
        cmd += " --slots 1"
    if start is not None and start != initial_state(state_vars_of(scheduler)):
        # `kvstab replay` starts every run from the rule's declared initial state
        cmd += f"  # from scheduler state {list(start)}: Engine.load_state(..., sched_state={tuple(start)!r})"
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
        replay_message="; ".join(problems)
        if problems
        else (f"(InvalidScheduler: {rejected})" if broken_state else f"(InvariantViolation: {v})"),
        initial_state=tuple(start) if start is not None else (),
        broken_state=broken_state,
    )


# --- prefix caching: a search over shared-prefix workloads


#: workloads drawn before the search gives up (each runs a few slots on the reference engine)
SEARCH_TRIES = 600

#: slots a drawn workload may run before it counts as safe
SEARCH_SLOTS = 200


@dataclass(frozen=True, slots=True)
class Workload:
    """A server size and ``(slot, s, o, P)`` requests: ``P`` tokens of one shared prefix."""

    M: int
    rows: tuple[tuple[int, int, int, int], ...]

    def text(self) -> str:
        """The ``--requests`` form."""
        return ",".join(f"{a}:{s}:{o}:{p}" if p else f"{a}:{s}:{o}" for a, s, o, p in self.rows)


def violates(sched: Scheduler, spec: str | None, setting: Setting, w: Workload) -> tuple[int, int] | None:
    """``(slot, memory)`` of the first broken invariant when ``w`` runs on the reference
    engine with caching on, else ``None`` (a rule the engine rejects counts as safe here)."""
    if any(p > s for _, s, _, p in w.rows) or not w.rows:
        return None
    params = setting.params(w.M)
    if any(-(-(s + o) // params.block) * params.block > w.M for _, s, o, _ in w.rows):
        return None  # the engine rejects a request whose peak does not fit
    try:
        out = replay(sched, params, parse_requests(w.text()), max_slots=SEARCH_SLOTS, spec=spec)
    except InvalidScheduler:
        return None
    v = out.violation
    return None if v is None else (v.slot, v.memory)


def _draws(setting: Setting, seed: int) -> Iterator[Workload]:
    """Small shared-prefix workloads: a few blocks of memory, a few requests a slot apart."""
    rng = random.Random(seed)
    B = setting.block
    while True:
        M = B * rng.randint(2, 12)
        n = rng.randint(2, 4)
        rows = []
        for _ in range(n):
            s = rng.randint(1, max(1, M - 1))
            o = rng.randint(1, max(1, min(6, M - s)))
            p = rng.choice([0, s, B * (s // B), B * rng.randint(0, s // B)])
            rows.append((rng.randint(0, 3), s, o, min(p, s)))
        rows.sort(key=lambda r: r[0])
        yield Workload(M, tuple(rows))


def _smaller(w: Workload, B: int) -> Iterator[Workload]:
    """Each one-step simplification of ``w``, most drastic first."""
    rows = list(w.rows)
    for i in range(len(rows)):
        yield Workload(w.M, tuple(rows[:i] + rows[i + 1 :]))
    if w.M > B:
        yield Workload(w.M - B, w.rows)
    for i, (a, s, o, p) in enumerate(rows):
        for r in ((a, s, o - 1, p), (a, s - 1, o, min(p, s - 1)), (a, s, o, p - 1), (a - 1, s, o, p)):
            if min(r[1], r[2]) >= 1 and r[0] >= 0 and r[3] >= 0:
                yield Workload(w.M, tuple(sorted(rows[:i] + [r] + rows[i + 1 :], key=lambda x: x[0])))


def search_shared(
    sched: Scheduler, spec: str | None, setting: Setting, *, seed: int = 0, tries: int = SEARCH_TRIES,
    seconds: float | None = None,
) -> Trace | None:
    """The first drawn shared-prefix workload that breaks the invariant, shrunk, as a
    replayed :class:`Trace` with its ``kvstab replay … --prefix-caching on`` line; ``None``
    when ``tries`` draws (or ``seconds``) find none.  A fixed ``setting.M`` is used as is."""
    t0 = time.perf_counter()
    found: Workload | None = None
    for k, w in enumerate(_draws(setting, seed)):
        if k >= tries or (seconds is not None and time.perf_counter() - t0 > seconds):
            return None
        if setting.M is not None:
            w = Workload(setting.M, w.rows)
        if violates(sched, spec, setting, w):
            found = w
            break
    assert found is not None
    shrinking = True
    while shrinking:
        shrinking = False
        for smaller in _smaller(found, setting.block):
            if setting.M is not None and smaller.M != setting.M:
                continue
            if violates(sched, spec, setting, smaller):
                found, shrinking = smaller, True
                break
    hit = violates(sched, spec, setting, found)
    assert hit is not None
    slot, memory = hit
    name = spec if spec is not None else getattr(sched, "name", "?")
    plan = parse_requests(found.text())
    return Trace(
        kind="reachable",
        M=found.M,
        chunk=setting.chunk,
        block=setting.block,
        arrivals=tuple((a, s, o) for a, s, o, _ in found.rows),
        initial_active=(),
        initial_waiting=(),
        slots=(),
        violation_slot=slot,
        violation_memory=memory,
        replay_command=replay_command(name, setting.params(found.M), plan),
        replayed=True,
        replay_message=f"(found by a search over shared-prefix workloads; shared prefixes P = "
        f"{[p for *_, p in found.rows]})",
    )
