"""``kvstab tune``: vLLM's and SGLang's flags for a target λ, or λ* of an existing deployment (``--from-flags``).

Command-line floor: argument wiring and printing; the work is
:mod:`kvstab.fleet.tune` and :mod:`kvstab.kv_capacity` (``docs/tune.md``).
Bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from kvstab import validation as v
from kvstab.cli import flags
from kvstab.errors import InvalidArgument

__all__ = ["register"]

_margin = flags.arg_type(v.fraction, "the margin")
_gib = flags.arg_type(v.positive_float, "a size in GiB", maximum=1e5)
_gb = flags.arg_type(v.positive_float, "a size in GB", maximum=1e5)
_kv_bytes = flags.arg_type(v.positive_int, "the KV bytes per token", maximum=2**40)
_tokens = flags.arg_type(v.positive_int, "the KV capacity in tokens", maximum=v.MAX_TOKENS)
_seeds = flags.arg_type(v.as_int, "the seeds (at least 2: an interval needs two)", minimum=2, maximum=64)


def _shape(args: argparse.Namespace) -> Any:
    from kvstab.kv_capacity import ModelShape, load_model_shape

    if (args.config is None) == (args.kv_bytes_per_token is None):
        raise InvalidArgument("give either --config (a Hugging Face config.json, or llama-3-8b) or --kv-bytes-per-token")
    weights = None if args.weights_gb is None else int(args.weights_gb * 1e9)
    if args.config is not None:
        shape = load_model_shape(args.config)
        if weights is not None:
            from dataclasses import replace

            shape = replace(shape, weights_bytes=weights)
        return shape
    return ModelShape(args.kv_bytes_per_token, weights, name="--kv-bytes-per-token")


def _workload(args: argparse.Namespace) -> tuple[Any, str]:
    from kvstab.workload import parse_workload

    if args.workload is not None and args.trace is not None:
        raise InvalidArgument("give --workload or --trace, not both")
    if args.trace is not None:
        from kvstab.data import TRACES, trace_path

        path = str(trace_path(args.trace)) if args.trace in TRACES else args.trace
        if not os.path.isfile(path):
            raise InvalidArgument(f"--trace {args.trace!r}: no such file; shipped traces: {', '.join(sorted(TRACES))}")
        spec = f"trace({path})"
    else:
        spec = args.workload or "paper-1:1"
    return parse_workload(spec), spec


def _bbar_fn(args: argparse.Namespace, shape: Any, gpu: Any, workload: Any, mom: Any) -> Any:
    """``(M, budget, decoders, engine) ↦ (b̄, where it came from)``: ``--bbar``, or the shipped profile."""
    from kvstab.fleet.tune import bbar_oracle

    if args.bbar is not None:
        return lambda _M, _b, _d, _e: (args.bbar, "given (--bbar)")
    return bbar_oracle(shape, gpu, workload)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _engine_lines(e: Any, model: str) -> list[str]:
    from kvstab.fleet.tune import VllmFlags

    c, b, p = e.capacity, e.bounds, e.params
    out: list[str] = []
    if isinstance(e.flags, VllmFlags):
        f = e.flags
        if "available_kv_gib" in c and c["reserve_gib"] is not None:
            out.append(f"  gpu_memory_utilization {f.gpu_memory_utilization:g}: {c['total_gib']:.2f} GiB × "
                       f"{f.gpu_memory_utilization:g} − weights {c['weights_gib'] or 0:.2f} GiB − reserve "
                       f"{c['reserve_gib']:.2f} GiB → {c['available_kv_gib']:.2f} GiB of KV ({c['source']}) → "
                       f"{c['num_gpu_blocks']} blocks of {f.block_size} → M = {p.M:,} tokens")  # fmt: skip
        elif "available_kv_gib" in c:
            out.append(f"  {c['available_kv_gib']:.2f} GiB of KV ({c['source']}) → {c['num_gpu_blocks']} blocks of "
                       f"{f.block_size} → M = {p.M:,} tokens")  # fmt: skip
        else:
            out.append(f"  M = {p.M:,} tokens ({c['source']})")
        out.append(f"  max_num_seqs {f.max_num_seqs}, max_num_batched_tokens {f.max_num_batched_tokens} (= chunk ŝ), "
                   f"block_size {f.block_size}, prefix caching {'on' if f.enable_prefix_caching else 'off'}")  # fmt: skip
    else:
        f = e.flags
        out.append(f"  mem_fraction_static {f.mem_fraction_static:g}: ({c['pre_load_free_gib']:.2f} GiB free before "
                   f"loading) × {f.mem_fraction_static:g} − weights {c['weights_gib']:.2f} GiB → "
                   f"{c['available_kv_gib']:.2f} GiB → max_total_num_tokens M = {p.M:,}")  # fmt: skip
        out.append(f"  max_running_requests {f.max_running_requests}, chunked_prefill_size {f.chunked_prefill_size}, "
                   f"page_size {f.page_size}")  # fmt: skip
    out.append(f"  b̄ = {p.bbar:.4g} s: {e.bbar_source}")
    tok = "" if b.tokens is None else f", token budget {b.tokens:.4g}"
    seqs = "" if b.seqs is None else f", running cap {b.seqs:.4g}"
    out.append(f"  bounds on λ* (req/s): KV memory μ = M/(b̄·E[g]) = {b.memory:.4g}{tok}{seqs} → binding: {b.binding}")
    return out


def _check_lines(checks: list[Any]) -> list[str]:
    return [f"  simulated {c.label}: λ* = {c.critical.value:.4g} [{c.critical.low:.4g}, {c.critical.high:.4g}] req/s, "
            f"KV utilisation {c.utilisation:.2f}" + ("" if c.lam is None else
            f"; headroom 1 − λ/λ* = {_pct(c.headroom)} → {'PASS' if c.passed else 'FAIL'}")
            for c in checks]  # fmt: skip


def _cmd_tune(args: argparse.Namespace) -> int:
    from kvstab.fleet.tune import moments
    from kvstab.kv_capacity import gpu_spec

    shape = _shape(args)
    gpu = gpu_spec(args.gpu, args.gpu_memory_gib)
    workload, spec = _workload(args)
    engines = ("vllm", "sglang") if args.engine == "both" else (args.engine,)
    if args.from_flags is None and args.lam is None:
        raise InvalidArgument("give --lambda (the target rate) or --from-flags (an existing deployment's vllm serve flags)")
    if args.from_flags is not None and args.engine == "sglang":
        raise InvalidArgument("--from-flags reads vllm serve flags: use --engine vllm (or both)")
    if args.kv_cache_tokens is not None and args.from_flags is None:
        raise InvalidArgument("--kv-cache-tokens is a deployment's measured M: it goes with --from-flags")
    mom = moments(workload)
    bbar_fn = _bbar_fn(args, shape, gpu, workload, mom)
    avail = None if args.available_kv_gib is None else int(args.available_kv_gib * 2**30)
    model = args.model or (args.config if args.config is not None else "MODEL")
    caching = (False, True) if args.prefix_caching is None else (args.prefix_caching,)
    if args.from_flags is not None:
        return _inverse(args, shape, gpu, workload, spec, mom, bbar_fn, avail, model, caching)
    if avail is not None:
        raise InvalidArgument("--available-kv-gib measures one deployment: it goes with --from-flags")
    from kvstab.fleet.tune import recommend, recommend_verified, sglang_search

    checks: dict[str, list[Any]] = {}
    on = args.prefix_caching is not False
    if args.no_verify or "vllm" not in engines:
        rec = recommend(workload, shape, gpu, args.lam, args.margin, mom, bbar_fn, prefix_caching=on)
    else:
        rec, checks["vllm"] = recommend_verified(workload, shape, gpu, args.lam, args.margin, mom, bbar_fn,
                                                 prefix_caching=on, caching=caching, seeds=args.seeds,
                                                 seed=args.seed)  # fmt: skip
    chosen = [rec.vllm if e == "vllm" else rec.sglang for e in engines]
    if not args.no_verify and "sglang" in engines:
        # SGLang's prefill-only steps are beyond the closed forms: its flags come from simulation
        chosen[-1], checks["sglang"] = sglang_search(workload, shape, gpu, args.lam, args.margin, mom, bbar_fn,
                                                     weights_bytes=shape.weights_bytes, seeds=args.seeds,
                                                     seed=args.seed)  # fmt: skip
    passed = all(c.passed for cs in checks.values() for c in cs)
    if args.json:
        print(json.dumps({
            "model": shape.describe(), "gpu": gpu.name, "gpu_total_gib": gpu.total_gib, "workload": spec,
            "lambda_per_s": args.lam, "margin": args.margin,
            "engines": [_engine_json(e, model, checks.get(e.engine)) for e in chosen],
            "verified": None if args.no_verify else passed,
        }, indent=2))  # fmt: skip
        return 0 if args.no_verify or passed else 1
    print(f"kvstab tune: {shape.describe()}; {gpu.name} ({gpu.total_gib:g} GiB); {workload.describe()}; "
          f"λ = {args.lam:g} req/s with margin {args.margin:g} (λ ≤ (1 − m)·λ*)")  # fmt: skip
    for e in chosen:
        print(f"{'vLLM 0.33' if e.engine == 'vllm' else 'SGLang 0.5.23'}:")
        for line in _engine_lines(e, model):
            print(line)
        for line in _check_lines(checks.get(e.engine, [])):
            print(line)
        print(f"  {e.flags.command(model)}")
    if not args.no_verify:
        if passed:
            print("verdict: PASS: every simulated model keeps λ below (1 − margin)·λ* at its interval's lower end")
        else:
            failed = [c.label for cs in checks.values() for c in cs if not c.passed]
            print(f"verdict: FAIL: λ = {args.lam:g} is not below (1 − margin)·λ* (lower end) for {'; '.join(failed)}; "
                  "nothing on the search's grid did better on this GPU: lower λ or the margin, or add replicas "
                  "(kvstab plan)")  # fmt: skip
    return 0 if args.no_verify or passed else 1


def _engine_json(e: Any, model: str, checks: list[Any] | None) -> dict[str, Any]:
    from dataclasses import asdict

    p = e.params
    return {"engine": e.engine, "flags": asdict(e.flags), "command": e.flags.command(model), "capacity": e.capacity,
            "server": {"M": p.M, "chunk": p.chunk, "block": p.block, "token_budget": p.token_budget,
                       "max_num_seqs": p.max_num_seqs, "bbar_s": p.bbar}, "bbar_source": e.bbar_source,
            "bounds": e.bounds.as_dict(),
            "verification": None if checks is None else [c.as_dict() for c in checks]}  # fmt: skip


def _inverse(args: argparse.Namespace, shape: Any, gpu: Any, workload: Any, spec: str, mom: Any, bbar_fn: Any,
             avail: int | None, model: str, caching: tuple[bool, ...]) -> int:
    from dataclasses import replace

    from kvstab.fleet.tune import parse_vllm_flags, verify, vllm_engine
    from kvstab.model import ModelParams
    from kvstab.theory import stability_report

    fl, named, ignored = parse_vllm_flags(args.from_flags, gpu)
    if args.prefix_caching is None:
        caching = (fl.enable_prefix_caching,)
    eng = vllm_engine(workload, shape, gpu, fl, mom, bbar_fn, weights_bytes=shape.weights_bytes,
                      available_bytes=avail, kv_tokens=args.kv_cache_tokens)  # fmt: skip
    p = eng.params
    # the paper's formula: M tokens as measured (no block rounding), g per token (B = 1)
    m_paper = args.kv_cache_tokens if args.kv_cache_tokens is not None else p.M
    paper = stability_report(workload, ModelParams(M=m_paper, chunk=p.chunk, bbar=p.bbar))
    checks = [] if args.no_verify else verify(eng, workload, args.lam, args.margin, caching=caching,
                                              seeds=args.seeds, seed=args.seed)  # fmt: skip
    crit = min((c.critical for c in checks), key=lambda e: e.value, default=None)
    if args.json:
        print(json.dumps({
            "model": shape.describe(), "gpu": gpu.name, "workload": spec, "flags": args.from_flags,
            "ignored_flags": ignored, "paper_mu_per_s": paper.mu_per_s, "paper_M": m_paper,
            **_engine_json(replace(eng), named or model, checks or None),
            "critical_rate_per_s": None if crit is None else crit.value,
            "lambda_per_s": args.lam,
            "headroom": None if crit is None or args.lam is None else 1 - args.lam / crit.low,
        }, indent=2))  # fmt: skip
        return 0
    print(f"kvstab tune --from-flags: {shape.describe()}; {gpu.name} ({gpu.total_gib:g} GiB); {workload.describe()}")
    if ignored:
        print(f"  accepted, not modelled: {', '.join(ignored)}")
    for line in _engine_lines(eng, named or model):
        print(line)
    print(f"  the paper's μ = M/(b̄·E[g]) with M = {m_paper:,}, ŝ = {p.chunk}, b̄ = {p.bbar:g} s, B = 1: "
          f"{paper.mu_per_s:.4g} req/s (E[g] = {paper.E_g:,.0f})")  # fmt: skip
    for line in _check_lines(checks):
        print(line)
    if crit is not None:
        print(f"  λ* = {crit.value:.4g} req/s [{crit.low:.4g}, {crit.high:.4g}] (the least simulated); binding: "
              f"{eng.bounds.binding}" + ("" if args.lam is None else
              f"; headroom at λ = {args.lam:g}: {_pct(1 - args.lam / crit.low)}"))  # fmt: skip
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstab tune`` to the ``kvstab`` parser."""
    p = subparsers.add_parser("tune", help="vLLM/SGLang flags for a target λ, or λ* of existing flags (--from-flags)")
    p.add_argument("--config", default=None, help="a Hugging Face config.json (file or folder), or llama-3-8b (shipped)")
    p.add_argument("--kv-bytes-per-token", type=_kv_bytes, default=None, help="instead of --config")
    p.add_argument("--weights-gb", type=_gb, default=None,
                   help="the weights' size in GB (10⁹ bytes; default: from the config's shape)")
    p.add_argument("--gpu", required=True, help="A100-40GB, A100-80GB, H100-80GB, H200, L40S (or any name with --gpu-memory-gib)")
    p.add_argument("--gpu-memory-gib", type=_gib, default=None, help="the GPU's total memory, GiB (torch.cuda.mem_get_info()[1]/2**30)")
    p.add_argument("--lambda", dest="lam", type=flags.rate, default=None, help="the target arrival rate λ, req/s")
    p.add_argument("--workload", default=None, help="workload spec (default paper-1:1)")
    p.add_argument("--trace", default=None, help="a trace's joint law of (s, o) (shipped name or path)")
    p.add_argument("--margin", type=_margin, default=0.1, help="keep λ ≤ (1 − margin)·λ* (default 0.1)")
    p.add_argument("--engine", choices=("vllm", "sglang", "both"), default="both")
    p.add_argument("--prefix-caching", dest="prefix_caching", type=flags._on_off, default=None, metavar="on|off",
                   help="vLLM's prefix caching in the recommendation and its verification (default: recommend on, "
                        "as vLLM's default, and verify both)")  # fmt: skip
    p.add_argument("--bbar", type=flags.bbar, default=None,
                   help="batch time b̄, s per step (default: the shipped A100 profile for Llama-3-8B on A100s)")
    p.add_argument("--from-flags", default=None, metavar='"VLLM SERVE FLAGS"',
                   help="the inverse: λ*, the binding constraint and the headroom of these vllm serve flags")
    p.add_argument("--available-kv-gib", type=_gib, default=None,
                   help="with --from-flags: vLLM's logged 'Available KV cache memory: X GiB' instead of the accounting")
    p.add_argument("--kv-cache-tokens", type=_tokens, default=None,
                   help="with --from-flags: the measured M (vLLM's logged 'GPU KV cache size: N tokens')")
    p.add_argument("--model", default=None, help="the model name in the printed command lines (default: --config)")
    p.add_argument("--seeds", type=_seeds, default=3, help="replications per verification (default 3)")
    p.add_argument("--seed", type=flags.seed, default=0)
    p.add_argument("--no-verify", action="store_true", help="closed forms only; no simulation")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_tune)
