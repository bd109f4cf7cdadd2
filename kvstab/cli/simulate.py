"""``kvstab simulate``: run the model (fast or reference engine) and set its throughput beside ``μ``.

Command-line floor: argparse wiring and printing only; the run and the
numbers it is compared with are the library's pipeline, the one the audit's
points run too (:func:`kvstab.audit.runs.prepare_simulation` and
:func:`kvstab.audit.runs.simulate_prepared`).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from kvstab import validation
from kvstab.cli import flags
from kvstab.jsonform import dumps

if TYPE_CHECKING:
    from kvstab.audit.runs import SimulationReport

__all__ = ["register", "run"]

#: slots simulated when neither --slots nor a trace says otherwise
DEFAULT_SLOTS = 20_000


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


def run(args: argparse.Namespace) -> int:
    """``kvstab simulate``: exit 0 with the table (or JSON) of a run."""
    from kvstab.audit.runs import prepare_simulation, simulate_prepared
    from kvstab.registry import load_scheduler

    scheduler = load_scheduler(args.scheduler)
    params = flags.server_params(args, prefix_caching=flags.prefix_caching_for(args, scheduler.name))
    setup = prepare_simulation(
        scheduler, params, workload=args.workload, trace=args.trace_arrivals, time_scale=args.time_scale,
        rate=args.rate, load=args.load, seed=args.seed,
        slots=args.slots if args.slots is not None or args.trace_arrivals is not None else DEFAULT_SLOTS, warmup=args.warmup,
        drop_oversize=args.drop_oversize,
    )
    bar = _ProgressBar(setup.slots, enabled=not args.json and not args.no_progress)
    try:
        report = simulate_prepared(
            args.scheduler, scheduler, params, setup, engine=args.engine, window=args.window,
            decide_timeout=flags.decide_limit(args, scheduler), progress=bar, lifecycle=args.lifecycle,
        )
    finally:
        bar.close()
    if args.json:
        print(dumps(report.to_json(), indent=2))
        return 0
    _print(report)
    return 0


def _print(o: SimulationReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    c = Console(highlight=False)
    c.print(
        f"kvstab simulate: {o.scheduler} on {o.workload}, M={o.params.M}, ŝ={o.params.chunk}, B={o.params.block}, "
        f"b̄={o.params.bbar} s, {o.slots} slots ({o.arrivals}), warm-up {o.warmup_fraction:.0%} excluded"
    )
    t = Table(show_header=True, header_style="bold")
    t.add_column("quantity")
    t.add_column("measured", justify="right")
    t.add_column("formula", justify="right")
    lo, hi = o.throughput_per_s_ci95
    t.add_row(
        "throughput (req/s)",
        f"{o.throughput_per_s:.4f}  [{lo:.4f}, {hi:.4f}]",
        f"μ = {o.theory.mu_per_s:.4f}",
    )
    lo, hi = o.throughput_per_slot_ci95
    t.add_row("throughput (req/slot)", f"{o.throughput_per_slot:.5f}  [{lo:.5f}, {hi:.5f}]", f"μ·b̄ = {o.theory.mu_per_s * o.params.bbar:.5f}")
    t.add_row("arrival rate λ (req/s)", f"{o.arrival_rate_per_s:.4f}", f"λ/μ = {o.offered_load_lambda_over_mu:.3f}"
              if o.theory_note is None else f"λ·P(fit)/μ = {o.offered_load_lambda_over_mu:.3f}")
    md = o.theory.guarantee_per_s
    t.add_row(
        "paper's μ(1−δ)",
        "",
        f"{md:.4f}  (δ = {o.theory.delta:.4f})" if md is not None else f"none: δ = {o.theory.delta:.3f} ≥ 1",
    )
    cr = o.certificate.certified_rate_per_s
    t.add_row("certified stable below", "", f"{cr:.4f}" if cr is not None else "none")
    lo, hi = o.queue_growth_per_slot_ci95
    t.add_row("queue growth (req/slot)", f"{o.queue_growth_per_slot:+.5f}  [{lo:+.5f}, {hi:+.5f}]", "> 0 if λ > μ")
    t.add_row("in system at end", str(o.in_system_at_end), "")
    t.add_row("memory utilisation", f"{o.memory_utilisation:.4f}", "")
    ppc = o.preemptions_per_completion
    t.add_row("preemptions", f"{o.preemptions} ({ppc:.3f} per completion)" if ppc is not None else str(o.preemptions), "")
    t.add_row("wasted area / served area", f"{o.wasted_area_fraction:.4f}", "")
    lat = o.latency_slots
    if lat:
        t.add_row("latency p50 / p90 / p99 (slots)", f"{lat['p50']:.0f} / {lat['p90']:.0f} / {lat['p99']:.0f}", "")
    t.add_row("completed / arrived", f"{o.completed} / {o.arrived}", "")
    if o.dropped_oversize:
        t.add_row("dropped (s+o > M)", str(o.dropped_oversize), "")
    if o.window_hid_slots and "fcfs" not in o.scheduler_traits:  # a head-of-line rule is not affected by what lies behind its head
        t.add_row("slots the queue window hid requests", f"{o.window_hid_slots} (window {o.window})", "")
    c.print(t)
    if o.lifecycle != "kvstab":
        c.print(f"request lifecycle: {o.lifecycle}'s (requests in its terms: o = max_tokens)")
    if o.prefix_caching:
        c.print(
            "prefix caching on (the default for vllm-v1, as vLLM's server runs it; --prefix-caching on|off sets it): "
            "shared prompt tokens are held once against M and skip their prefill, while μ above is the paper's "
            "no-sharing formula, so measured / μ may exceed 1"
        )
        ms = o.mu_sharing_per_s
        c.print(
            f"μ with sharing (docs/theory.md, 'Prefix caching') = {ms:.4f}/s; measured / μ_share = "
            f"{o.throughput_per_s / ms:.4f}" if ms is not None else
            "μ with sharing: no closed form for this workload's prefix law (none for chat or a trace)"
        )
    if o.theory_note is not None:
        c.print(escape(f"dropped {o.dropped_oversize} request(s) that cannot fit; {o.theory_note}"))
    c.print(f"certified rate: {o.certificate.certified_basis}")
    c.print(f"measured / μ = {o.measured_over_mu:.4f}   ({o.wall_s:.1f} s wall, {o.engine} engine: {o.engine_reason})")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab simulate``."""
    sim = sub.add_parser("simulate", help="simulate a scheduler (fast or reference engine) and compare throughput with μ")
    flags.add_run_arguments(sim, scheduler_default="current-fit")
    sim.add_argument(
        "--workload", default=None,
        help="workload spec (default paper-1:1: s, o ~ U(10, 1600); with --trace-arrivals, the trace's own law)",
    )
    flags.add_server_arguments(sim, caching=True)
    rate = sim.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=flags.rate, default=None, help="arrival rate λ in requests/s")
    rate.add_argument(
        "--load", type=flags.arg_type(validation.positive_float, "the load λ/μ", maximum=1e6), default=1.2,
        help="λ as a multiple of μ (default 1.2: overload, measures the saturated rate)",
    )
    rate.add_argument("--trace-arrivals", metavar="PATH", default=None, help="replay a trace's own arrival times and lengths")
    sim.add_argument(
        "--time-scale", type=flags.arg_type(validation.positive_float, "the time scale", maximum=1e6), default=None,
        help="with --trace-arrivals: multiply arrival times (default 1)",
    )
    sim.add_argument("--slots", type=flags.slots, default=None, help=f"slots to simulate (default {DEFAULT_SLOTS}, or a trace's span)")
    sim.add_argument("--seed", type=flags.seed, default=0, help="seed of the arrival generator (default 0)")
    sim.add_argument("--warmup", type=flags.fraction, default=0.25, help="warm-up fraction excluded from estimates (default 0.25)")
    sim.add_argument("--drop-oversize", action="store_true", help="drop requests whose s+o exceeds M (and report how many)")
    sim.add_argument(
        "--engine", choices=("auto", "fast", "reference"), default="auto",
        help="auto (default): the compiled fast engine for built-ins, the reference engine for plug-ins; "
        "fast refuses a scheduler without a fast path; reference: the readable slot loop",
    )
    sim.add_argument(
        "--lifecycle", choices=("kvstab", "vllm"), default="kvstab",
        help="request lifecycle: kvstab (default: a preempted request restarts from scratch) or vllm "
        "(vLLM's: output token 1 in the last prefill step, a preempted request keeps its outputs as prompt; "
        "requests in vLLM's terms, o = max_tokens)",
    )
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.set_defaults(func=run)
