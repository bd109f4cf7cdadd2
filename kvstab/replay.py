"""Replay a concrete workload (and optionally a starting state) in the reference
simulator, and build the one-line command that does it.

Every counterexample kvstab reports — a z3 refutation, a shrunk Hypothesis
failure — comes with such a command, so that a reader can re-run it and watch
the violation happen slot by slot.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import Engine, SlotRecord

__all__ = ["ReplayOutcome", "replay", "replay_command", "parse_requests", "parse_state", "add_workload_arguments"]


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What a replay did: the slot records, the violation it hit (if any), and
    how many requests had not arrived or not finished when it stopped."""

    records: tuple[SlotRecord, ...]
    violation: InvariantViolation | None
    pending: int = 0


def _triples(text: str, arity: int, what: str) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    if not text.strip():
        return out
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != arity:
            raise InvalidArgument(f"{what} item {item.strip()!r} must have {arity} ':'-separated integers")
        try:
            out.append(tuple(int(p) for p in parts))
        except ValueError:
            raise InvalidArgument(f"{what} item {item.strip()!r} must be integers") from None
    return out


def parse_requests(text: str) -> ArrivalPlan:
    """``"SLOT:S:O,SLOT:S:O,…"`` → an arrival plan."""
    rows = _triples(text, 3, "--requests")
    for slot, s, o in rows:
        if slot < 0 or s < 1 or o < 1:
            raise InvalidArgument(f"--requests item {slot}:{s}:{o}: need slot >= 0, s >= 1, o >= 1")
    return fixed_arrivals([(r[0], r[1], r[2]) for r in rows])


def parse_state(active: str, waiting: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """``"S:O:P,…"`` and ``"S:O,…"`` → a starting state."""
    act = [(r[0], r[1], r[2]) for r in _triples(active, 3, "--active")]
    wait = [(r[0], r[1]) for r in _triples(waiting, 2, "--waiting")]
    return act, wait


def replay(
    scheduler: str,
    params: ModelParams,
    plan: ArrivalPlan,
    *,
    active: list[tuple[int, int, int]] | None = None,
    waiting: list[tuple[int, int]] | None = None,
    slots: int | None = None,
    max_slots: int = 100_000,
) -> ReplayOutcome:
    """Run ``plan`` (from ``active``/``waiting`` if given) until it drains, the
    slot limit, or the first invariant violation."""
    eng = Engine(load_scheduler(scheduler), params)
    if active or waiting:
        eng.load_state(list(active or []), list(waiting or []))
    i, n, t = 0, len(plan), 0
    steps = 0  # slots actually simulated; idle gaps are skipped for free
    try:
        while steps < max_slots and (slots is None or t < slots):
            if eng.idle and i < n and int(plan.slot[i]) > t:
                t = int(plan.slot[i]) if slots is None else min(int(plan.slot[i]), slots)
                eng.skip_to(t)  # nothing happens in an idle gap
                continue
            while i < n and int(plan.slot[i]) == t:
                eng.arrive(int(plan.s[i]), int(plan.o[i]))
                i += 1
            eng.step()
            t += 1
            steps += 1
            if slots is None and i >= n and eng.idle:
                break
    except InvariantViolation as exc:
        return ReplayOutcome(tuple(eng.records), exc)
    unfinished = sum(1 for r in eng.requests if r.finish < 0)
    return ReplayOutcome(tuple(eng.records), None, pending=(n - i) + unfinished if slots is None else 0)


def replay_command(
    scheduler: str,
    params: ModelParams,
    plan: ArrivalPlan | list[tuple[int, int, int]],
    *,
    active: list[tuple[int, int, int]] | None = None,
    waiting: list[tuple[int, int]] | None = None,
) -> str:
    """The one-line ``kvstab replay …`` command for this workload."""
    if isinstance(plan, ArrivalPlan):
        rows = [(int(a), int(b), int(c)) for a, b, c in zip(plan.slot, plan.s, plan.o)]
    else:
        rows = list(plan)
    parts = ["kvstab", "replay", "--scheduler", scheduler, "--M", str(params.M), "--chunk", str(params.chunk)]
    if params.block != 1:
        parts += ["--block", str(params.block)]
    if params.max_num_seqs is not None:
        parts += ["--max-num-seqs", str(params.max_num_seqs)]
    if params.token_budget is not None:
        parts += ["--token-budget", str(params.token_budget)]
    parts += ["--requests", ",".join(f"{a}:{b}:{c}" for a, b, c in rows)]
    if active:
        parts += ["--active", ",".join(f"{s}:{o}:{p}" for s, o, p in active)]
    if waiting:
        parts += ["--waiting", ",".join(f"{s}:{o}" for s, o in waiting)]
    return " ".join(shlex.quote(p) for p in parts)


def _cmd_replay(args: argparse.Namespace) -> int:
    params = ModelParams(
        M=args.M, chunk=args.chunk, block=args.block, max_num_seqs=args.max_num_seqs, token_budget=args.token_budget
    )
    plan = parse_requests(args.requests)
    act, wait = parse_state(args.active, args.waiting)
    out = replay(args.scheduler, params, plan, active=act, waiting=wait, slots=args.slots)
    if args.json:
        print(
            json.dumps(
                {
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
            print(f"VIOLATION reproduced: {out.violation}")
        elif out.pending:
            print(f"stopped after {len(out.records)} simulated slots: {out.pending} request(s) not yet arrived or unfinished")
        else:
            print("no invariant violation")
    if out.violation is not None:
        return 1
    if out.pending:
        sys.stderr.write(f"kvstab replay: error: the replay stopped with {out.pending} request(s) not run to the end\n")
        return 2
    return 0


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that name a concrete run (scheduler, server, arrivals), shared by
    ``kvstab replay`` and ``kvstab check`` so their commands are interchangeable."""
    from kvstab.cli import positive_int

    p.add_argument("--scheduler", required=True, help="registered name or module:attr")
    p.add_argument("--M", type=positive_int, required=True, help="KV capacity in tokens")
    p.add_argument("--chunk", type=positive_int, required=True, help="prefill chunk ŝ")
    p.add_argument("--block", type=positive_int, default=1, help="KV block size B")
    p.add_argument("--max-num-seqs", type=positive_int, default=None)
    p.add_argument("--token-budget", type=positive_int, default=None)
    p.add_argument("--requests", default="", help="arrivals as SLOT:S:O,SLOT:S:O,…")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab replay`` to the CLI."""
    from kvstab.cli import positive_int

    p = sub.add_parser("replay", help="replay a concrete workload in the reference simulator, slot by slot")
    add_workload_arguments(p)
    p.add_argument("--active", default="", help="starting active requests as S:O:PROGRESS,… (admission order)")
    p.add_argument("--waiting", default="", help="starting queue as S:O,… (queue order)")
    p.add_argument("--slots", type=positive_int, default=None, help="stop after this many slots (default: drain)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_replay)
