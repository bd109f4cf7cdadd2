"""The ``kvstab`` command line.

Sub-commands live beside the code they drive: this module registers
``simulate`` and ``schedulers`` and asks each sub-package's ``cli`` module
(``kvstab.theory.cli``, ``kvstab.proofs.cli``, ``kvstab.empirical.cli``) to
register its own through ``register(subparsers)``.  A command's function
returns an exit status; any :class:`~kvstab.errors.KvstabError` becomes one
line on stderr and exit status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from kvstab.errors import InvalidArgument, KvstabError

__all__ = ["main", "build_parser", "add_model_arguments", "positive_float", "positive_int"]

#: modules that add sub-commands (each defines ``register(subparsers)``)
COMMAND_MODULES = ("kvstab.replay", "kvstab.checks", "kvstab.theory.cli", "kvstab.proofs.cli", "kvstab.empirical.cli", "kvstab.live.cli")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def _typed(kind: Callable[[str], Any], test: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not test(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return v

    conv.__name__ = what
    return conv


positive_int = _typed(int, lambda v: v > 0, "a positive integer")
positive_float = _typed(float, lambda v: v > 0 and v != float("inf"), "a positive number")
nonneg_int = _typed(int, lambda v: v >= 0, "a non-negative integer")
fraction = _typed(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The server and workload flags shared by commands (defaults: the paper's 1:1 setting)."""
    from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M

    p.add_argument("--workload", default="paper-1:1", help="workload spec (default paper-1:1: s, o ~ U(10, 1600))")
    p.add_argument("--M", type=positive_int, default=PAPER_M, help=f"KV capacity in tokens (default {PAPER_M})")
    p.add_argument("--chunk", type=positive_int, default=PAPER_CHUNK, help=f"prefill chunk ŝ (default {PAPER_CHUNK})")
    p.add_argument("--bbar", type=positive_float, default=PAPER_BBAR, help=f"batch time b̄ in s (default {PAPER_BBAR})")
    p.add_argument("--block", type=positive_int, default=1, help="KV block size B in tokens (default 1)")
    p.add_argument("--g", choices=("exact", "continuous"), default="exact", help="g convention (default exact)")


def _params(args: argparse.Namespace) -> Any:
    from kvstab.model import ModelParams

    return ModelParams(
        M=args.M,
        chunk=args.chunk,
        block=args.block,
        g=args.g,
        max_num_seqs=getattr(args, "max_num_seqs", None),
    )


class _ProgressBar:
    """A progress bar that appears only once a run has taken a second, on a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, slot: int) -> None:
        if not self.enabled or slot % 256:
            return
        if self.bar is None:
            if time.perf_counter() - self.start < 1.0:
                return
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("simulating"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} slots"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("sim", total=self.total)
        self.bar.update(self.task, completed=slot)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _cmd_simulate(args: argparse.Namespace) -> int:
    from kvstab.arrivals import poisson_arrivals, trace_arrivals
    from kvstab.metrics import queue_slope, throughput, utilisation
    from kvstab.registry import load_scheduler
    from kvstab.simulator import simulate
    from kvstab.theory import stability_report
    from kvstab.theory.certified import policy_guarantee
    from kvstab.traces import load_trace
    from kvstab.workload import parse_workload

    params = _params(args)
    scheduler = load_scheduler(args.scheduler)
    workload = parse_workload(args.workload)
    theory = stability_report(workload, params, args.bbar)
    mu_formula = theory.mu_per_s
    delta = theory.delta  # uses the block-rounded peak, what a request really needs
    if workload_min_peak(workload, params) > params.M:
        raise InvalidArgument(
            f"no request of workload {workload.describe()!r} fits in M={params.M} (the smallest needs "
            f"{workload_min_peak(workload, params)} tokens at its peak); raise --M"
        )
    certified, certified_why = policy_guarantee(scheduler, params, workload, mu_formula)
    if args.trace_arrivals:
        trace = load_trace(args.trace_arrivals)
        plan = trace_arrivals(trace, args.bbar, args.time_scale)
        slots = args.slots if args.slots_given else int(plan.slot[-1]) + 1
        rate = len(plan) / (slots * args.bbar)
        source = f"trace {args.trace_arrivals} (time x{args.time_scale})"
    else:
        rate = args.rate if args.rate is not None else args.load * mu_formula
        slots = args.slots
        plan = poisson_arrivals(workload, rate, args.bbar, slots, seed=args.seed)
        source = f"Poisson, seed {args.seed}"
    plan = plan.fit_to(params, drop_oversize=args.drop_oversize)
    bar = _ProgressBar(slots, enabled=not args.json and not args.no_progress)
    t0 = time.perf_counter()
    try:
        res = simulate(scheduler, params, plan, slots, window=args.window, on_slot=bar)
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    thr = throughput(res, args.warmup)
    slope = queue_slope(res, args.warmup)
    completed = int(res.completed.sum())
    out = {
        "scheduler": scheduler.name,
        "workload": workload.describe(),
        "arrivals": source,
        "M": params.M,
        "chunk": params.chunk,
        "block": params.block,
        "bbar_s": args.bbar,
        "slots": res.slots,
        "warmup_fraction": args.warmup,
        "arrival_rate_per_s": rate,
        "offered_load_lambda_over_mu": rate / mu_formula,
        "arrived": int(res.arrived.sum()),
        "completed": completed,
        "dropped_oversize": plan.dropped,
        "throughput_per_slot": thr.value,
        "throughput_per_slot_ci95": [thr.low, thr.high],
        "throughput_per_s": thr.value / args.bbar,
        "throughput_per_s_ci95": [thr.low / args.bbar, thr.high / args.bbar],
        "queue_growth_per_slot": slope.value,
        "queue_growth_per_slot_ci95": [slope.low, slope.high],
        "in_system_at_end": int(res.in_system[-1]),
        "memory_utilisation": utilisation(res, args.warmup),
        "preemptions": int(res.preempted.sum()),
        "preemptions_per_completion": int(res.preempted.sum()) / completed if completed else None,
        "wasted_area_fraction": float(res.wasted.sum() / max(1, res.memory.sum())),
        "E_g_tokens_slots": theory.E_g,
        "mu_formula_per_s": mu_formula,
        "mu_formula_per_slot": mu_formula * args.bbar,
        "delta": delta,
        "mu_1_minus_delta_per_s": theory.guarantee_per_s,
        "policy_certified_rate_per_s": certified,
        "policy_certified_rate_basis": certified_why,
        "measured_over_mu": (thr.value / args.bbar) / mu_formula,
        "wall_s": wall,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    _print_simulate(out)
    return 0


def _print_simulate(o: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False)
    c.print(
        f"kvstab simulate: {o['scheduler']} on {o['workload']}, M={o['M']}, ŝ={o['chunk']}, B={o['block']}, "
        f"b̄={o['bbar_s']} s, {o['slots']} slots ({o['arrivals']}), warm-up {o['warmup_fraction']:.0%} excluded"
    )
    t = Table(show_header=True, header_style="bold")
    t.add_column("quantity")
    t.add_column("measured", justify="right")
    t.add_column("formula", justify="right")
    lo, hi = o["throughput_per_s_ci95"]
    t.add_row(
        "throughput (req/s)",
        f"{o['throughput_per_s']:.4f}  [{lo:.4f}, {hi:.4f}]",
        f"μ = {o['mu_formula_per_s']:.4f}",
    )
    lo, hi = o["throughput_per_slot_ci95"]
    t.add_row("throughput (req/slot)", f"{o['throughput_per_slot']:.5f}  [{lo:.5f}, {hi:.5f}]", f"μ·b̄ = {o['mu_formula_per_slot']:.5f}")
    t.add_row("arrival rate λ (req/s)", f"{o['arrival_rate_per_s']:.4f}", f"λ/μ = {o['offered_load_lambda_over_mu']:.3f}")
    md = o["mu_1_minus_delta_per_s"]
    t.add_row(
        "paper's μ(1−δ)",
        "",
        f"{md:.4f}  (δ = {o['delta']:.4f})" if md is not None else f"none: δ = {o['delta']:.3f} ≥ 1",
    )
    cr = o["policy_certified_rate_per_s"]
    t.add_row("certified stable below", "", f"{cr:.4f}" if cr is not None else "none")
    lo, hi = o["queue_growth_per_slot_ci95"]
    t.add_row("queue growth (req/slot)", f"{o['queue_growth_per_slot']:+.5f}  [{lo:+.5f}, {hi:+.5f}]", "> 0 if λ > μ")
    t.add_row("in system at end", str(o["in_system_at_end"]), "")
    t.add_row("memory utilisation", f"{o['memory_utilisation']:.4f}", "")
    ppc = o["preemptions_per_completion"]
    t.add_row("preemptions", f"{o['preemptions']} ({ppc:.3f} per completion)" if ppc is not None else str(o["preemptions"]), "")
    t.add_row("wasted area / served area", f"{o['wasted_area_fraction']:.4f}", "")
    t.add_row("completed / arrived", f"{o['completed']} / {o['arrived']}", "")
    if o["dropped_oversize"]:
        t.add_row("dropped (s+o > M)", str(o["dropped_oversize"]), "")
    c.print(t)
    c.print(f"certified rate: {o['policy_certified_rate_basis']}")
    c.print(f"measured / μ = {o['measured_over_mu']:.4f}   ({o['wall_s']:.1f} s wall)")


def workload_min_peak(workload: Any, params: Any) -> int:
    """The smallest peak memory ``B⌈(s + o)/B⌉`` a request of ``workload`` can need."""
    from kvstab.model import tokens_held

    if workload.s is not None and workload.o is not None:
        least = workload.s.min + workload.o.min
    else:
        least = int((workload.joint_s + workload.joint_o).min())
    return int(tokens_held(least, params.block))


def _cmd_schedulers(args: argparse.Namespace) -> int:
    from kvstab.contract import traits_of
    from kvstab.registry import registry

    rows = []
    for s in registry():
        tags = traits_of(s).tags()
        rows.append({"name": s.name, "description": s.description, "tags": tags})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every available sub-command."""
    parser = _Parser(prog="kvstab", description="Verify the stability of LLM inference under KV-cache limits.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sim = sub.add_parser("simulate", help="run the reference simulator and compare throughput with μ")
    sim.add_argument("--scheduler", default="current-fit", help="registered name or module:attr (default current-fit)")
    add_model_arguments(sim)
    rate = sim.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=positive_float, default=None, help="arrival rate λ in requests/s")
    rate.add_argument("--load", type=positive_float, default=1.2, help="λ as a multiple of μ (default 1.2: overload, measures the saturated rate)")
    rate.add_argument("--trace-arrivals", metavar="PATH", default=None, help="replay a trace's own arrival times and lengths")
    sim.add_argument("--time-scale", type=positive_float, default=1.0, help="with --trace-arrivals: multiply arrival times")
    sim.add_argument("--slots", type=positive_int, default=None, help="slots to simulate (default 20000)")
    sim.add_argument("--seed", type=nonneg_int, default=0, help="seed of the arrival generator (default 0)")
    sim.add_argument("--warmup", type=fraction, default=0.25, help="warm-up fraction excluded from estimates (default 0.25)")
    sim.add_argument("--max-num-seqs", type=positive_int, default=None, help="cap on running requests")
    sim.add_argument("--window", type=positive_int, default=8, help="initial queue-head window shown to the rule")
    sim.add_argument("--drop-oversize", action="store_true", help="drop requests whose s+o exceeds M (and report how many)")
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.set_defaults(func=_cmd_simulate)

    sch = sub.add_parser("schedulers", help="list the registered schedulers")
    sch.add_argument("--json", action="store_true")
    sch.set_defaults(func=_cmd_schedulers)

    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # the sub-package has no CLI (yet); anything else is a real error
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvstab`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "command", None) == "simulate":
        args.slots_given = args.slots is not None
        if args.slots is None:
            args.slots = 20_000
    try:
        return int(args.func(args) or 0)
    except KvstabError as exc:
        sys.stderr.write(f"kvstab {args.command}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"kvstab {args.command}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
