"""``kvstab replay`` and ``kvstab check``: one concrete workload, slot by slot.

Both take the same flags (scheduler, server, queue window, arrivals), so a
``kvstab replay …`` line printed with a counterexample becomes a ``kvstab
check …`` line by changing one word.  Command-line floor: the runs are
:func:`kvstab.replay.replay` and :func:`kvstab.testing.checks.audit_plan`.  ``replay``
runs on the fast engine where it gives the reference's records (``--engine``);
``check`` checks its properties on the reference engine's states, slot by slot
(the per-slot property checks keep the oracle).
"""

from __future__ import annotations

import argparse
import sys

from kvstab import validation
from kvstab.cli import flags
from kvstab.errors import InvalidArgument
from kvstab.jsonform import dumps
from kvstab.model import ModelParams
from kvstab.simulator import SlotRecord

__all__ = ["register", "add_workload_arguments", "run_replay", "run_check"]


def add_workload_arguments(p: argparse.ArgumentParser, *, timeout: bool = True) -> None:
    """The flags that name a concrete run (scheduler, server, window, arrivals),
    shared by ``kvstab replay`` and ``kvstab check`` so their commands are interchangeable."""
    flags.add_run_arguments(p, timeout=timeout)
    flags.add_server_arguments(p, required=("M", "chunk"), omit=("g", "bbar"))
    flags.add_prefix_caching(p, follows_engine=False)
    p.add_argument(
        "--requests", default="",
        help="arrivals as SLOT:S:O,SLOT:S:O,… (SLOT:S:O:P: the prompt starts with P tokens of one prefix shared "
        "by every such item, for --prefix-caching on)",
    )


def _params(args: argparse.Namespace) -> ModelParams:
    return flags.server_params(args)


def _window_note(spec: str, window: int, hid: int) -> str | None:
    """A note when the queue window hid requests from a rule that may look past
    the queue's head (one declaring ``fcfs`` admits in queue order, so what
    lies behind a blocked head cannot change its decisions)."""
    from kvstab.contract import traits_of
    from kvstab.registry import load_scheduler

    if not hid or traits_of(load_scheduler(spec)).fcfs:
        return None
    return (
        f"note: the queue window ({window}) hid waiting requests from the rule in {hid} slot(s); a rule that is "
        "not head-of-line may decide differently with a wider --window"
    )


def run_replay(args: argparse.Namespace) -> int:
    """``kvstab replay``: exit 1 if the run breaks the memory invariant, 2 if it did not finish, else 0."""
    from kvstab.engine.fast_replay import FAST_SPAN, replay_fast, why_not_fast
    from kvstab.registry import load_scheduler
    from kvstab.replay import parse_requests, parse_state, replay

    params = _params(args)
    plan = parse_requests(args.requests).fit_to(params, drop_oversize=args.drop_oversize)
    if plan.dropped:
        print(f"kvstab replay: --drop-oversize: left out {plan.dropped} request(s) whose peak exceeds M={params.M}",
              file=sys.stderr)
    act, wait = parse_state(args.active, args.waiting)
    out = None
    why = "asked for"
    if params.prefix_caching:  # the compiled replay has no pool: the reference engine replays it
        why = "prefix caching: the reference engine replays the block pool"
        if args.engine == "fast":
            raise InvalidArgument(f"no fast replay for this run: {why}; use --engine reference (or auto)")
    elif args.engine != "reference":  # the fast engine where it gives the reference's records
        sched = load_scheduler(args.scheduler)
        why = why_not_fast(sched, plan, args.slots, act, wait, flags.asked_decide_timeout(args))
        if not why:
            out = replay_fast(sched, params, plan, args.slots, 100_000, args.window)
            why = "" if out is not None else f"the plan does not drain within the fast engine's {FAST_SPAN} slots"
        if out is None and args.engine == "fast":
            raise InvalidArgument(f"no fast replay for this run: {why}; use --engine reference (or auto)")
    if out is None:
        out = replay(
            args.scheduler, params, plan, active=act, waiting=wait, slots=args.slots, window=args.window,
            decide_timeout=flags.decide_limit(args, load_scheduler(args.scheduler)), why=why,
        )  # fmt: skip
    if args.json:
        print(
            dumps(
                {
                    "scheduler": args.scheduler,
                    "engine": out.engine,
                    "engine_reason": out.engine_reason,
                    "window": out.window,
                    "window_hid_slots": out.window_hid_slots,
                    "slots": [
                        {
                            "slot": r.slot,
                            "arrived": r.arrived,
                            "admitted": list(r.admitted),
                            "preempted": list(r.preempted),
                            "completed": list(r.completed),
                            "memory": r.memory,
                            "queue": r.queue,
                        }
                        for r in out.records
                    ],
                    "violation": str(out.violation) if out.violation else None,
                    "violation_slot": out.violation.slot if out.violation else None,
                    "violation_memory": out.violation.memory if out.violation else None,
                    "pending": out.pending,
                },
                indent=2,
            )
        )
    else:
        print(f"{'slot':>5} {'memory':>8} {'M':>8} {'queue':>6}  admitted / preempted / completed")
        for r in out.records:
            print(
                f"{r.slot:>5} {r.memory:>8} {params.M:>8} {r.queue:>6}  "
                f"{list(r.admitted)} / {list(r.preempted)} / {list(r.completed)}"
            )
        if out.violation is not None:
            row = out.violation.record
            if isinstance(row, SlotRecord):  # the breaking slot's own row, marked
                print(
                    f"{row.slot:>5} {row.memory:>8} {params.M:>8} {row.queue:>6}  "
                    f"{list(row.admitted)} / {list(row.preempted)} / {list(row.completed)}   <- breaks the invariant"
                )
            print(f"VIOLATION reproduced: {out.violation}")
        elif out.pending:
            print(
                f"stopped after {len(out.records)} simulated slots: {out.pending} request(s) not yet arrived or unfinished"
            )
        else:
            print("no invariant violation")
        note = _window_note(args.scheduler, out.window, out.window_hid_slots)
        if note:
            print(note)
        print(f"({out.engine} engine: {out.engine_reason})")
    if out.violation is not None:
        return 1
    if out.pending:
        sys.stderr.write(f"kvstab replay: error: the replay stopped with {out.pending} request(s) not run to the end\n")
        return 2
    return 0


def run_check(args: argparse.Namespace) -> int:
    """``kvstab check``: exit 1 and print the violation if the workload breaks a property, else 0."""
    from kvstab.registry import load_scheduler
    from kvstab.replay import parse_requests
    from kvstab.testing.checks import ALL_PROPERTIES, PropertyViolation, audit_plan

    if not args.requests.strip():
        raise InvalidArgument(
            "--requests is empty: kvstab check audits one concrete workload; give it as --requests SLOT:S:O,…"
        )
    params = _params(args)
    if params.prefix_caching:
        raise InvalidArgument(
            "kvstab check states its per-slot properties without shared blocks (the theory of sharing is still "
            "to come): check with --prefix-caching off, or watch the run with kvstab replay --prefix-caching on"
        )
    plan = parse_requests(args.requests)
    sched = load_scheduler(args.scheduler)
    try:
        aud = audit_plan(
            sched,
            params,
            plan,
            spec=args.scheduler,
            window=args.window,
            select=args.properties or ALL_PROPERTIES,
            margin=args.margin,
            decide_timeout=flags.decide_limit(args, sched),
        )
    except PropertyViolation as exc:
        print(f"VIOLATION reproduced: {exc}")
        return 1
    print(f"all properties hold: {len(plan)} request(s), all finished by slot {aud.engine.slot - 1}")
    note = _window_note(args.scheduler, aud.engine.window, aud.engine.window_hid_slots)
    if note:
        print(note)
    return 0


_property_number = flags.arg_type(
    lambda name, v: validation.as_int(name, v, minimum=1, maximum=8), "the property number"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab replay`` and ``kvstab check``."""
    p = sub.add_parser(
        "replay",
        help="replay a concrete workload slot by slot (the fast engine for built-ins, else the reference simulator)",
    )
    add_workload_arguments(p)
    p.add_argument("--active", default="", help="starting active requests as S:O:PROGRESS,… (admission order)")
    p.add_argument("--waiting", default="", help="starting queue as S:O,… (queue order)")
    p.add_argument("--slots", type=flags.slots, default=None, help="stop after this many slots (default: drain)")
    p.add_argument(
        "--engine",
        choices=("auto", "fast", "reference"),
        default="auto",
        help="auto (default): the compiled fast engine for a built-in with no starting state and no "
        "--decide-timeout (the same records), else the reference simulator; fast refuses a run it cannot "
        "replay exactly; reference: the readable slot loop",
    )
    p.add_argument("--json", action="store_true")
    # the error for a request that can never fit names this flag (kvstab.arrivals.ArrivalPlan.fit_to)
    p.add_argument("--drop-oversize", action="store_true",
                   help="leave out requests whose peak s + o exceeds M (and say how many)")
    p.set_defaults(func=run_replay)

    c = sub.add_parser(
        "check",
        help="run a workload through every property check of the audit suite (properties 1–8), slot by slot "
        "on the reference engine's states (the per-slot checks keep the reference engine as the oracle)",
    )
    add_workload_arguments(c)
    c.add_argument(
        "--property",
        type=_property_number,
        action="append",
        default=None,
        dest="properties",
        metavar="N",
        help="check only property N, 1-8 (repeatable; default: all)",
    )
    c.add_argument(
        "--margin",
        type=flags.nonneg_int,
        default=None,
        metavar="D",
        help="Δ for property 6 in place of the scheduler's declared margin (e.g. a proved one)",
    )
    c.set_defaults(func=run_check)
