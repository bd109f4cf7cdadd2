"""``kvstab empirical …``: the vLLM cross-check report and the batch-time fit."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["register"]

def _data_dir(arg: str | None) -> str:
    """The data folder: ``--data``, else ``$KVSTAB_DATA``, else the copy shipped with kvstab."""
    from kvstab.data import data_dir

    return str(data_dir(arg))


def _cmd_compare(args: argparse.Namespace) -> int:
    from kvstab.cli.flags import prefix_caching_for
    from kvstab.empirical.batchtime import load_profile
    from kvstab.empirical.compare import compare, default_cases, model_replay
    from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
    from kvstab.errors import InvalidArgument

    caching = prefix_caching_for(args, "vllm-v1")  # the vLLM cases: on unless --prefix-caching off
    # the SGLang cases: the radix cache on and off beside it when --prefix-caching on is given
    sglang_caching = prefix_caching_for(args, "sglang")
    model_replay(args.engine, caching)  # --engine fast with caching is one line before any work
    if args.sglang_ignore_eos and (not args.sglang or args.no_sglang_real):
        raise InvalidArgument("--sglang-ignore-eos replays on SGLang's own scheduler: it needs --sglang, without --no-sglang-real")
    if not args.no_vllm:
        try:
            load_vllm()  # a missing vLLM is one line before any work
        except VllmUnavailable as exc:
            raise VllmUnavailable(f"{exc}, or pass --no-vllm for kvstab's model alone") from None
    if args.sglang and not args.no_sglang_real:
        from kvstab.empirical.sglang_driver import SglangUnavailable, load_sglang

        try:
            load_sglang()  # a missing SGLang is one line before any work
        except SglangUnavailable as exc:
            raise SglangUnavailable(f"{exc}, or pass --no-sglang-real for kvstab's sglang model alone") from None
    data = _data_dir(args.data) if (args.cases in ("all", "traces") or not args.no_profile) else None
    cases = default_cases(data, args.cases)
    if args.only:
        unknown = sorted(set(args.only) - {c.name for c in cases})
        if unknown:
            valid = ", ".join(c.name for c in cases)
            raise InvalidArgument(f"--only {unknown[0]!r} is not a case of --cases {args.cases}; valid: {valid}")
        cases = [c for c in cases if c.name in args.only]
    profile = None if args.no_profile else load_profile(os.path.join(str(data), "profiles", "a100-llama-3-8b"))
    say = (lambda msg: print(f"kvstab empirical compare: {msg}", file=sys.stderr)) if not args.quiet else None
    report = compare(
        cases,
        args.out,
        steps=args.steps,
        small_steps=args.small_steps,
        seed=args.seed,
        load=args.load,
        warmup=args.warmup,
        use_vllm=not args.no_vllm,
        profile=profile,
        plots=not args.no_plots,
        plot_steps=args.plot_steps,
        progress=say,
        engine=args.engine,
        sglang=args.sglang,
        use_sglang=not args.no_sglang_real,
        ignore_eos=args.sglang_ignore_eos,
        caching=caching,
        sglang_caching=sglang_caching,
    )
    print(report.markdown())
    extra = (", compare-sglang.csv" if report.sglang else "") + (", " + ", ".join(os.path.basename(p) for p in report.plots) if report.plots else "")
    print(f"wrote {args.out}/compare.md, compare.csv, compare.tex" + extra)
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstab empirical`` and its sub-commands."""
    from kvstab.cli.flags import add_prefix_caching, fraction, positive_float, positive_int, seed

    p = subparsers.add_parser(
        "empirical",
        help="cross-check μ against vLLM 0.33.0's own scheduler; batch-time calibration",
        description="Cross-checks against vLLM's real v1 scheduler (needs scripts/install-vllm.sh).",
    )
    sub = p.add_subparsers(dest="empirical_command", required=True, metavar="COMMAND")
    c = sub.add_parser(
        "compare",
        help="μ from the paper's formula, kvstab's vllm-v1 model and vLLM's scheduler, with the gap decomposition",
        description=(
            "Replay overloaded Poisson plans on vLLM's scheduler and on kvstab's vllm-v1 model for the paper's "
            "workloads (M = 131000 and 16384), the real traces and a shared system prompt (M = 65536), with "
            "prefix caching on and off (vLLM's default is on); write compare.md/.csv/.tex and PNG plots."
        ),
    )
    c.add_argument("--out", default="empirical-report", help="output folder (default empirical-report)")
    c.add_argument(
        "--cases", choices=("all", "paper", "small", "traces", "prefix"), default="all",
        help="which cases (default all; prefix: the shared system prompt, shared-prompt@64k)",
    )
    c.add_argument(
        "--only", action="append", metavar="CASE", default=[],
        help="run only this case of --cases (repeatable), e.g. --only sharegpt or --only 'P/D 1:1@16k'",
    )
    c.add_argument("--steps", type=positive_int, default=16_000, help="steps per run at M = 131000 (default 16000)")
    c.add_argument("--small-steps", type=positive_int, default=24_000, help="steps per run at M = 16384 (default 24000)")
    c.add_argument("--plot-steps", type=positive_int, default=6_000, help="steps of the plotted runs (default 6000)")
    c.add_argument("--load", type=positive_float, default=1.3, help="arrival rate as a multiple of μ_paper (default 1.3)")
    c.add_argument("--warmup", type=fraction, default=0.25, help="warm-up fraction excluded (default 0.25)")
    c.add_argument("--seed", type=seed, default=0, help="seed of the arrival plans (default 0)")
    c.add_argument("--data", default=None, help="data folder with traces/ and profiles/ (default: $KVSTAB_DATA, else the data shipped with kvstab)")
    c.add_argument("--no-vllm", action="store_true", help="model only (no vLLM column)")
    c.add_argument("--no-profile", action="store_true", help="skip the A100 profile (b̄, requests/s, batch-time fit)")
    c.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    c.add_argument(
        "--engine", choices=("auto", "fast", "reference"), default="auto",
        help="engine of the vllm-v1 model's replay: auto (default: fast with caching off, reference with caching "
        "on, as the compiled step-log replay has no prefix cache yet), fast (compiled) or reference; identical step logs",
    )
    # the cases fix the server; of the server flags compare takes only --prefix-caching (default: on, as vLLM's)
    add_prefix_caching(c, follows_engine=True)
    c.add_argument(
        "--sglang", action="store_true",
        help="also replay every case on kvstab's sglang model and SGLang 0.5.23's own scheduler "
        "(needs scripts/install-sglang.sh): μ from the formula, the model and SGLang; with an explicit "
        "--prefix-caching on, with SGLang's radix cache on and off beside it, next to vLLM's block cache",
    )
    c.add_argument("--no-sglang-real", action="store_true", help="with --sglang: the sglang model only (no SGLang column)")
    c.add_argument(
        "--sglang-ignore-eos", action="store_true",
        help="with --sglang: also replay every case on SGLang's ignore_eos path (what kvstab bench drives) "
        "and report how far the sglang model is from it",
    )
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    c.set_defaults(func=_cmd_compare, command="empirical compare")
