"""``kvstab audit`` and ``kvstab sweep`` on the command line.

Bad input is one line and exit status 2, before any work: an unknown
scheduler, a workload that does not parse or does not fit, an ``--out`` that
cannot be written.  ``audit`` exits 0 on PASS (and on INCONCLUSIVE without
``--strict``), 1 on FAIL, 3 on INCONCLUSIVE with ``--strict``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from kvstab.errors import InvalidArgument
from kvstab.jsonform import dumps

__all__ = ["register", "writable_dir", "workload_spec"]


def writable_dir(path: str) -> Path:
    """``path`` as a folder that exists and can be written (created if needed);
    raise :class:`InvalidArgument` naming the folder otherwise."""
    d = Path(path)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".kvstab-write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InvalidArgument(f"--out {path!r} is not a writable folder ({exc.strerror or exc}); give one you can write") from None
    return d


def workload_spec(workload: str | None, trace: str | None) -> str:
    """The workload spec of ``--workload`` or ``--trace`` (a file, or a shipped
    trace's name: azure-conv, azure-code, sharegpt, arxiv), checked to parse."""
    from kvstab.audit.runs import load_workload

    if trace is not None:
        from kvstab.data import trace_path

        path = trace
        if not Path(trace).exists():
            try:
                path = str(trace_path(trace))
            except Exception:
                raise InvalidArgument(
                    f"--trace {trace!r}: no such file, and not a shipped trace (azure-conv, azure-code, sharegpt, arxiv)"
                ) from None
        spec = f"trace({path})"
    else:
        spec = workload or "paper-1:1"
    load_workload(spec)
    return spec


def _log(enabled: bool) -> Callable[[str], None]:
    def log(line: str) -> None:
        if enabled:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return log


def _cmd_audit(args: argparse.Namespace) -> int:
    from kvstab.audit.audit import AuditConfig, AuditResult, run_audit
    from kvstab.audit.profiles import get_profile
    from kvstab.audit.report import write_report
    from kvstab.cli.flags import prefix_caching_for, refuse_radix_cache, server_params
    from kvstab.registry import load_scheduler

    out = writable_dir(args.out)
    # caching as the audited engine runs by default (vllm-v1: on), the same server for every baseline
    name = load_scheduler(args.scheduler).name
    params = server_params(args, prefix_caching=prefix_caching_for(args, name))
    refuse_radix_cache(name, params.prefix_caching, f"the scheduler {args.scheduler}", "audit")
    spec = workload_spec(args.workload, args.trace)
    baselines = tuple(b for b in (args.baseline or ["current-fit", "vllm-v1"]) if b != "none")
    for b in baselines:
        refuse_radix_cache(load_scheduler(b).name, params.prefix_caching, f"baseline {b}", "audit")
    config = AuditConfig(
        scheduler=args.scheduler, params=params, workload=spec, baselines=baselines,
        profile=get_profile(args.profile), skip=tuple(args.skip), strict=args.strict,
        require_rate=args.require_rate, max_waste=args.max_waste, seed=args.seed, window=args.window,
    )
    def keep(partial: AuditResult) -> None:
        # what is done survives an interrupt: report.json after every section
        (out / "report.json").write_text(dumps(partial.to_json(), indent=2) + "\n")

    with _executor(args.workers, None) as ex:
        res = run_audit(config, executor=ex, smt2_dir=out / "smt2", log=_log(not args.quiet), on_progress=keep)
    files = write_report(res, out)
    data = res.to_json()
    if args.json:
        print(dumps(data, indent=2))
    else:
        _print_summary(data, files)
    return res.exit_status


def _print_summary(data: dict[str, Any], files: dict[str, Path]) -> None:
    from kvstab.audit.audit import caching_lines
    from kvstab.audit.properties import short_name
    from kvstab.audit.report import HEADER, scope_line, summary_rows

    print(f"kvstab audit: {data['scheduler']} on {data['theory']['workload']}, M={data['server']['M']}, "
          f"ŝ={data['server']['chunk']}, b̄={data['server']['bbar_s']} s, window {data['window']}, "
          f"profile {data['profile']}")
    th = data["theory"]
    md = th["mu_1_minus_delta_per_s"]
    print(f"  μ = {th['mu_per_s']:.5g}/s   μ(1−δ) = {md:.5g}/s   δ = {th['delta']:.4f}" if md is not None
          else f"  μ = {th['mu_per_s']:.5g}/s   δ = {th['delta']:.4f} (no μ(1−δ))")

    if data["stability"]:
        # λ*, the saturated throughput, and the latency at the measured load nearest below λ*
        cols = [0, 1, 2, 3, HEADER.index("measured load nearest below λ* (req/s)"),
                HEADER.index("TTFT p50/p90/p99 (s)"), HEADER.index("end-to-end p50/p90/p99 (s)")]
        rows = [[HEADER[i] for i in cols]] + [[r[i] for i in cols] for r in summary_rows(data)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
        for r in rows:
            print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    caching = caching_lines(data) if any(c["name"] == "prefix caching" for c in data["checks"]) else []
    for line in caching:
        # with and without caching side by side, under the table (the check below says the same)
        print(f"  {line}")
    for c in data["checks"]:
        if c["name"] == "prefix caching" and caching:
            continue
        print(f"  [{c['status']:>7}] {c['name']}: {c['detail']}")
        if c.get("replay_command"):
            print(f"            replay: {c['replay_command']}")
        if c["name"] == "memory invariant" and scope_line(data):
            print(f"            {scope_line(data)}")
        if c["name"] == "properties":
            # each failure, and the one line that shows it again
            for f in (data["properties"] or {}).get("findings", []):
                print(f"            {short_name(f['test'])}: {f['message']}")
                if f["audit"] or f["replay"]:
                    print(f"              reproduce: {f['audit'] or f['replay']}")
    print(f"verdict: {data['verdict']} (exit {data['exit_status']}); report in {files['report.md'].parent}/ "
          "(report.md, report.html, report.json, report.tex, *.png)")


class _Inline:
    """A null context for running points in process."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _executor(workers: int, dask: str | None) -> Any:
    """The executor points run on: in process (1 worker), local processes, or Dask."""
    if dask is not None:
        return _dask_executor(dask, workers)
    if workers <= 1:
        return _Inline()
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers)


class _DaskExecutor:
    """Dask's ``Client.get_executor()`` as a context that closes the client (and a local cluster)."""

    def __init__(self, address: str, workers: int) -> None:
        self.address = address
        self.workers = workers
        self.client: Any = None
        self.cluster: Any = None

    def __enter__(self) -> Executor:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InvalidArgument("--dask needs Dask distributed: pip install 'dask[distributed]'") from None
        if self.address == "local":
            self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                        dashboard_address=None)
            self.client = Client(self.cluster)
        else:
            try:
                self.client = Client(self.address, timeout="10s")
            except OSError as exc:
                raise InvalidArgument(f"--dask {self.address!r}: cannot reach the scheduler ({exc})") from None
        return self.client.get_executor()  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def _dask_executor(address: str, workers: int) -> _DaskExecutor:
    if address != "local" and not address.startswith(("tcp://", "tls://", "inproc://")):
        raise InvalidArgument(f"--dask {address!r}: valid: local, or a scheduler address tcp://HOST:PORT")
    return _DaskExecutor(address, max(1, workers))


def _cmd_sweep(args: argparse.Namespace) -> int:
    from kvstab.audit.sweep import SweepGrid, json_row, run_sweep
    from kvstab.cli.flags import prefix_caching_for
    from kvstab.registry import load_scheduler

    out = writable_dir(args.out)
    schedulers = tuple(_flatten(args.scheduler) or ["current-fit"])
    caching = []
    for s in schedulers:
        # each scheduler's points cache prefixes as its engine runs by default, unless --prefix-caching says
        # (sglang's points with caching run SGLang's radix cache: audit.runs.run_model carries it)
        caching.append(prefix_caching_for(args, load_scheduler(s).name))
    specs = [workload_spec(w, None) for w in args.workload or []]
    specs += [workload_spec(None, t) for t in args.trace or []]
    grid = SweepGrid(
        schedulers=schedulers,
        workloads=tuple(specs or [workload_spec(None, None)]),
        M=tuple(args.M), chunk=tuple(args.chunk), bbar=tuple(args.bbar), block=args.block,
        rates=tuple(args.rates or ()), loads=tuple(args.loads or ()), slots=args.slots,
        replicates=args.replicates, seed=args.seed, drop_oversize=args.drop_oversize, prefix_caching=tuple(caching),
    )
    with _executor(args.workers, args.dask) as ex:
        rows = run_sweep(grid, out, executor=ex, resume=args.resume, log=_log(not args.quiet and not args.json))
    if args.json:
        print(json.dumps([json_row(r) for r in rows], indent=2, allow_nan=False))
    else:
        print(f"kvstab sweep: {len(rows)} points → {out / 'sweep.csv'} (checkpoint {out / 'points.jsonl'}, plot {out / 'sweep.png'})")
        if any(caching):
            from kvstab.audit.audit import MU_NO_SHARING

            print(f"prefix caching on for {', '.join(s for s, on in zip(schedulers, caching) if on)}: {MU_NO_SHARING} "
                  "(sweep.csv's measured_over_mu)")
    return 0


def _on_off(text: str) -> bool:
    """``on`` or ``off``, as every command's ``--prefix-caching`` reads it."""
    from kvstab.cli.flags import _on_off as on_off

    return on_off(text)


def _flatten(values: list[list[str]] | None) -> list[str]:
    # repeated flags, each a comma-separated list
    return [v for group in (values or []) for v in group]


def _list_of(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def conv(text: str) -> list[Any]:
        parts = [t.strip() for t in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of values")
        return [kind(t) for t in parts]

    conv.__name__ = "a comma-separated list"
    return conv


def _flag_type(flag: str) -> Callable[[str], Any]:
    """The argparse type of a shared server flag (so sweep's lists check values as every command does)."""
    from kvstab.cli.flags import SERVER_FLAGS

    kind = SERVER_FLAGS[flag][1]
    assert kind is not None, flag
    return kind


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab audit`` and ``kvstab sweep`` to the CLI."""
    from kvstab import validation as v
    from kvstab.audit.audit import SKIPPABLE
    from kvstab.audit.profiles import PROFILES
    from kvstab.cli.flags import add_run_arguments, add_server_arguments, arg_type, positive_int, rate, seed, slots

    p = sub.add_parser("audit", help="audit a scheduler end to end: theory, proofs, properties, stability region, report")
    # --scheduler and --window as every command that runs a scheduler takes them
    add_run_arguments(p, timeout=False)
    add_server_arguments(p, caching=True)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", default=None, help="workload spec (default paper-1:1); Poisson arrivals at each rate")
    src.add_argument("--trace", default=None, metavar="PATH", help="a trace's (s, o) rows as the length law (file or shipped name)")
    p.add_argument("--baseline", action="append", default=None, metavar="NAME",
                   help="baseline scheduler (repeatable; default current-fit and vllm-v1; 'none' for none)")
    p.add_argument("--profile", choices=tuple(PROFILES), default="ci", help="cost profile (default ci)")
    p.add_argument("--out", default="kvstab-audit", metavar="DIR", help="report folder (default kvstab-audit)")
    p.add_argument("--json", action="store_true", help="print report.json to stdout")
    p.add_argument("--strict", action="store_true", help="an Unknown proof or unresolved λ* fails (exit 3)")
    p.add_argument("--require-rate", type=rate, default=None, metavar="λ", help="fail if λ* (req/s) is below λ")
    p.add_argument("--max-waste", type=arg_type(v.fraction, "a waste fraction in [0, 1)"), default=None, metavar="x",
                   help="fail if preemption waste just below λ* exceeds x (fraction of served area)")
    p.add_argument("--skip", action="append", default=[], choices=SKIPPABLE, help="a section not to run (never passes)")
    p.add_argument("--seed", type=seed, default=0, help="base seed of the simulations (default 0)")
    p.add_argument("--workers", type=arg_type(v.positive_int, "the number of workers", maximum=256), default=1,
                   help="local processes for the simulations (default 1: in process)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=_cmd_audit)

    s = sub.add_parser("sweep", help="the stability sweep over a grid of rates, M, ŝ, b̄, schedulers, workloads")
    s.add_argument("--scheduler", action="append", type=_list_of(str), default=None,
                   help="scheduler(s), comma-separated or repeated (default current-fit)")
    # specs contain commas: several workloads or traces are given by repeating the flag
    s.add_argument("--workload", action="append", default=None, help="workload spec (repeat the flag for several)")
    s.add_argument("--trace", action="append", default=None, help="trace file or name (repeat the flag for several)")
    s.add_argument("--M", type=_list_of(_flag_type("--M")), default=[131_000], help="KV capacities (comma list)")
    s.add_argument("--chunk", type=_list_of(_flag_type("--chunk")), default=[512], help="chunks ŝ (comma list)")
    s.add_argument("--bbar", type=_list_of(_flag_type("--bbar")), default=[0.0372],
                   help="batch times b̄ in s (comma list)")
    s.add_argument("--block", type=_flag_type("--block"), default=1, help="KV block size B (default 1)")
    s.add_argument("--prefix-caching", dest="prefix_caching", type=_on_off, default=None, metavar="on|off",
                   help="prefix caching on every point (default: as each engine modelled — on for vllm-v1, as "
                   "vLLM's default; off for the paper's rules and sglang); μ stays the no-sharing formula")
    s.add_argument("--rates", type=_list_of(rate), default=None, help="arrival rates λ in req/s (comma list)")
    s.add_argument("--loads", type=_list_of(arg_type(v.positive_float, "a load λ/μ", maximum=100.0)), default=None,
                   help="arrival rates as multiples of each configuration's μ (comma list)")
    s.add_argument("--slots", type=slots, default=10_000, help="slots per point (default 10000)")
    s.add_argument("--replicates", type=positive_int, default=1, help="seeds per grid cell (default 1)")
    s.add_argument("--seed", type=seed, default=0, help="base seed (default 0)")
    s.add_argument("--drop-oversize", action="store_true",
                   help="drop requests whose s+o exceeds M (and report how many); μ is then of the law given fitting")
    s.add_argument("--out", required=True, metavar="DIR", help="folder for sweep.csv, points.jsonl, sweep.png")
    s.add_argument("--resume", action="store_true", help="continue the sweep checkpointed in --out")
    s.add_argument("--workers", type=arg_type(v.positive_int, "the number of workers", maximum=256),
                   default=min(4, os.cpu_count() or 1), help="local processes (or Dask workers with --dask local)")
    s.add_argument("--dask", default=None, metavar="local|tcp://HOST:PORT",
                   help="run points on Dask: a LocalCluster, or an existing scheduler")
    s.add_argument("--json", action="store_true", help="print the rows as JSON")
    s.add_argument("--quiet", action="store_true", help="no progress lines")
    s.set_defaults(func=_cmd_sweep)
