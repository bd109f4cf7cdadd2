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
from kvstab.prefix import Prompt, PromptSet, content_id
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


#: the content id of the one shared prefix a ``--requests`` line can name (``SLOT:S:O:P``)
SHARED_PREFIX = content_id("shared", 0)


def parse_requests(text: str) -> ArrivalPlan:
    """``"SLOT:S:O,SLOT:S:O,…"`` → an arrival plan (slots ≥ 0, lengths ≥ 1).

    An item may carry a fourth field, ``SLOT:S:O:P``: its prompt starts with the first
    ``P ≤ S`` tokens of one prefix all such items share (two items share ``min`` of their
    ``P``), the rest is its own — the content prefix caching finds
    (``--prefix-caching on``)."""
    rows: list[tuple[int, ...]] = []
    for item in (x for x in text.split(",") if x.strip()):
        four = item.strip().count(":") == 3
        names = ("SLOT", "S", "O", "P") if four else ("SLOT", "S", "O")
        (row,) = _rows(item, names, "--requests")
        if four and row[3] > row[1]:
            raise InvalidArgument(f"--requests item {item.strip()!r}: the shared prefix P={row[3]} exceeds S={row[1]}")
        rows.append(row)
    plan = fixed_arrivals([(r[0], r[1], r[2]) for r in rows])
    if not any(len(r) == 4 for r in rows):
        return plan
    # fixed_arrivals sorts by slot (stably): the prompts follow the same order
    order = sorted(range(len(rows)), key=lambda i: (rows[i][0], i))
    prompts = []
    for i in order:
        r = rows[i]
        shared = r[3] if len(r) == 4 else 0
        segs: list[tuple[int, int]] = [(SHARED_PREFIX, shared)] if shared else []
        if r[1] > shared:
            segs.append((content_id("own", i), r[1] - shared))
        prompts.append(Prompt(tuple(segs)))
    return ArrivalPlan(plan.slot, plan.s, plan.o, prompts=PromptSet.from_prompts(prompts))


def _shared_prefixes(plan: ArrivalPlan) -> list[int] | None:
    """Each request's ``P`` if every prompt of ``plan`` is the form ``--requests`` can write
    (a prefix of :data:`SHARED_PREFIX`, then content no other prompt has), else ``None``."""
    assert plan.prompts is not None
    out = []
    seen: set[int] = set()
    for i in range(len(plan)):
        segs = plan.prompts.prompt(i).segments
        shared = segs[0][1] if segs and segs[0][0] == SHARED_PREFIX else 0
        rest = segs[1:] if shared else segs
        if len(rest) > 1 or any(c in seen or c == SHARED_PREFIX for c, _ in rest):
            return None
        seen.update(c for c, _ in rest)
        out.append(shared)
    return out


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
    shared: list[int] | None = None
    if isinstance(plan, ArrivalPlan):
        rows = [(int(a), int(b), int(c)) for a, b, c in zip(plan.slot, plan.s, plan.o)]
        if params.prefix_caching and plan.prompts is not None:
            shared = _shared_prefixes(plan)
            if shared is None:
                raise InvalidArgument(
                    "this plan's prompts share more than one prefix: a --requests line names only one "
                    "(SLOT:S:O:P); replay it from Python with kvstab.replay.replay"
                )
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
    if params.prefix_caching:
        parts += ["--prefix-caching", "on"]
    if shared is not None:
        parts += ["--requests", ",".join(f"{a}:{b}:{c}:{p}" if p else f"{a}:{b}:{c}" for (a, b, c), p in zip(rows, shared))]
    else:
        parts += ["--requests", ",".join(f"{a}:{b}:{c}" for a, b, c in rows)]
    if active:
        parts += ["--active", ",".join(f"{s}:{o}:{p}" for s, o, p in active)]
    if waiting:
        parts += ["--waiting", ",".join(f"{s}:{o}" for s, o in waiting)]
    return " ".join(shlex.quote(p) for p in parts)
