"""``kvstab simulate``: run the model (fast or reference engine) and set its throughput beside ``μ``.

Command-line floor: argparse wiring and printing only; the run is
:func:`kvstab.engine.run` (streamed: no per-slot arrays) for a rule with a fast
path and :func:`kvstab.simulator.simulate` otherwise, the numbers it is compared
with come from :mod:`kvstab.theory`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from kvstab import validation
from kvstab.cli import flags
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.validation import MAX_SLOTS

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


def _same_trace(spec: str, path: str) -> bool:
    """Whether workload ``spec`` is the joint law of the trace at ``path``."""
    text = spec.strip()
    if not (text.startswith("trace(") and text.endswith(")")):
        return False
    inner = text[len("trace(") : -1].strip()
    try:
        return os.path.samefile(inner, path)
    except OSError:
        return False


def _workload_and_plan(args: argparse.Namespace, params: ModelParams) -> tuple[Any, Any, int, str]:
    """The workload the theory uses, the arrival plan, the slots to run and a
    description of the arrivals — refused before any work if they disagree."""
    from kvstab.arrivals import trace_arrivals
    from kvstab.traces import load_trace
    from kvstab.workload import Workload, parse_workload

    if args.trace_arrivals is None:
        if args.time_scale is not None:
            raise InvalidArgument("--time-scale scales a trace's arrival times; it needs --trace-arrivals PATH")
        workload = parse_workload(args.workload if args.workload is not None else "paper-1:1")
        return workload, None, args.slots if args.slots is not None else DEFAULT_SLOTS, ""
    path = args.trace_arrivals
    if args.workload is not None and not _same_trace(args.workload, path):
        raise InvalidArgument(
            f"--workload {args.workload!r} is not the law of the trace's own requests, which --trace-arrivals "
            f"replays: μ, δ and λ/μ would describe other requests; drop --workload (the trace's law is used) "
            f"or pass --workload 'trace({path})'"
        )
    trace = load_trace(path)
    workload = Workload.joint(trace.s, trace.o, name=f"trace({path})")
    scale = args.time_scale if args.time_scale is not None else 1.0
    plan = trace_arrivals(trace, params, scale)
    last = int(plan.slot[-1]) if len(plan) else 0
    if args.slots is None and last + 1 > MAX_SLOTS:
        raise InvalidArgument(
            f"trace {path} spans {last + 1} slots of b̄={params.bbar} s (more than {MAX_SLOTS}); pass --slots to "
            "simulate its beginning, or a smaller --time-scale"
        )
    slots = args.slots if args.slots is not None else last + 1
    return workload, plan, slots, f"trace {path} (time x{scale:g})"


def run(args: argparse.Namespace) -> int:
    """``kvstab simulate``: exit 0 with the table (or JSON) of a run."""
    from kvstab.arrivals import poisson_arrivals
    from kvstab.contract import traits_of
    from kvstab.registry import load_scheduler
    from kvstab.theory import stability_report
    from kvstab.theory.certified import policy_guarantee

    params = flags.server_params(args)
    scheduler = load_scheduler(args.scheduler)
    workload, trace_plan, slots, source = _workload_and_plan(args, params)
    workload.check_fits(params, drop_oversize=args.drop_oversize)
    # the server sees only the requests that fit: with --drop-oversize the theory is of the law given fitting
    law, fit_p = workload.given_fit(params) if args.drop_oversize else (workload, 1.0)
    theory = stability_report(law, params)
    mu_formula = theory.mu_per_s
    delta = theory.delta  # uses the block-rounded peak, what a request really needs
    certified, certified_why = policy_guarantee(scheduler, params, law, mu_formula)
    if trace_plan is None:
        # --load is the load of what reaches the server: λ·P(fit) = load·μ
        rate = args.rate if args.rate is not None else args.load * mu_formula / fit_p
        plan = poisson_arrivals(workload, rate, params, slots, seed=args.seed)
        source = f"Poisson, seed {args.seed}"
        plan = plan.fit_to(params, drop_oversize=args.drop_oversize)
        fit_rate = rate * fit_p
    else:
        # λ of what is offered inside the simulated window, not of all the trace's rows
        rate = int((trace_plan.slot < slots).sum()) / (slots * params.bbar)
        plan = trace_plan.fit_to(params, drop_oversize=args.drop_oversize)
        fit_rate = int((plan.slot < slots).sum()) / (slots * params.bbar)
    if slots - int(slots * args.warmup) < 4:
        raise InvalidArgument(
            f"--slots {slots} with --warmup {args.warmup:g} leaves {slots - int(slots * args.warmup)} slot(s) to "
            "estimate from; the batch-means estimates need at least 4 (pass more --slots or a smaller --warmup)"
        )
    bar = _ProgressBar(slots, enabled=not args.json and not args.no_progress)
    t0 = time.perf_counter()
    try:
        summ, hid, window, engine_used, engine_why = _run(args, scheduler, params, plan, slots, bar)
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    thr, slope = summ.throughput, summ.queue_slope
    assert thr is not None and slope is not None  # at least 4 steady slots, checked above
    completed = summ.completed
    out = {
        "scheduler": args.scheduler,
        "workload": workload.describe(),
        "arrivals": source,
        "M": params.M,
        "chunk": params.chunk,
        "block": params.block,
        "token_budget": params.token_budget,
        "max_num_seqs": params.max_num_seqs,
        "bbar_s": params.bbar,
        "slots": summ.slots,
        "window": window,
        # the compiled engine runs head-of-line built-ins, whose decisions the window never changes, and does
        # not count the slots it hid requests in: unknown (null) there, not 0
        "window_hid_slots": hid,
        "scheduler_traits": traits_of(scheduler).tags(),
        "warmup_fraction": args.warmup,
        "arrival_rate_per_s": rate,
        "fitting_rate_per_s": fit_rate,
        "offered_load_lambda_over_mu": fit_rate / mu_formula,
        "arrived": summ.arrived,
        "completed": completed,
        "dropped_oversize": plan.dropped,
        "theory_workload": law.describe(),
        "fit_probability": fit_p,
        "theory_note": (
            f"μ, E[g] and δ are of {law.describe()}: the law given s + o fitting in M (P = {fit_p:.4g}), what reaches "
            "the server; λ/μ counts the requests that fit"
        ) if law is not workload else None,
        "throughput_per_slot": thr.value,
        "throughput_per_slot_ci95": [thr.low, thr.high],
        "throughput_per_s": thr.value / params.bbar,
        "throughput_per_s_ci95": [thr.low / params.bbar, thr.high / params.bbar],
        "queue_growth_per_slot": slope.value,
        "queue_growth_per_slot_ci95": [slope.low, slope.high],
        "in_system_at_end": summ.arrived - completed,
        "memory_utilisation": summ.utilisation,
        "preemptions": summ.preemptions,
        "preemptions_per_completion": summ.preemptions / completed if completed else None,
        "wasted_area_fraction": summ.waste_fraction,
        "latency_slots": summ.latency,
        "E_g_tokens_slots": theory.E_g,
        "mu_formula_per_s": mu_formula,
        "mu_formula_per_slot": mu_formula * params.bbar,
        "delta": delta,
        "mu_1_minus_delta_per_s": theory.guarantee_per_s,
        "policy_certified_rate_per_s": certified,
        "policy_certified_rate_basis": certified_why,
        "measured_over_mu": (thr.value / params.bbar) / mu_formula,
        "engine": engine_used,
        "engine_reason": engine_why,
        "wall_s": wall,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    _print(out)
    return 0


def _print(o: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
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
    t.add_row("arrival rate λ (req/s)", f"{o['arrival_rate_per_s']:.4f}", f"λ/μ = {o['offered_load_lambda_over_mu']:.3f}"
              if o["theory_note"] is None else f"λ·P(fit)/μ = {o['offered_load_lambda_over_mu']:.3f}")
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
    lat = o["latency_slots"]
    if lat:
        t.add_row("latency p50 / p90 / p99 (slots)", f"{lat['p50']:.0f} / {lat['p90']:.0f} / {lat['p99']:.0f}", "")
    t.add_row("completed / arrived", f"{o['completed']} / {o['arrived']}", "")
    if o["dropped_oversize"]:
        t.add_row("dropped (s+o > M)", str(o["dropped_oversize"]), "")
    if o["window_hid_slots"] and "fcfs" not in o["scheduler_traits"]:  # a head-of-line rule is not affected by what lies behind its head
        t.add_row("slots the queue window hid requests", f"{o['window_hid_slots']} (window {o['window']})", "")
    c.print(t)
    if o["theory_note"] is not None:
        c.print(escape(f"dropped {o['dropped_oversize']} request(s) that cannot fit; {o['theory_note']}"))
    c.print(f"certified rate: {o['policy_certified_rate_basis']}")
    c.print(f"measured / μ = {o['measured_over_mu']:.4f}   ({o['wall_s']:.1f} s wall, {o['engine']} engine: {o['engine_reason']})")


def _run(
    args: argparse.Namespace, scheduler: Any, params: Any, plan: Any, slots: int, bar: _ProgressBar
) -> tuple[Any, int | None, int, str, str]:
    """Run on the engine ``--engine`` asks for: the fast engine where a built-in
    has a compiled path (identical results, see docs/engine.md), the reference
    engine otherwise — plug-ins keep it, so their faults are named by spec and
    ``--decide-timeout`` applies.  Returns the run's :class:`~kvstab.engine.stream.Summary`,
    the slots the queue window hid requests in (``None`` where the engine does not count
    them), the window at the end (the reference engine widens it), the engine and why.

    The fast engine streams: it keeps the batch-means sums and the per-request table, not
    one row per slot, so 10⁶ requests fit in a few hundred MB; the reference engine records
    every slot (it is the oracle, and plug-in faults need the record)."""
    from kvstab.engine import run as engine_run
    from kvstab.engine.driver import has_fast_path
    from kvstab.engine.stream import StreamStats
    from kvstab.simulator import simulate

    if args.engine == "fast" or (args.engine == "auto" and has_fast_path(scheduler)):
        out = engine_run(
            scheduler, params, plan, slots, window=args.window, engine="fast", progress=lambda t, _n: bar(t),
            record=False, warmup=args.warmup,
        )
        # the compiled engine runs head-of-line built-ins, whose decisions the window never changes, and does
        # not count the slots it hid requests in: unknown (None), not 0
        return out.summary, None, args.window, out.engine, out.reason
    why = "asked for" if args.engine == "reference" else "the scheduler has no compiled fast path"
    res = simulate(
        scheduler, params, plan, slots, window=args.window, on_slot=bar, spec=args.scheduler,
        decide_timeout=args.decide_timeout,
    )
    return StreamStats.of_result(res, True, args.warmup), res.window_hid_slots, res.window, "reference", why


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab simulate``."""
    sim = sub.add_parser("simulate", help="simulate a scheduler (fast or reference engine) and compare throughput with μ")
    flags.add_run_arguments(sim, scheduler_default="current-fit")
    sim.add_argument(
        "--workload", default=None,
        help="workload spec (default paper-1:1: s, o ~ U(10, 1600); with --trace-arrivals, the trace's own law)",
    )
    flags.add_server_arguments(sim)
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
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    sim.add_argument("--no-progress", action="store_true", help="no progress bar")
    sim.set_defaults(func=run)
