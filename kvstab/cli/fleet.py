"""``kvstab fleet simulate|critical|routers`` and ``kvstab plan``.

Command-line floor: argument wiring and printing; the work is
:mod:`kvstab.fleet.simulate`, :mod:`kvstab.fleet.critical` and
:mod:`kvstab.fleet.plan`.  Bad input is one line on stderr and exit 2 (raised
as :class:`~kvstab.errors.InvalidArgument`, printed by ``kvstab.cli``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from kvstab import validation as v
from kvstab.cli import flags
from kvstab.errors import InvalidArgument
from kvstab.jsonform import dumps
from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M, ModelParams

__all__ = ["register", "parse_replica", "MAX_REPLICAS"]

#: the most replicas one command simulates (each is a simulation)
MAX_REPLICAS = 1024

_REPLICA_KEYS = ("count", "M", "chunk", "block", "token_budget", "max_num_seqs", "bbar", "scheduler", "name")

_horizon = flags.arg_type(v.positive_float, "the horizon in seconds", maximum=1e8)
_window = flags.arg_type(v.positive_float, "the window in seconds", maximum=1e8)
_scale = flags.arg_type(v.positive_float, "the time scale", maximum=1e6)
_tolerance = flags.arg_type(v.positive_float, "the tolerance (× Σμ)", maximum=0.5)
_seeds = flags.arg_type(v.positive_int, "the seeds per rate", maximum=1000)


def parse_replica(text: str) -> list[Any]:
    """``count=N,M=…,chunk=…,block=…,token_budget=…,max_num_seqs=…,bbar=…,scheduler=…,name=…``
    (every key optional; defaults: the paper's server and ``current-fit``) as
    ``count`` :class:`~kvstab.fleet.simulate.Replica` objects."""
    from kvstab.fleet.simulate import Replica

    kv: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in _REPLICA_KEYS:
            raise InvalidArgument(
                f"--replica {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(_REPLICA_KEYS)}"
            )
        if key in kv:
            raise InvalidArgument(f"--replica {text!r} gives {key} twice")
        kv[key] = value.strip()
    try:
        count = v.positive_int("count", kv.get("count", 1), maximum=MAX_REPLICAS)
        params = ModelParams(
            M=kv.get("M", PAPER_M),  # type: ignore[arg-type]
            chunk=kv.get("chunk", PAPER_CHUNK),  # type: ignore[arg-type]
            block=kv.get("block", 1),  # type: ignore[arg-type]
            token_budget=kv.get("token_budget"),  # type: ignore[arg-type]
            max_num_seqs=kv.get("max_num_seqs"),  # type: ignore[arg-type]
            # checked here under the key's own name and the command line's bound, as every --bbar is
            bbar=v.positive_float("bbar", kv.get("bbar", PAPER_BBAR), maximum=flags.MAX_BBAR),
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"--replica {text!r}: {exc}") from None
    sched = kv.get("scheduler", "current-fit")
    return [Replica(params, sched, kv.get("name", "")) for _ in range(count)]


def _replicas(args: argparse.Namespace) -> list[Any]:
    specs = args.replica or ["count=2"]
    out: list[Any] = []
    for s in specs:
        out += parse_replica(s)
        if len(out) > MAX_REPLICAS:
            raise InvalidArgument(f"at most {MAX_REPLICAS} replicas, got more")
    caching = _caching(args)
    # each replica is a server: caching as its engine runs by default unless --prefix-caching says
    return [dataclasses.replace(r, params=dataclasses.replace(r.params, prefix_caching=caching(r.scheduler)))
            for r in out]


def _caching(args: argparse.Namespace) -> Any:
    """Whether a replica of a scheduler (a spec) runs with prefix caching: ``--prefix-caching``, else as
    the engine modelled (vllm-v1 on, as vLLM's default; the paper's rules off; sglang refused on)."""
    from kvstab.registry import load_scheduler

    return lambda spec: flags.prefix_caching_for(args, load_scheduler(spec).name)


def _caching_note(replicas: list[Any], measured: float | None, mu_total: float) -> str:
    """The line a fleet command prints where replicas cache prefixes ("" where none does)."""
    from kvstab.fleet.simulate import caching_replicas

    cached = caching_replicas(replicas)
    if not cached:
        return ""
    ratio = "" if measured is None else f"; measured/Σμ = {measured / mu_total:.4f}"
    return (f"prefix caching on replica(s) {', '.join(cached)}, each on its own block pool (nothing is shared "
            f"across replicas; --prefix-caching off to compare): μ is the no-sharing formula, so measured/μ may "
            f"exceed 1{ratio}")


def _workload(args: argparse.Namespace, trace: Any) -> Any:
    from kvstab.workload import Workload, parse_workload

    if args.workload is not None:
        return parse_workload(args.workload)
    if trace is not None:
        return Workload.joint(trace.s, trace.o, name=f"trace({args.trace})")
    return parse_workload("paper-1:1")


def _load_trace(args: argparse.Namespace, need_times: bool = True) -> Any:
    if args.trace is None:
        return None
    from kvstab.data import TRACES, trace_path
    from kvstab.traces import load_trace

    path = str(trace_path(args.trace)) if args.trace in TRACES else args.trace
    if not os.path.isfile(path):
        raise InvalidArgument(f"--trace {args.trace!r}: no such file; shipped traces: {', '.join(sorted(TRACES))}")
    tr = load_trace(path)
    if need_times and tr.arrival is None:
        raise InvalidArgument(f"--trace {args.trace!r} records no arrival times: its rate is unknown; give --lambda")
    return tr


#: what ``--window`` and ``--time-scale`` are when a trace is given without them
DEFAULT_WINDOW_S = 60.0
DEFAULT_TIME_SCALE = 1.0


def _arrival_source(args: argparse.Namespace, trace: Any, what: str) -> None:
    """Exactly one of ``--lambda`` and ``--trace``; the flags that shape a trace's rate
    (``--window``, ``--time-scale``) refused with ``--lambda``, where they would do
    nothing, and their defaults filled in with ``--trace``."""
    if (args.lam is None) == (trace is None):
        raise InvalidArgument(f"give either --lambda ({what}) or --trace (the trace's own rate per window)")
    shaping = [flag for flag, value in (("--window", args.window), ("--time-scale", args.time_scale))
               if value is not None]  # fmt: skip
    if trace is None and shaping:
        raise InvalidArgument(
            f"{' and '.join(shaping)} shape{'' if len(shaping) > 1 else 's'} the rate of a --trace; with --lambda "
            f"{'they do' if len(shaping) > 1 else 'it does'} nothing: drop {' and '.join(shaping)} or give --trace"
        )
    if args.window is None:
        args.window = DEFAULT_WINDOW_S
    if args.time_scale is None:
        args.time_scale = DEFAULT_TIME_SCALE


def _rates(args: argparse.Namespace, trace: Any) -> tuple[Any, float]:
    """The trace's rate per ``--window`` of its own time, and the window's length,
    both on the simulated clock (``--time-scale`` multiplies the trace's times)."""
    from kvstab.fleet.arrivals import window_rates

    return window_rates(trace, args.window) / args.time_scale, args.window * args.time_scale


def _arrivals(args: argparse.Namespace, workload: Any, trace: Any, prompts: bool = False) -> Any:
    from kvstab.fleet.arrivals import piecewise_poisson, poisson_times

    _arrival_source(args, trace, "Poisson arrivals")
    if trace is not None:
        if args.horizon is not None:
            raise InvalidArgument(
                "--horizon is how long Poisson arrivals at --lambda run; a --trace runs for its own span: drop --horizon"
            )
        rates, window = _rates(args, trace)
        return piecewise_poisson(workload, rates, window, seed=args.seed, prompts=prompts)
    return poisson_times(workload, args.lam, args.horizon if args.horizon is not None else 600.0, seed=args.seed,
                         prompts=prompts)


def _est(e: Any) -> str:
    return "n/a" if e is None else f"{e.value:.5g} [{e.low:.5g}, {e.high:.5g}]"


def _pct(d: dict[str, float]) -> str:
    return "/".join(f"{d[k]:.3g}" for k in ("p50", "p90", "p99")) if d else "n/a"


def _cmd_simulate(args: argparse.Namespace) -> int:
    from kvstab.fleet.simulate import caching_replicas, simulate_fleet

    replicas = _replicas(args)
    trace = _load_trace(args)
    workload = _workload(args, trace)
    arrivals = _arrivals(args, workload, trace, prompts=bool(caching_replicas(replicas)))
    res = simulate_fleet(replicas, args.router, workload, arrivals, seed=args.seed, path=args.path)
    mu_total = sum(r.info.mu for r in res.replicas)
    measured = None if res.fleet.throughput is None else res.fleet.throughput.value
    note = _caching_note(replicas, measured, mu_total)
    if args.json:
        print(dumps({"workload": workload.describe(), **res.as_dict(),
                          "prefix_caching_replicas": caching_replicas(replicas),
                          "measured_over_mu": None if measured is None else measured / mu_total,
                          "prefix_caching_note": note or None}, indent=2))  # fmt: skip
        return 0
    print(f"kvstab fleet simulate: {len(replicas)} replicas, router {res.router}, {workload.describe()}, "
          f"{len(arrivals)} requests over {res.horizon_s:g} s (λ = {res.rate_per_s:.5g}/s)")  # fmt: skip
    print(f"  path: {res.path_text}")
    for line in res.theory.lines():
        print(f"  {line}")
    head = f"  {'replica':<14} {'μ_i/s':>9} {'arrived':>8} {'throughput/s [95%]':>30} {'growth/s [95%]':>30} {'util':>5} {'e2e p50/p90/p99 s':>20}"
    print(head)
    for i, r in enumerate(res.replicas):
        label = r.replica.name or f"{i}:{r.replica.scheduler}"
        st = r.stats
        print(f"  {label:<14} {r.info.mu:>9.4g} {st.arrived:>8} {_est(st.throughput):>30} {_est(st.queue_slope):>30} "
              f"{st.utilisation:>5.2f} {_pct(st.e2e_s):>20}")  # fmt: skip
    f = res.fleet
    print(f"  {'fleet':<14} {sum(r.info.mu for r in res.replicas):>9.4g} {f.arrived:>8} {_est(f.throughput):>30} "
          f"{_est(f.queue_slope):>30} {f.utilisation:>5.2f} {_pct(f.e2e_s):>20}")  # fmt: skip
    print(f"  fleet TTFT p50/p90/p99: {_pct(f.ttft_s)} s; preemptions {f.preemptions}; in system at the end {f.in_system_end}")
    if note:
        print(f"  {note}")
    return 0


def _cmd_critical(args: argparse.Namespace) -> int:
    from kvstab.fleet.arrivals import trace_rows_poisson
    from kvstab.fleet.critical import find_fleet_critical_rate

    replicas = _replicas(args)
    trace = _load_trace(args, need_times=False)
    workload = _workload(args, trace)
    draw = None
    if trace is not None:
        # the trace's rows in its order (lengths and, for a Mooncake trace, hash_ids) at the rate searched
        def draw(rate: float, horizon: float, seed: int, prompts: bool) -> Any:
            return trace_rows_poisson(trace, rate, horizon, seed, prompts=prompts)
    log = (lambda line: print(line, file=sys.stderr)) if not args.quiet else (lambda _l: None)
    cr = find_fleet_critical_rate(replicas, args.router, workload, horizon_s=args.horizon, tolerance=args.tolerance,
                                  seeds=args.seeds, seed=args.seed, log=log, draw=draw)  # fmt: skip
    out = {
        "router": cr.router, "critical_rate_per_s": cr.critical, "interval_per_s": [cr.low, cr.high],
        "threshold_per_s": cr.threshold, "mu_total_per_s": cr.mu_total, "theory_critical_per_s": cr.theory_rate,
        "saturated_throughput_per_s": None if cr.saturated is None else [cr.saturated.value, cr.saturated.low,
                                                                          cr.saturated.high],
        "resolved": cr.resolved, "notes": list(cr.notes),
        "measured_over_mu": None if cr.saturated is None else cr.saturated.value / cr.mu_total,
    }  # fmt: skip
    if args.json:
        print(dumps(out, indent=2))
        return 0
    print(f"kvstab fleet critical: {len(replicas)} replicas, router {cr.router}, {workload.describe()}")
    print(f"  Σ μ_i = {cr.mu_total:.5g}/s; the router's critical rate by theory: {cr.theory_rate:.5g}/s")
    print(f"  λ* = {cr.critical:.5g}/s [{cr.low:.5g}, {cr.high:.5g}]{'' if cr.resolved else ' (unresolved)'}"
          f" = {cr.critical / cr.theory_rate:.4f} × theory")  # fmt: skip
    print(f"  growth threshold h = {cr.threshold:.4g}/s: a rate is stable when its queue growth is below h, not below 0 "
          "(above λ* the growth is λ − λ*: the search finds λ* + h and reports λ* = that − h)")  # fmt: skip
    if cr.saturated is not None:
        print(f"  saturated throughput under overload: {_est(cr.saturated)}/s "
              f"(measured/Σμ = {cr.saturated.value / cr.mu_total:.4f})")
    for n in cr.notes:
        print(f"  note: {n}")
    return 0


def _cmd_routers(args: argparse.Namespace) -> int:
    from kvstab.fleet.routers import load_router, router_names

    for name in router_names():
        r = load_router(name)
        kind = "state-dependent (event loop)" if r.state_dependent else "state-independent (fast engine)"
        doc = (type(r).__doc__ or "").strip().splitlines()[0] if type(r).__doc__ else ""
        print(f"{name:<12} {kind:<34} {doc}")
    return 0


def _slo(metric: str) -> Any:
    def conv(text: str) -> Any:
        from kvstab.fleet.plan import SLO

        pct, eq, secs = text.partition("=")
        if not eq or pct.strip() not in ("p50", "p90", "p99"):
            raise argparse.ArgumentTypeError(f"{text!r} is not PCT=SECONDS with PCT one of p50, p90, p99 (e.g. p99=2.5)")
        try:
            return SLO(metric, pct.strip(), v.positive_float("the SLO in seconds", secs, maximum=1e8))
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return conv


def _markdown(plan: Any, ver: Any, source: str) -> str:
    lines = [
        "# kvstab plan",
        "",
        f"Load λ = {plan.lam:.5g} req/s ({source}), target utilisation ρ = {plan.rho:g}"
        f"{', on certified rates' if plan.guarantee else ''}; solver: {plan.solver}.",
        "",
        "| GPU type | M (tokens) | b̄ (s) | μ (req/s) | replicas | available | req/s routed | load per replica | cost/h |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    sharing = plan.sharing or (False,) * len(plan.types)
    for t, m, n, x, sh in zip(plan.types, plan.mus, plan.counts, plan.flows, sharing):
        load = f"{x / n / m:.3f}" if n else "—"
        lines.append(f"| {t.name} | {t.M} | {t.bbar:g} | {m:.4g}{' (sharing)' if sh else ''} | {n} | {t.available} | "
                     f"{x:.4g} | {load} | {n * t.cost_per_hour:.4g} |")  # fmt: skip
    if any(sharing):
        lines += ["", "μ (sharing): the saturated rate with the shared prompt held once on each replica's own block "
                      "pool (docs/theory.md, 'Prefix caching'), the least of memory, the running cap and the token "
                      "budget; the other types use the paper's μ."]
    lines += ["", f"**Cost: {plan.cost_per_hour:.4g} per hour**; capacity Σ n·μ = {plan.capacity:.5g} req/s.", ""]
    if ver is not None:
        d = ver.as_dict()
        lines += [
            f"Verified by simulation ({ver.path}, router {ver.router}, {ver.horizon_s:.4g} s): queue growth at λ "
            f"{ver.slope.value:+.4g} [{ver.slope.low:+.4g}, {ver.slope.high:+.4g}] req/s "
            f"({'stable' if ver.stable else 'NOT STABLE'}); measured capacity {ver.capacity.value:.5g} req/s; "
            f"**measured margin {100 * ver.margin:.1f} %** (planned 1 − λ/Σnμ = {100 * (1 - plan.lam / plan.capacity):.1f} %, "
            f"target ≥ 1 − ρ = {100 * (1 - plan.rho):.1f} %); "
            f"on {ver.latency_run}: KV utilisation {ver.utilisation:.2f}; TTFT p50/p90/p99 {_pct(ver.ttft_s)} s; "
            f"end-to-end {_pct(ver.e2e_s)} s.",
        ]
        if ver.prefix_caching:
            basis = ("μ with sharing where a type is marked so, else the no-sharing formula" if any(sharing)
                     else "the no-sharing formula (no closed form for this workload's prefix law)")
            lines.append(f"Prefix caching on replica(s) {', '.join(ver.prefix_caching)}, each on its own block pool "
                         f"(no sharing across replicas): the plan's μ is {basis}; measured capacity / "
                         f"planned Σ n·μ = {ver.measured_over_planned:.4f}.")
        for o in d["slo"]:
            lines.append(f"- SLO {o['objective']} ≤ {o['target_s']:g} s: measured {o['measured_s']:.4g} s — "
                         f"{'met' if o['met'] else 'MISSED'}")  # fmt: skip
        lines += ["", f"Verdict: {'PASS' if ver.passed else 'FAIL'}"]
    return "\n".join(lines)


def _cmd_plan(args: argparse.Namespace) -> int:
    from kvstab.fleet.plan import example_menu_path, load_menu, solve_plan, verify_plan

    menu = load_menu(args.menu if args.menu is not None else example_menu_path())
    caching = _caching(args)
    prompts = any(caching(t.scheduler) for t in menu)  # checked before any work (sglang refuses caching on)
    trace = _load_trace(args)
    workload = _workload(args, trace)
    arrivals = None
    _arrival_source(args, trace, "a target load")
    if trace is not None:
        from kvstab.fleet.arrivals import peak_window, piecewise_poisson

        rates, window = _rates(args, trace)
        w, lam = peak_window(rates)
        source = (f"peak of trace {args.trace}: window {w} of {len(rates)}, {args.window:g} s each"
                  f"{'' if args.time_scale == 1 else f', time ×{args.time_scale:g}'}")  # fmt: skip
        if not args.no_verify:
            # the trace's rate, replayed
            arrivals = piecewise_poisson(workload, rates, window, seed=args.seed, prompts=prompts)
    else:
        lam = args.lam
        source = "--lambda"
    plan = solve_plan(menu, workload, lam, args.rho, guarantee=args.guarantee, caching=caching)
    slos = [*(args.slo_ttft or []), *(args.slo_e2e or [])]
    ver = None
    if not args.no_verify:
        ver = verify_plan(plan, workload, router=args.router, horizon_s=args.horizon, slos=slos, seed=args.seed,
                          arrivals=arrivals, caching=caching)  # fmt: skip
    elif slos:
        raise InvalidArgument("--slo-ttft / --slo-e2e are checked by simulation; drop --no-verify")
    if args.json:
        print(dumps({"workload": workload.describe(), "source": source, "plan": plan.as_dict(),
                          "verification": None if ver is None else ver.as_dict()}, indent=2))  # fmt: skip
    else:
        print(_markdown(plan, ver, source))
    return 0 if ver is None or ver.passed else 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replica", action="append", metavar="SPEC",
                   help="a replica group: count=N,M=…,chunk=…,block=…,token_budget=…,max_num_seqs=…,bbar=…,"
                        "scheduler=…,name=… (repeatable; default: count=2 of the paper's server)")  # fmt: skip
    p.add_argument("--router", default="round-robin", help="router name[:arg] or module:attr (kvstab fleet routers)")
    p.add_argument("--workload", default=None, help="workload spec (default paper-1:1, or the trace's own law)")
    p.add_argument("--seed", type=flags.seed, default=0)
    p.add_argument("--json", action="store_true")
    _caching_flag(p)


def _caching_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefix-caching", dest="prefix_caching", type=_on_off, default=None, metavar="on|off",
        help="prefix caching on every replica, each on its own block pool (default: as each replica's engine "
        "runs — on for vllm-v1, as vLLM's default; off for the paper's rules and sglang); the static path runs "
        "it on the compiled cache engine, the event loop on reference engines with their own pools",
    )  # fmt: skip


def _on_off(text: str) -> bool:
    """``on`` or ``off``, as every command's ``--prefix-caching`` reads it."""
    return flags._on_off(text)


def register(subparsers: Any) -> None:
    """Add ``kvstab fleet …`` and ``kvstab plan`` to the ``kvstab`` parser."""
    fleet = subparsers.add_parser("fleet", help="replicas behind a router: simulate, critical rate, routers")
    sub = fleet.add_subparsers(dest="fleet_command", required=True, parser_class=type(fleet))

    sim = sub.add_parser("simulate", help="simulate a fleet behind a router")
    _common(sim)
    sim.add_argument("--lambda", dest="lam", type=flags.rate, default=None, help="Poisson arrival rate λ, req/s")
    sim.add_argument("--trace", default=None,
                     help="follow a trace's own arrival rate per window (a shipped name: azure-conv, azure-code, or a path)")  # fmt: skip
    sim.add_argument("--window", type=_window, default=None, help="with --trace: window of its rate, seconds of trace time (default 60)")
    sim.add_argument("--time-scale", type=_scale, default=None, help="with --trace: multiply its times by this factor (0.5: twice the rate; default 1)")
    sim.add_argument("--horizon", type=_horizon, default=None, help="with --lambda: seconds simulated (default 600)")
    sim.add_argument("--path", choices=("auto", "static", "event"), default="auto",
                     help="auto: fast engine for state-independent routers, else the event loop; event: always")  # fmt: skip
    sim.set_defaults(func=_cmd_simulate)

    crit = sub.add_parser("critical", help="the fleet's critical rate by bisection on the queue growth")
    _common(crit)
    crit.add_argument("--horizon", type=_horizon, default=600.0, help="seconds per replication (default 600)")
    crit.add_argument("--trace", default=None,
                      help="requests are a trace's rows in its order (lengths; a Mooncake trace's hash_ids as prompts) "
                           "at the Poisson rate searched: a shipped name (mooncake-conversation, …) or a path")  # fmt: skip
    crit.add_argument("--tolerance", type=_tolerance, default=0.02, help="half-width target × Σμ (default 0.02)")
    crit.add_argument("--seeds", type=_seeds, default=3, help="replications per rate (default 3)")
    crit.add_argument("--quiet", action="store_true", help="no progress on stderr")
    crit.set_defaults(func=_cmd_critical)

    rts = sub.add_parser("routers", help="list the registered routers")
    rts.set_defaults(func=_cmd_routers)

    plan = subparsers.add_parser("plan", help="the cheapest fleet from a GPU menu (MILP), verified by simulation")
    plan.add_argument("--menu", default=None, help="GPU menu, TOML or JSON (default: the shipped example)")
    plan.add_argument("--lambda", dest="lam", type=flags.rate, default=None, help="target load λ, req/s")
    plan.add_argument("--trace", default=None, help="plan for the peak window of a trace's own arrival rate")
    plan.add_argument("--window", type=_window, default=None, help="with --trace: window of its rate, seconds of trace time (default 60)")
    plan.add_argument("--time-scale", type=_scale, default=None, help="with --trace: multiply its times by this factor (0.5: twice the rate; default 1)")
    plan.add_argument("--workload", default=None, help="workload spec (default paper-1:1, or the trace's own law)")
    plan.add_argument("--rho", type=flags.unit_fraction, default=0.8, help="target utilisation ρ in (0, 1] (default 0.8)")
    plan.add_argument("--guarantee", action="store_true", help="plan on each scheduler's certified stable rate instead of μ (none for preempting schedulers)")
    plan.add_argument("--router", default=None, help="router for the verification (default weighted-rr with the plan's split)")
    plan.add_argument("--slo-ttft", type=_slo("ttft"), action="append", metavar="PCT=S", help="e.g. p99=2.5 (repeatable)")
    plan.add_argument("--slo-e2e", type=_slo("e2e"), action="append", metavar="PCT=S", help="e.g. p90=60 (repeatable)")
    plan.add_argument("--horizon", type=_horizon, default=None, help="verification horizon, seconds (default: 40 lifetimes)")
    plan.add_argument("--no-verify", action="store_true", help="solve only; no simulation")
    plan.add_argument("--seed", type=flags.seed, default=0)
    _caching_flag(plan)
    out = plan.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON output")
    out.add_argument("--markdown", action="store_true", help="Markdown output (the default)")
    plan.set_defaults(func=_cmd_plan)

