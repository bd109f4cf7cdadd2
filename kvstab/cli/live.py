"""``kvstab serve --emulate`` and ``kvstab bench``: the live-server commands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kvstab import validation as v
from kvstab.cli.flags import arg_type, bbar, positive_float, positive_int, rate, seed
from kvstab.errors import InvalidArgument
from kvstab.jsonform import dumps

if TYPE_CHECKING:
    from kvstab.live.bench import BenchSummary

__all__ = ["register"]

_duration = arg_type(v.positive_float, "a duration in seconds", maximum=7 * 24 * 3600.0)
_speedup = arg_type(v.positive_float, "the speed-up", maximum=1e6)
_fraction = arg_type(v.fraction, "a fraction in [0, 1)")
_count = arg_type(v.positive_int, "a number of requests", maximum=v.MAX_COUNT)
_tokens = arg_type(v.positive_int, "a number of tokens", maximum=v.MAX_TOKENS)


def _rates(text: str) -> list[float]:
    """``5`` or ``5,10,20``: requests per second."""
    out = [rate(part) for part in text.split(",") if part.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate or a comma-separated list of rates")
    return out


def _batch_time(text: str) -> Any:
    """``a,b,c,d`` in seconds: the batch-time model's coefficients."""
    from kvstab.empirical.batchtime import BatchTimeModel

    parts = text.split(",")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"--batch-time takes a,b,c,d (seconds, seconds per token), got {text!r}")
    try:
        vals = [v.nonneg_float("a batch-time coefficient", p, maximum=3600.0) for p in parts]
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if vals[0] <= 0:
        raise argparse.ArgumentTypeError("--batch-time: the constant a must be > 0 (a step takes time)")
    return BatchTimeModel(*vals)


def _on_off(text: str) -> bool:
    """``on`` or ``off``, as vLLM's ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def _writable(path: str) -> None:
    """Refuse an output path before any work (a finished run must not be lost to a bad --out)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidArgument(f"output {path} is a directory; give a file name")
    if not os.path.isdir(folder):
        raise InvalidArgument(f"output folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise InvalidArgument(f"output {path} is not writable")


def _write(path: str, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dumps(data, indent=2) + "\n")


# --- serve

def _cmd_serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from kvstab.live.emulator import EmulatorConfig
    from kvstab.live.server import build_app
    from kvstab.steplog import ReplayConfig

    if not args.emulate:
        raise InvalidArgument("kvstab serve only emulates a server: pass --emulate")
    if args.write_tokenizer:
        from kvstab.live.tokenizer import write_tokenizer

        folder = write_tokenizer(args.write_tokenizer)
        print(f"kvstab serve: wrote the emulator's tokenizer (one token per word) to {folder}: give it to a load "
              "generator as its tokenizer", file=sys.stderr)
    vllm = ReplayConfig.for_capacity(
        args.M, args.block, max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
    )
    scheduler = args.scheduler
    if scheduler in ("auto", "vllm"):
        from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm

        try:
            load_vllm()
            scheduler = "vllm"
        except VllmUnavailable as exc:
            if scheduler == "vllm":
                raise
            print(f"kvstab serve: {exc}; batching with kvstab's vllm-v1 model instead", file=sys.stderr)
            scheduler = "model"
    cfg = EmulatorConfig(
        server=dataclasses.replace(vllm.params(), bbar=args.bbar, prefix_caching=args.prefix_caching),
        max_model_len=vllm.max_model_len,
        batch_time=args.batch_time, speedup=args.speedup, model=args.model,
        honour_min_tokens=not args.ignore_min_tokens, eos_after=args.eos_after, scheduler=scheduler,
    )
    print(
        f"kvstab serve: emulating vLLM ({'its own scheduler' if scheduler == 'vllm' else 'kvstab vllm-v1 model'}) with M={vllm.M} tokens ({vllm.num_blocks} blocks of {vllm.block_size}), "
        f"budget {vllm.max_num_batched_tokens}, prefix caching {'on' if args.prefix_caching else 'off'}, "
        f"b̄={args.bbar} s / speedup {args.speedup} on http://{args.host}:{args.port}",
        file=sys.stderr,
    )
    try:
        # handler_cancellation: a client that goes away aborts its request, as vLLM does
        web.run_app(build_app(cfg), host=args.host, port=args.port, print=None, access_log=None,
                    handler_cancellation=True)
    except OSError as exc:
        raise InvalidArgument(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


# --- bench

def _workload(args: argparse.Namespace) -> Any:
    from kvstab.traces import load_trace
    from kvstab.workload import Workload, parse_workload

    if args.trace:
        tr = load_trace(args.trace)
        return tr, Workload.joint(tr.s, tr.o, name=f"trace({args.trace})")
    return None, parse_workload(args.workload)


def _cmd_import(args: argparse.Namespace) -> int:
    from kvstab.live.formats import load_result
    from kvstab.model import ModelParams
    from kvstab.theory import stability_report

    res = load_result(args.import_result)
    workload = res.workload
    if args.workload_given or args.trace:
        workload = _workload(args)[1]
    if workload is None:
        raise InvalidArgument(f"{res.path} records no per-request lengths; give --workload or --trace for E[g]")
    if args.M is None or args.bbar is None:
        raise InvalidArgument("comparing an imported result with μ needs the server's --M (tokens) and --bbar (s)")
    params = ModelParams(M=args.M, chunk=args.chunk, block=args.block, bbar=args.bbar)
    if not params.fits_total(workload.max_total):
        # the run's server held these requests: an M they do not fit in is not that server's
        raise InvalidArgument(
            f"requests of {workload.describe()} need up to {params.peak(workload.max_total)} KV tokens at their "
            f"peak but --M is {args.M} (block {args.block}): no server with that capacity serves them; give the "
            "capacity of the server that ran the benchmark"
        )
    if args.max_model_len is not None and workload.max_total > args.max_model_len:
        # the server answers a request longer than its context with HTTP 400: it cannot have served these
        raise InvalidArgument(
            f"requests of {workload.describe()} have s + o up to {workload.max_total} tokens but --max-model-len is "
            f"{args.max_model_len}: a server with that context refuses them; give the max_model_len of the server "
            "that ran the benchmark, or the --workload it ran"
        )
    rep = stability_report(workload, params)
    out = {
        "tool": res.tool, "path": res.path, "throughput_per_s": res.throughput_per_s, "completed": res.completed,
        "duration_s": res.duration_s, "workload": workload.describe(), "M": args.M, "bbar_s": args.bbar,
        "chunk": args.chunk, "block": args.block, "E_g_tokens_slots": rep.E_g, "mu_per_s": rep.mu_per_s,
        "measured_over_mu": res.throughput_per_s / rep.mu_per_s, "extra": res.extra,
    }
    if args.out:
        _write(args.out, out)
    if args.json:
        print(dumps(out, indent=2))
    else:
        print(f"{res.tool} ({res.path}): {res.throughput_per_s:.4f} req/s measured; μ = {rep.mu_per_s:.4f} req/s "
              f"(M={args.M}, b̄={args.bbar} s, E[g]={rep.E_g:.1f}); measured/μ = {out['measured_over_mu']:.4f}")
        if res.completed is not None and res.duration_s:
            print("note: a throughput equals μ only if the run was saturated (arrivals above μ, queue growing)")
    return 0


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("requests"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("bench", total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _cmd_bench(args: argparse.Namespace) -> int:
    from kvstab.live.bench import (
        BenchConfig,
        BenchError,
        poisson_schedule,
        run_bench,
        server_max_model_len,
        trace_schedule,
    )
    from kvstab.live.formats import llmd_report

    args.workload_given = args.workload is not None
    if args.workload is None:
        args.workload = "paper-1:1"
    if args.import_result:
        return _cmd_import(args)
    if not args.url:
        raise InvalidArgument("kvstab bench needs --url http://HOST:PORT (or --import FILE)")
    if args.max_model_len is not None:
        raise InvalidArgument(
            "--max-model-len checks an --import's requests; against --url the server's own max_model_len is read "
            "from GET /v1/models: drop --max-model-len"
        )
    if not args.url.startswith(("http://", "https://")):
        raise InvalidArgument(f"--url must start with http:// or https://, got {args.url!r}")
    for path in (args.out, args.llmd_report):
        if path:
            _writable(path)
    trace, workload = _workload(args)
    if trace is None and args.rate is None:
        raise InvalidArgument("give --rate (requests/s, or a list like 5,10,20) or --trace with arrival times")
    if args.time_scale is not None and (trace is None or args.rate is not None):
        raise InvalidArgument(
            "--time-scale stretches a --trace's own arrival times; with --rate the arrivals are Poisson and it does "
            "nothing: drop --time-scale, or --rate to replay the trace's times"
        )
    caching = args.prefix_caching
    structured = workload.prefix is not None or (trace is not None and trace.prompts is not None)
    if caching and structured and args.api == "chat":
        raise InvalidArgument(
            "--api chat sends calibrated text, not the workload's prompt content, so its shared prefixes would not "
            "reach the server: use --api completions (token ids), or --prefix-caching off"
        )
    cfg = BenchConfig(
        url=args.url, api=args.api, model=args.model, stream=not args.no_stream, duration=args.duration,
        warmup=args.warmup, scrape_interval=args.scrape_interval, timeout=args.timeout, chunk=args.chunk,
        seed=args.seed, prefix_caching=caching,
    )
    # a trace with --rate lends its lengths (their joint law) to Poisson arrivals; without, its own times
    schedules = (
        [trace_schedule(trace, args.time_scale or 1.0, args.requests, prompts=caching)] if args.rate is None
        else [poisson_schedule(workload, lam, args.requests, args.seed + i, prompts=caching)
              for i, lam in enumerate(args.rate)]
    )
    # a request longer than the server's context is refused by it (HTTP 400): find out before sending any
    try:
        max_len = asyncio.run(server_max_model_len(cfg))
    except BenchError:
        max_len = None  # the run meets the same error, and reports it with what it kept
    law, fit_p = workload, 1.0
    if max_len is not None and workload.max_total > max_len:
        if not args.drop_oversize:
            raise InvalidArgument(
                f"the server's max_model_len is {max_len} tokens (GET /v1/models) but requests of workload "
                f"{workload.describe()} have s + o up to {workload.max_total}: it would refuse them; give a --workload "
                "that fits, or --drop-oversize to leave those requests out (and count them)"
            )
        # μ is of what the server is sent: the law given s + o <= max_model_len
        law, fit_p = workload.conditioned(max_len)
        schedules = [sched.fitting(max_len) for sched in schedules]
        sys.stderr.write(
            f"kvstab bench: --drop-oversize: left out {sum(x.dropped for x in schedules)} request(s) with s + o above "
            f"max_model_len {max_len}; μ is of the law given fitting (P = {fit_p:.4g})\n"
        )
    runs: list[dict[str, Any]] = []
    reports: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"url": args.url, "api": args.api, "workload": workload.describe(), "chunk": args.chunk,
                           "max_model_len": max_len, "theory_workload": law.describe(), "fit_probability": fit_p,
                           "prefix_caching": caching, "mu_formula": _MU_NOTE, "runs": runs}
    status = 0
    for sched in schedules:
        bar = _Progress(enabled=not args.json and not args.no_progress)
        started = datetime.now(UTC)
        try:
            res = asyncio.run(run_bench(cfg, sched, progress=bar))
        finally:
            bar.close()
        summary = res.summary(law, cfg, M=args.M, bbar=args.bbar)
        runs.append(summary.to_json())
        done = [r for r in res.records if r.error is None and r.done is not None]
        reports.append(llmd_report(
            summary, started=started, sent_s=[r.s for r in done], sent_o=[r.o for r in done],
            ttft_s=[r.first_token - r.sent for r in done if r.first_token is not None],
            latency_s=[r.done - r.sent for r in done if r.done is not None], args={"--url": args.url},
        ))
        # written after every run, so an error or Ctrl-C later keeps what was measured
        if args.out:
            _write(args.out, doc)
        if args.llmd_report:
            _write(args.llmd_report, reports[0] if len(reports) == 1 else reports)
        if not args.json:
            _print_run(summary)
        if res.error is not None:
            sys.stderr.write(f"kvstab bench: error: {res.error}\n")
            status = 2
            break
        if res.metrics_error is not None and summary.mu_per_s is None:
            sys.stderr.write(f"kvstab bench: error: {res.metrics_error}; μ needs --M and --bbar\n")
            status = 2
        if res.stopped_by == "interrupted":
            sys.stderr.write("kvstab bench: interrupted; the measurements so far are kept\n")
            status = 130
            break
    if args.json:
        print(dumps(doc, indent=2))
    if args.out:
        sys.stderr.write(f"kvstab bench: wrote {args.out}" + (f" and {args.llmd_report}" if args.llmd_report else "") + "\n")
    return status


#: what μ is until kvstab has μ under sharing (issue 25: the next issue)
_MU_NOTE = "μ = M/(b̄·E[g]) is the no-sharing formula: it does not count prefix-cache hits"


def _fmt(x: Any, spec: str = ".4f") -> str:
    return "—" if x is None else format(x, spec)


def _print_run(o: BenchSummary) -> None:
    est = o.server.estimates
    lo, hi = o.throughput_per_s_ci95 or (None, None)
    rate_txt = "trace times" if o.offered_rate_per_s is None else f"{o.offered_rate_per_s:g} req/s"
    left_out = f", {o.dropped_oversize} left out (s + o > max_model_len)" if o.dropped_oversize else ""
    print(f"offered {rate_txt}: {o.sent} sent, {o.completed} completed, {o.failed} failed, "
          f"{o.unfinished} unfinished in {o.elapsed_s:.1f} s ({o.stopped_by}){left_out}")
    print(f"  throughput      {_fmt(o.throughput_per_s)} req/s  [{_fmt(lo)}, {_fmt(hi)}]")
    busy = None if est is None else est.busy_fraction
    busy_bbar = None if est is None else est.bbar_busy_s
    print(f"  μ = M/(b̄·E[g])  {_fmt(o.mu_per_s)} req/s   (no-sharing formula; M={o.M}, b̄={_fmt(o.bbar_s, '.5f')} s"
          f"{f' over busy steps, busy {100 * busy:.0f} %' if busy is not None and o.bbar_s == busy_bbar else ''})")
    print(f"  measured / μ    {_fmt(o.measured_over_mu)}")
    pc = o.prefix_cache
    if pc is not None and pc.hit_rate is not None:
        print(f"  prefix cache    hit rate {pc.hit_rate:.4f} ({pc.hits} of {pc.queries} prompt tokens found cached)")
    elif pc is not None:
        print(f"  prefix cache    {pc.missing}")
    ci = (est.queue_slope_ci95 if est is not None else None) or (None, None)
    print(f"  queue slope     {_fmt(None if est is None else est.queue_slope_per_s)} req/s  [{_fmt(ci[0])}, {_fmt(ci[1])}]"
          f"   KV use {_fmt(None if est is None else est.kv_utilisation, '.3f')}   "
          f"preemptions {'—' if est is None else est.preemptions}")
    if o.server.metrics_error:
        print(f"  /metrics: {o.server.metrics_error}")
    if o.saturation_warning:
        print(f"  warning: {o.saturation_warning}")
    if o.prefix_caching:
        sent = ("the workload's shared prefixes were sent as token ids" if o.prompts_shared
                else "the workload has no prefix structure: every prompt was random ids of its own")
        print(f"  prefix caching on (--prefix-caching off to compare): {sent}; {_MU_NOTE}, so measured / μ may "
              "exceed 1 when the server hits its cache")
    if pc is not None and pc.server_caching is not None and pc.server_caching != o.prefix_caching:
        print(f"  note: the server reports enable_prefix_caching={pc.server_caching} but bench ran with "
              f"--prefix-caching {'on' if o.prefix_caching else 'off'}")


_port = arg_type(lambda name, value: v.as_int(name, value, minimum=0, maximum=65535), "the port")


def register(subparsers: Any) -> None:
    """Add ``kvstab serve`` and ``kvstab bench``."""
    s = subparsers.add_parser(
        "serve", help="an OpenAI-compatible server emulating vLLM's scheduler (for tests and rehearsals)",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /tokenize and /metrics (vLLM's names) "
        "with kvstab's vllm-v1 model batching the requests in real time.",
    )
    s.add_argument("--emulate", action="store_true", help="emulate a vLLM server (the only mode)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free port)")
    s.add_argument("--M", type=_tokens, default=16_384, help="KV capacity in tokens (default 16384)")
    s.add_argument("--block", type=_tokens, default=16, help="KV block size (default 16)")
    s.add_argument("--max-num-batched-tokens", type=_tokens, default=512, help="token budget = chunk ŝ (default 512)")
    s.add_argument("--max-num-seqs", type=positive_int, default=256, help="cap on running requests (default 256)")
    s.add_argument("--max-model-len", type=_tokens, default=None, help="longest s + o accepted (default: what fits)")
    s.add_argument("--bbar", type=bbar, default=0.0372, help="seconds per step (default 0.0372)")
    s.add_argument("--batch-time", type=_batch_time, default=None,
                   help="a,b,c,d: step = a + b·prefill + c·decode + d·kv_attended seconds (kvstab empirical's fit)")
    s.add_argument("--speedup", type=_speedup, default=1.0, help="run this many times faster than real time")
    s.add_argument("--model", default="kvstab-emulator", help="model name served (default kvstab-emulator)")
    s.add_argument("--scheduler", choices=("auto", "model", "vllm"), default="auto",
                   help="batching: vLLM's own scheduler (vllm, needs scripts/install-vllm.sh), kvstab's vllm-v1 model, "
                   "or auto: vLLM's when installed (default auto)")
    s.add_argument("--eos-after", type=positive_int, default=16, help="emulated EOS position when allowed (default 16)")
    s.add_argument("--prefix-caching", type=_on_off, default=True, metavar="on|off",
                   help="vLLM's automatic prefix caching: prompts sent as token ids share the KV blocks of equal "
                   "prefixes, counted in vllm:prefix_cache_hits (default on, as vLLM's server)")
    s.add_argument("--write-tokenizer", default=None, metavar="DIR",
                   help="first write the emulator's tokenizer (a Hugging Face tokenizer folder, one token per word) "
                   "to DIR, for load generators that count tokens themselves (vllm bench serve, AIPerf, GuideLLM)")
    s.add_argument("--ignore-min-tokens", action="store_true",
                   help="rehearse a server that ignores min_tokens and ignore_eos")
    s.set_defaults(func=_cmd_serve)

    b = subparsers.add_parser(
        "bench", help="load an OpenAI-compatible server and compare its saturated rate with μ",
        description="Send requests of exact lengths (max_tokens = min_tokens = o, ignore_eos) at a rate or a trace's "
        "times, scrape /metrics (vLLM's names) for M and b̄, and report throughput beside μ = M/(b̄·E[g]). "
        "With --import, compare a 'vllm bench serve', AIPerf or GuideLLM result with μ instead.",
    )
    b.add_argument("--url", default=None, help="the server, http://HOST:PORT")
    b.add_argument("--api", choices=("completions", "chat"), default="completions",
                   help="completions: prompts as token ids; chat: text calibrated with /tokenize (default completions)")
    b.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    b.add_argument("--workload", default=None, help="length law of the requests (default paper-1:1)")
    b.add_argument("--trace", default=None, help="a trace: its lengths, and its arrival times when no --rate")
    b.add_argument("--time-scale", type=positive_float, default=None,
                   help="with --trace and no --rate: multiply its arrival times (default 1)")
    b.add_argument("--rate", type=_rates, default=None, help="arrival rate(s) in requests/s: 8 or 4,8,16")
    b.add_argument("--requests", type=_count, default=1000, help="most requests per run (default 1000)")
    b.add_argument("--duration", type=_duration, default=60.0, help="most seconds per run (default 60)")
    b.add_argument("--warmup", type=_fraction, default=0.25, help="warm-up fraction left out (default 0.25)")
    b.add_argument("--seed", type=seed, default=0, help="seed of arrivals, lengths and prompt ids (default 0)")
    b.add_argument("--chunk", type=_tokens, default=512, help="ŝ for μ: the server's max_num_batched_tokens (default 512)")
    b.add_argument("--block", type=_tokens, default=16, help="with --import: KV block size for μ (default 16)")
    b.add_argument("--M", type=_tokens, default=None, help="KV capacity in tokens (default: from /metrics)")
    b.add_argument("--bbar", type=bbar, default=None, help="batch time in s (default: measured from /metrics)")
    b.add_argument("--scrape-interval", type=_duration, default=0.5, help="seconds between scrapes (default 0.5)")
    b.add_argument("--timeout", type=_duration, default=10.0, help="connect timeout in seconds (default 10)")
    b.add_argument("--no-stream", action="store_true", help="plain responses instead of server-sent events")
    b.add_argument("--out", default="bench.json", help="kvstab's JSON result (default bench.json; '' for none)")
    b.add_argument("--llmd-report", default=None, help="also write an llm-d benchmark report (v0.2) here")
    b.add_argument("--import", dest="import_result", default=None, metavar="FILE",
                   help="compare a 'vllm bench serve' result JSON, AIPerf profile_export_aiperf.json or GuideLLM "
                   "benchmarks.json with μ")
    b.add_argument("--max-model-len", type=_tokens, default=None,
                   help="with --import: the server's max_model_len; requests with s + o above it are refused")
    b.add_argument("--drop-oversize", action="store_true",
                   help="leave out requests longer (s + o) than the server's max_model_len, and count them; "
                   "μ is then of the law given fitting")
    b.add_argument("--prefix-caching", type=_on_off, default=True, metavar="on|off",
                   help="on (default, as vLLM's server runs): send the workload's real shared prefixes (prefix=… laws, "
                   "Mooncake hash_ids) as token ids, so the server's prefix cache hits them; off: random ids of "
                   "each request's own, as against a server run with --no-enable-prefix-caching")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.set_defaults(func=_cmd_bench)
