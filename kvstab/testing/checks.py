"""The per-run property checks of the audit suite, written once.

``props/`` (the Hypothesis suite), its stateful machine, the mutation test and
``kvstab check`` all drive the reference :class:`~kvstab.simulator.Engine`
through an :class:`Auditor`, which keeps a *shadow* account of every request
(its state, the area it has been served, the remaining-area Lyapunov function
``V``) and checks after every slot:

1. memory invariant: ``Σ tokens held ≤ M``;
2. conservation of requests (each one waiting, active or finished, exactly
   once) and, for a scheduler declaring ``fcfs``, first admissions in arrival
   order;
3. served area of a finished request ``= g(s, o) + wasted`` (``= g`` without
   preemption), with ``g`` from :mod:`kvstab.theory.area`.  ``g`` is the area
   under maximal batching (one full unit per slot).  A last attempt that was
   ever granted less than a unit (a token budget, a grant of 0) follows another
   path through prefill, whose area may be above or below ``g``; what no path
   avoids is the last prefill slot (holding ``s``) and one slot per output
   token (holding ``s + j``), so for it the check is
   ``served ≥ wasted + B⌈s/B⌉ + Σ_j B⌈(s + j)/B⌉``;
4. area served in the slot (the shadow's increments) ``= memory ≤ M``;
5. the slot identity ``V′ = V + Σ_arrivals g − used + wasted`` (plus, for
   requests finishing after partial grants, the difference ``served − g`` of
   their last attempt, which ``V`` — built on ``g`` — cannot foresee);
6. the drift bound: queue non-empty after the decision ⇒ memory ``≥ M − Δ``
   for the scheduler's declared ``margin`` (``Δ = M − 1``, "something runs",
   if it declares none);
7. work conservation (schedulers declaring ``work_conserving``), in slots
   without preemption: the post-decision state is a fixed point of the rule —
   shown the admitted requests as running, the rule admits no one more — and,
   from the engine's state rather than the rule's own accounting, for a
   clairvoyant rule that never preempts: the queue head is left waiting only
   if the peaks ``s + o`` of the requests that ran plus its own exceed ``M``
   (peak reservation is always safe, so a rule that waits for less idles);
8. liveness: once arrivals stop, everything finishes within
   ``Σ (n(s) + o)`` slots over the unfinished requests (a bound that holds
   whenever the oldest running request is never preempted, advances a full
   unit each slot, and a lone head is always admitted); with a token budget
   the oldest request advances at least one token a slot, and the bound is
   ``Σ (s + o)``.  A rule declaring ``stalls_running`` (prefill-only steps,
   as SGLang's) gives up the first premise; what it keeps is that every slot
   with a request in the system does at least one token of work, so the drain
   is bounded by the work left, ``Σ (s + o)``, plus the progress its
   preemptions throw away during the drain (each counted as it happens; a
   drain past 20× the static bound is reported as a livelock all the same).

A failure raises :class:`PropertyViolation`, an ``AssertionError`` (so
Hypothesis shrinks it) whose message names the property, the slot and two
one-line commands that replay the workload: ``kvstab replay`` (the simulator,
slot by slot; it stops at a memory violation) and ``kvstab check`` (the same
flags; the workload through the checks here, ``--property N`` naming the ones
the failing run checked).  kvstab's frames carry ``__tracebackhide__`` so that
pytest shows the property, the workload and the replay line first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import ActiveEntry, Scheduler, View, WaitingEntry, traits_of
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, tokens_held, unit_tokens
from kvstab.ops import CONCRETE
from kvstab.replay import replay_command
from kvstab.simulator import Engine, SlotRecord
from kvstab.theory.area import lifetime_area
from kvstab.validation import MAX_COUNT, as_int, positive_int

#: the queue window the engine shows a rule unless told otherwise (``Engine``'s default)
DEFAULT_WINDOW = 8
#: the largest window the audit accepts (the engine widens it as needed anyway)
MAX_WINDOW = MAX_COUNT

__all__ = [
    "PROPERTIES",
    "ALL_PROPERTIES",
    "PropertyViolation",
    "Auditor",
    "audit_plan",
    "audit_command",
    "DEFAULT_WINDOW",
    "margin_of",
    "service_slots",
]

#: What each numbered property checks (the numbering of docs/props.md).
PROPERTIES: dict[int, str] = {
    1: "memory invariant",
    2: "conservation of requests / FCFS first admissions",
    3: "served area = g(s, o) + wasted area",
    4: "area served per slot ≤ M",
    5: "Lyapunov slot identity V' = V + Σ g(arrivals) − used + wasted",
    6: "drift bound: queue non-empty ⇒ memory ≥ M − Δ",
    7: "work conservation",
    8: "liveness after arrivals stop",
}
ALL_PROPERTIES: frozenset[int] = frozenset(PROPERTIES)


class PropertyViolation(AssertionError):
    """A property of :data:`PROPERTIES` failed on a concrete workload.

    ``prop`` is its number, ``slot`` the slot it failed in (``None`` for
    liveness), ``requests`` the workload as ``(slot, s, o)`` rows, ``window``
    the queue window the rule was shown, ``select`` the properties the run
    checked, ``margin`` the ``Δ`` property 6 used if not the declared one, and ``replay`` / ``audit`` the one-line commands that reproduce it
    (``audit`` is ``kvstab check …``, with the same flags as ``kvstab replay``).
    """

    def __init__(
        self,
        prop: int,
        scheduler: str,
        slot: int | None,
        detail: str,
        params: ModelParams,
        requests: Sequence[tuple[int, int, int]],
        *,
        window: int = DEFAULT_WINDOW,
        select: Iterable[int] = ALL_PROPERTIES,
        margin: int | None = None,
    ) -> None:
        self.prop = prop
        self.scheduler = scheduler
        self.slot = slot
        self.detail = detail
        self.params = params
        self.requests = tuple(requests)
        self.window = window
        self.select = frozenset(select)
        self.replay = _with_window(replay_command(scheduler, params, list(self.requests)), window)
        self.margin = margin
        self.audit = audit_command(
            scheduler, params, list(self.requests), window=window, select=self.select, margin=margin
        )
        where = f" in slot {slot}" if slot is not None else ""
        shown = "" if window == DEFAULT_WINDOW else f"; the rule was shown a queue window of {window}"
        super().__init__(
            f"property {prop} ({PROPERTIES[prop]}) violated by scheduler {scheduler!r}{where}: {detail}\n"
            f"  workload: {len(self.requests)} request(s), (slot, s, o) = {list(self.requests)}{shown}\n"
            f"  replay:   {self.replay}\n"
            f"  audit:    {self.audit}"
        )


def _with_window(cmd: str, window: int) -> str:
    """A command with ``--window`` added when the run used another window than the engine's default."""
    return cmd if window == DEFAULT_WINDOW else f"{cmd} --window {window}"


def audit_command(
    scheduler: str,
    params: ModelParams,
    requests: list[tuple[int, int, int]],
    *,
    window: int = DEFAULT_WINDOW,
    select: Iterable[int] = ALL_PROPERTIES,
    margin: int | None = None,
) -> str:
    """``kvstab check …``: the workload through the checks of this module.

    The flags are those of ``kvstab replay``; ``--property N`` names the
    properties the failing run checked when it checked only some, so that the
    command reports the same property as the failure it reproduces, and
    ``--margin D`` the ``Δ`` property 6 used when it was not the declared one.
    """
    cmd = replay_command(scheduler, params, requests)
    assert cmd.startswith("kvstab replay ")
    line = "kvstab check " + cmd[len("kvstab replay ") :]
    chosen = frozenset(select)
    if chosen != ALL_PROPERTIES:
        line += "".join(f" --property {k}" for k in sorted(chosen))
    if margin is not None:
        line += f" --margin {margin}"
    return _with_window(line, window)


def margin_of(scheduler: Scheduler, params: ModelParams, max_s: int, max_o: int) -> int:
    """The scheduler's declared margin ``Δ`` (tokens), or ``M − 1`` — only
    "some request runs while the queue is non-empty" — if it declares none."""
    margin = getattr(scheduler, "margin", None)
    if margin is None:
        return params.M - 1
    return int(margin(params, max_s, max_o))


def service_slots(s: int, o: int, params: ModelParams) -> int:
    """Slots an unpreempted request needs at most: ``n(s) + o = ⌈s/ŝ⌉ + o`` under
    maximal batching, ``s + o`` (one token a slot) under a token budget."""
    if params.token_budget is not None:
        return s + o
    return -(-s // params.chunk) + o


@dataclass(frozen=True, slots=True)
class _Slot:
    """One slot as the checks see it: the engine's record and its state around it."""

    rec: SlotRecord
    before_active: dict[int, int]  # rid -> progress before the slot
    before_waiting: list[int]
    active_ids: list[int]  # after the slot (releases done)
    waiting_ids: list[int]
    running: list[int]  # did work this slot: still active, or completed in it
    held: dict[int, int]  # tokens each running request holds after its work


class Auditor:
    """An :class:`Engine` (run with ``check=False``) plus a shadow account
    checked after every slot; see the module docstring for the properties.

    ``select`` restricts the checks to some property numbers; ``spec`` is how
    the scheduler is named in replay commands (a registered name or
    ``module:attr``; default its ``name``); ``window`` is the queue window the
    engine shows the rule; ``margin`` replaces the declared ``Δ`` of property 6
    (e.g. by a proved one); ``decide_timeout`` is :class:`Engine`'s (``kvstab check``'s
    ``--decide-timeout``).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        params: ModelParams,
        *,
        select: Iterable[int] = ALL_PROPERTIES,
        spec: str | None = None,
        window: int = DEFAULT_WINDOW,
        margin: int | None = None,
        decide_timeout: float | None = None,
    ) -> None:
        if params.g != "exact":
            raise InvalidArgument("the audit compares served area with the exact g; use ModelParams(g='exact')")
        self.scheduler = scheduler
        self.traits = traits_of(scheduler)
        self.params = params
        self.select = frozenset(select)
        unknown = self.select - ALL_PROPERTIES
        if unknown:
            raise InvalidArgument(f"unknown property numbers {sorted(unknown)}; valid: {sorted(ALL_PROPERTIES)}")
        self.spec = spec or scheduler.name
        self.window = positive_int("window", window, maximum=MAX_WINDOW)
        self.engine = Engine(scheduler, params, check=False, window=self.window, decide_timeout=decide_timeout)
        #: Δ for property 6 in place of the declared one (a proved margin), or None
        self.margin = None if margin is None else as_int("margin", margin, minimum=0, maximum=params.M)
        self.requests: list[tuple[int, int, int]] = []  # (arrival slot, s, o), for replay
        self.g: list[int] = []
        self.area: list[int] = []  # area served in the current attempt
        self.total_area: list[int] = []  # all area served, wasted attempts included
        self.wasted: list[int] = []
        self.preempted_ever: list[bool] = []
        #: whether the current attempt was ever granted less than one unit
        self.partial: list[bool] = []
        self.admitted_ever: list[bool] = []
        self.V = 0  # remaining area at the end of the last slot (this slot's arrivals not included)
        self.arrived_g = 0  # Σ g of this slot's arrivals
        self.max_s = 0
        self.max_o = 0
        #: set when a drain with property 8 off was stopped far past its bound
        #: (a livelock is property 8's to report, not the selected property's)
        self.stalled = False
        self._before_state: tuple[int | float, ...] = self.engine.sched_state
        #: how often each check's premise held (vacuity guard: a property whose
        #: premise never held was not tested); keys are property numbers,
        #: "3-preempted" for finished requests that had been preempted and
        #: "7-engine" for the engine-state test of property 7
        self.exercised: Counter[int | str] = Counter()

    # --- helpers
    def fail(self, prop: int, slot: int | None, detail: str) -> PropertyViolation:
        """The violation of ``prop`` with this run's workload attached."""
        return PropertyViolation(
            prop,
            self.spec,
            slot,
            detail,
            self.params,
            self.requests,
            window=self.window,
            select=self.select,
            margin=self.margin,
        )

    def _on(self, prop: int) -> bool:
        return prop in self.select

    def unavoidable_area(self, s: int, o: int) -> int:
        """Area every path through a request's life serves: its last prefill
        slot holds ``s`` tokens and each decode slot ``s + j``."""
        b = self.params.block
        return int(tokens_held(s, b)) + sum(int(tokens_held(s + j, b)) for j in range(1, o + 1))

    # --- inputs
    def arrive(self, s: int, o: int) -> int:
        """A request arrives in the current slot."""
        rid = self.engine.arrive(int(s), int(o))
        self.requests.append((self.engine.slot, int(s), int(o)))
        g = int(lifetime_area(int(s), int(o), self.params))
        self.g.append(g)
        self.area.append(0)
        self.total_area.append(0)
        self.wasted.append(0)
        self.preempted_ever.append(False)
        self.partial.append(False)
        self.admitted_ever.append(False)
        self.arrived_g += g  # enters V in the slot identity of this slot
        self.max_s = max(self.max_s, int(s))
        self.max_o = max(self.max_o, int(o))
        return rid

    # --- one slot
    def step(self) -> SlotRecord:
        """Run one slot and check every selected per-slot property (one method each)."""
        __tracebackhide__ = True  # a failure shows the property and the workload, not this loop
        eng, p = self.engine, self.params
        before_active = {r.rid: r.progress for r in eng.active}
        before_waiting = [r.rid for r in eng.waiting]
        self._before_state = eng.sched_state  # the state the rule decided in (property 7 asks it again)
        rec = eng.step()
        active_ids = [r.rid for r in eng.active]
        running = active_ids + list(rec.completed)
        # memory, recomputed from progress by the one accounting function
        held = {rid: int(tokens_held(eng.requests[rid].progress, p.block)) for rid in running}
        slot = _Slot(rec, before_active, before_waiting, active_ids, [r.rid for r in eng.waiting], running, held)

        self._check_conservation(slot)  # 2
        self._check_memory(slot)  # 1
        wasted_now, excess = self._account(slot)
        self._check_area_per_slot(slot)  # 4
        self._check_served_area(slot, wasted_now)  # 3
        self._check_lyapunov(slot, excess)  # 5
        self._check_drift(slot)  # 6
        self._check_work_conservation(slot)  # 7
        return rec

    def _account(self, slot: _Slot) -> tuple[int, int]:
        """Update the shadow account: preemption throws the attempt's area away,
        running requests accrue what they hold.  Returns the area wasted in the
        slot and ``Σ (served − g)`` of last attempts that ended after partial
        grants (either sign)."""
        reqs, p = self.engine.requests, self.params
        wasted_now = 0
        for rid in slot.rec.preempted:
            wasted_now += self.area[rid]
            self.wasted[rid] += self.area[rid]
            self.area[rid] = 0
            self.preempted_ever[rid] = True
            self.partial[rid] = False  # a new attempt starts from progress 0
        for rid in slot.running:
            # admitted this slot ⇒ progress was 0 before its first unit
            before = slot.before_active.get(rid, 0)
            r = reqs[rid]
            if r.progress - before < unit_tokens(r.s, before, p.chunk):
                self.partial[rid] = True
        for rid, h in slot.held.items():
            self.area[rid] += h
            self.total_area[rid] += h
        excess = sum(self.area[rid] - self.g[rid] for rid in slot.rec.completed if self.partial[rid])
        return wasted_now, excess

    def _check_memory(self, slot: _Slot) -> None:
        """Property 1: ``Σ tokens held ≤ M`` over the requests that ran."""
        __tracebackhide__ = True
        memory = sum(slot.held.values())
        if memory:
            self.exercised[1] += 1
        if self._on(1) and memory > self.params.M:
            raise self.fail(
                1, slot.rec.slot, f"memory {memory} > M={self.params.M} (running requests {sorted(slot.running)})"
            )

    def _check_conservation(self, slot: _Slot) -> None:
        """Property 2: each request waiting, active or finished exactly once;
        admissions from the queue, preemptions of active requests, releases at
        ``s + o``; and first admissions in arrival order for an FCFS rule."""
        __tracebackhide__ = True
        rec, reqs = slot.rec, self.engine.requests
        t = rec.slot
        if rec.admitted:
            self.exercised[2] += 1
        if not self._on(2):
            return
        finished = [r.rid for r in reqs if r.finish >= 0]
        seen = slot.active_ids + slot.waiting_ids + finished
        if len(seen) != len(set(seen)) or set(seen) != set(range(len(reqs))):
            dup = sorted({x for x in seen if seen.count(x) > 1})
            lost = sorted(set(range(len(reqs))) - set(seen))
            raise self.fail(2, t, f"requests not conserved: duplicated {dup}, lost {lost}")
        if rec.queue != len(slot.waiting_ids):
            raise self.fail(2, t, f"record says queue {rec.queue}, the queue holds {len(slot.waiting_ids)}")
        was_waiting = set(slot.before_waiting)
        for rid in rec.admitted:
            if rid not in was_waiting:
                raise self.fail(2, t, f"request {rid} admitted but it was not waiting")
        for rid in rec.preempted:
            if rid not in slot.before_active:
                raise self.fail(2, t, f"request {rid} preempted but it was not active")
        for rid in rec.completed:
            r = reqs[rid]
            if r.progress != r.s + r.o:
                raise self.fail(2, t, f"request {rid} released with progress {r.progress} < s + o = {r.s + r.o}")
        if self.traits.fcfs:
            for rid in rec.admitted:
                self.admitted_ever[rid] = True
            first = [i for i, a in enumerate(self.admitted_ever) if a]
            if first and len(first) != first[-1] + 1:
                skipped = [i for i in range(first[-1]) if not self.admitted_ever[i]]
                raise self.fail(
                    2,
                    t,
                    f"scheduler declares FCFS but request {first[-1]} was admitted before "
                    f"earlier arrival(s) {skipped[:8]}",
                )

    def _check_area_per_slot(self, slot: _Slot) -> None:
        """Property 4: the shadow's area increments equal the memory the engine charged, ``≤ M``."""
        __tracebackhide__ = True
        memory, t = sum(slot.held.values()), slot.rec.slot
        if memory:
            self.exercised[4] += 1
        if not self._on(4):
            return
        if memory != slot.rec.memory:
            raise self.fail(4, t, f"area served {memory} differs from the memory the engine charged {slot.rec.memory}")
        if memory > self.params.M:
            raise self.fail(4, t, f"area served in one slot {memory} > M={self.params.M}")

    def _check_served_area(self, slot: _Slot, wasted_now: int) -> None:
        """Property 3: a finished request was served ``g + wasted`` (``≥`` the
        unavoidable area + wasted after partial grants)."""
        __tracebackhide__ = True
        if not self._on(3):
            return
        rec, reqs, t = slot.rec, self.engine.requests, slot.rec.slot
        if wasted_now != rec.wasted:
            raise self.fail(3, t, f"preemptions threw away area {wasted_now}, the engine reports {rec.wasted}")
        for rid in rec.completed:
            self.exercised[3] += 1
            self.exercised["3-preempted"] += self.preempted_ever[rid]
            r = reqs[rid]
            g, served, wasted = self.g[rid], self.total_area[rid], self.wasted[rid]
            partial = self.partial[rid]
            if partial:
                g = self.unavoidable_area(r.s, r.o)
            area_ok = served >= g + wasted if partial else served == g + wasted
            if not area_ok or r.served != served or r.wasted != wasted:
                kind = "preempted" if self.preempted_ever[rid] else "never preempted"
                relation = "≥ unavoidable area" if partial else "= g"
                raise self.fail(
                    3,
                    t,
                    f"request {rid} (s={r.s}, o={r.o}, {kind}) finished with served area {served}, "
                    f"expected {relation} + wasted = {g} + {wasted} (engine: served {r.served}, wasted {r.wasted})",
                )

    def _check_lyapunov(self, slot: _Slot, excess: int) -> None:
        """Property 5: ``V′ = V + Σ g(arrivals) − used + wasted (+ excess)``; ``V``
        is the full ``g`` of waiting requests plus the unserved part of active ones."""
        __tracebackhide__ = True
        rec = slot.rec
        self.exercised[5] += 1
        V_after = sum(self.g[rid] for rid in slot.waiting_ids) + sum(
            self.g[rid] - self.area[rid] for rid in slot.active_ids
        )
        if self._on(5):
            expected = self.V + self.arrived_g - rec.memory + rec.wasted + excess
            if V_after != expected:
                raise self.fail(
                    5,
                    rec.slot,
                    f"V after the slot is {V_after}, but V + Σg(arrivals) − used + wasted + excess = "
                    f"{self.V} + {self.arrived_g} − {rec.memory} + {rec.wasted} + {excess} = {expected}",
                )
        self.V = V_after
        self.arrived_g = 0

    def _check_drift(self, slot: _Slot) -> None:
        """Property 6: queue non-empty after the decision ⇒ memory ``≥ M − Δ``."""
        __tracebackhide__ = True
        rec, p = slot.rec, self.params
        if rec.queue == 0:
            return
        self.exercised[6] += 1
        if not self._on(6):
            return
        delta = self.margin if self.margin is not None else margin_of(self.scheduler, p, self.max_s, self.max_o)
        if rec.memory < p.M - delta:
            if self.margin is not None:
                whence = "given"
            elif getattr(self.scheduler, "margin", None) is not None:
                whence = "declared"
            else:  # margin_of's default: the weakest drift premise, that something runs while requests wait
                whence = "= M − 1: the scheduler declares no margin, so only 'some request runs' is checked"
            raise self.fail(
                6,
                rec.slot,
                f"{rec.queue} request(s) left waiting while memory is {rec.memory} < M − Δ = "
                f"{p.M} − {delta} = {p.M - delta} (Δ {whence})",
            )

    def _check_work_conservation(self, slot: _Slot) -> None:
        """Property 7, for a rule declaring ``work_conserving``, in a slot
        without preemption that left requests waiting: the rule's own fixed
        point, and for a clairvoyant rule that never preempts, the engine's
        state against peak reservation."""
        __tracebackhide__ = True
        if not (self._on(7) and self.traits.work_conserving) or slot.rec.preempted or not slot.waiting_ids:
            return
        self._check_fixed_point(slot)
        if self.traits.clairvoyant and not self.traits.preempts:
            self._check_head_against_peaks(slot)

    def _check_fixed_point(self, slot: _Slot) -> None:
        """Show the rule the state right after its decision — the admitted
        requests as running with progress 0 — and ask again: a work-conserving
        rule has nothing more to admit."""
        __tracebackhide__ = True
        self.exercised[7] += 1
        rec, reqs, p = slot.rec, self.engine.requests, self.params
        kept = [rid for rid in slot.before_active if rid not in rec.preempted]
        active = tuple(ActiveEntry(rid, reqs[rid].s, reqs[rid].o, slot.before_active[rid]) for rid in kept) + tuple(
            ActiveEntry(rid, reqs[rid].s, reqs[rid].o, 0) for rid in rec.admitted
        )
        head = slot.waiting_ids[: max(self.engine.window, 1)]
        waiting = tuple(WaitingEntry(rid, reqs[rid].s, reqs[rid].o) for rid in head)
        view = View.under(p, active, waiting, len(slot.waiting_ids), self._before_state)
        again = self.scheduler.decide(view, CONCRETE)
        more = [rid for rid, a in zip(head, again.admit) if a]
        if more and not any(again.preempt):
            raise self.fail(
                7,
                rec.slot,
                f"the scheduler left request(s) {more} waiting that its own rule admits on top of "
                f"this slot's decision (admitted {list(rec.admitted)})",
            )

    def _check_head_against_peaks(self, slot: _Slot) -> None:
        """From the engine's state, not the rule's accounting: a clairvoyant
        rule that never preempts stays safe by admitting a request whenever the
        peaks ``s + o`` of everything that ran this slot and the request's own
        peak fit in ``M`` (that is ``reserve``; a look-ahead admits more).  So a
        rule claiming work conservation may leave the queue head waiting only
        when those peaks exceed ``M`` (or the running cap is reached): a rule
        that idles part of ``M`` by its own accounting fails here, whatever its
        declared margin."""
        __tracebackhide__ = True
        rec, reqs, p = slot.rec, self.engine.requests, self.params
        if p.max_num_seqs is not None and len(slot.running) >= p.max_num_seqs:
            return
        head = reqs[slot.waiting_ids[0]]
        reserved = sum(int(tokens_held(reqs[rid].s + reqs[rid].o, p.block)) for rid in slot.running)
        need = int(tokens_held(head.s + head.o, p.block))
        self.exercised["7-engine"] += 1
        if reserved + need <= p.M:
            raise self.fail(
                7,
                rec.slot,
                f"the queue head, request {head.rid} (s={head.s}, o={head.o}, peak {need}), was left "
                f"waiting although the peaks of the {len(slot.running)} request(s) that ran sum to {reserved} and "
                f"{reserved} + {need} ≤ M={p.M}: admitting it could never overflow memory",
            )

    # --- runs
    def drain(self) -> int:
        """Step until the system is empty; property 8 fails if that takes more
        than ``Σ (n(s) + o)`` slots over the unfinished requests.  Returns the
        slots taken.  With property 8 off, a run far past the bound is stopped
        (``stalled``): a livelock is property 8's to report."""
        __tracebackhide__ = True
        reqs = self.engine.requests
        by_work = self.traits.stalls_running
        if by_work:
            bound = sum(r.s + r.o for r in reqs if r.finish < 0)
            name = "Σ(s+o) + progress lost to preemption"
        else:
            bound = sum(service_slots(r.s, r.o, self.params) for r in reqs if r.finish < 0)
            name = "Σ(s+o)" if self.params.token_budget is not None else "Σ(n(s)+o)"
        taken = 0
        lost = 0  # progress thrown away by preemptions during the drain (stalls_running only)
        if bound:
            self.exercised[8] += 1
        livelock = 20 * bound + 100
        while not self.engine.idle:
            limit = min(bound + lost, livelock) if self._on(8) else livelock
            if taken >= limit:
                if not self._on(8):
                    self.stalled = True
                    return taken
                stuck = [r.rid for r in reqs if r.finish < 0]
                shown = f"{bound} + {lost} lost" if by_work else f"{bound}"
                raise self.fail(
                    8,
                    None,
                    f"requests {stuck[:12]} still unfinished {taken} slots after arrivals stopped; "
                    f"bound {name} = {shown}",
                )
            before = {r.rid: r.progress for r in self.engine.active} if by_work else {}
            rec = self.step()
            if by_work:
                lost += sum(before.get(rid, 0) for rid in rec.preempted)
            taken += 1
        return taken


def audit_plan(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    *,
    select: Iterable[int] = ALL_PROPERTIES,
    spec: str | None = None,
    window: int = DEFAULT_WINDOW,
    margin: int | None = None,
    decide_timeout: float | None = None,
) -> Auditor:
    """Run ``plan`` to the end and drain, checking the selected properties
    after every slot; raise :class:`PropertyViolation` at the first failure."""
    __tracebackhide__ = True  # the user sees the property, the workload and the replay line
    aud = Auditor(scheduler, params, select=select, spec=spec, window=window, margin=margin, decide_timeout=decide_timeout)
    n = len(plan)
    i = 0
    while i < n:
        if aud.engine.idle and int(plan.slot[i]) > aud.engine.slot:
            aud.engine.skip_to(int(plan.slot[i]))  # an idle gap checks nothing
        t = aud.engine.slot
        while i < n and int(plan.slot[i]) == t:
            aud.arrive(int(plan.s[i]), int(plan.o[i]))
            i += 1
        if i >= n:
            break  # this slot's arrivals are the last: drain from here
        aud.step()
    aud.drain()
    return aud
