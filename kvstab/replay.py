"""Replay a concrete workload (and optionally a starting state) in the reference
simulator, and build the one-line command that does it.

Every counterexample kvstab reports — a z3 refutation, a shrunk Hypothesis
failure — comes with such a command, so that a reader can re-run it and watch
the violation happen slot by slot.  (:mod:`kvstab.engine.fast_replay` gives the
same records from the fast engine where it can; ``kvstab replay --engine``.)
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kvstab.arrivals import MAX_ARRIVAL_SLOT, ArrivalPlan, fixed_arrivals
from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import DEFAULT_WINDOW, Engine, SlotRecord
from kvstab.validation import MAX_TOKENS, as_int

__all__ = ["ReplayOutcome", "replay", "replay_command", "parse_requests", "parse_state"]


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
    why: str = "asked for",
) -> ReplayOutcome:
    """Run ``plan`` (from ``active``/``waiting`` if given) on the reference simulator until it
    drains, the slot limit, or the first invariant violation (``max_slots`` slots simulated,
    idle gaps skipped).  ``scheduler`` is a spec (registered name or ``module:attr``) or a
    scheduler object (then ``spec`` names it in messages); ``why`` is the outcome's
    ``engine_reason``.  :func:`kvstab.engine.fast_replay.replay` runs the same replay on the
    fast engine where it gives these records."""
    sched = load_scheduler(scheduler) if isinstance(scheduler, str) else scheduler
    name = scheduler if isinstance(scheduler, str) else spec
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
