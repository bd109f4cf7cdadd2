"""``kvstab prove``: prove or refute a scheduler's memory invariant.

Prints every obligation with its verdict and time, the final verdict with the
assumptions it carries (or the replayed counterexample and the one-line
``kvstab replay …`` command), and, with ``--margin``, the work-conservation
margin ``Δ``.  Exit status: 0 proved, 1 refuted, 3 unknown (2: bad input).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvstab.contract import traits_of
from kvstab.errors import InvalidArgument

__all__ = ["register"]

EXIT = {"Proved": 0, "Refuted": 1, "Unknown": 3}


def _verdict_json(v: Any) -> dict[str, Any]:
    from kvstab.proofs.verdicts import Proved, Refuted

    out: dict[str, Any] = {"verdict": type(v).__name__}
    if isinstance(v, Proved):
        out.update(method=v.method, assumptions=list(v.assumptions))
    elif isinstance(v, Refuted):
        out.update(detail=v.detail, trace=v.trace.to_json() if v.trace else None)
    else:
        out.update(reason=v.reason, smt2=v.smt2)
    return out


def _cmd_prove(args: argparse.Namespace) -> int:
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.invariants import load_conjunct
    from kvstab.proofs.margins import work_conservation_margin
    from kvstab.proofs.prove import prove
    from kvstab.proofs.solver import Budget
    from kvstab.proofs.verdicts import Refuted

    setting = Setting(
        M=args.M, chunk=args.chunk, block=args.block, token_budget=args.token_budget, max_num_seqs=args.max_num_seqs
    )
    budget = Budget(
        rlimit=args.rlimit, seed=args.seed, smt2_dir=Path(args.smt2_dir) if args.smt2_dir else Budget().smt2_dir
    )
    extra = [load_conjunct(s) for s in args.strengthen]
    if args.margin and args.M is None:
        raise InvalidArgument("--margin needs a fixed --M (and --max-s, --max-o)")
    rep = prove(
        args.scheduler,
        K=args.K,
        Q=args.Q,
        bmc_depth=args.bmc,
        setting=setting,
        strengthen=extra,
        use_houdini=not args.no_houdini,
        arrivals_per_slot=args.arrivals,
        budget=budget,
    )
    marg = None
    sched = None
    if args.margin:
        from kvstab.proofs.invariants import MENU
        from kvstab.proofs.prove import resolve

        # the margin is established over the states of the invariant just proved
        used = [MENU[n] for n in rep.strengthening if n in MENU] + [c for c in extra if c.name not in MENU]
        sched, _ = resolve(args.scheduler)
        marg = work_conservation_margin(
            sched,
            setting,
            args.margin_K or args.K,
            args.margin_Q or args.Q,
            args.max_s,
            args.max_o,
            conjuncts=used,
            budget=budget,
        )
    if args.json:
        out: dict[str, Any] = {
            "scheduler": rep.scheduler,
            "K": rep.K,
            "Q": rep.Q,
            "seconds": rep.seconds,
            "strengthening": list(rep.strengthening),
            "houdini": list(rep.houdini_log),
            "obligations": [
                {"check": o.label(), "seconds": o.seconds, **_verdict_json(o.verdict)} for o in rep.obligations
            ],
            **_verdict_json(rep.verdict),
        }
        if marg is not None:
            out["margin"] = {
                "delta": marg.delta,
                "delta_over_M": marg.own_delta,
                "one_minus_delta_over_M": None if marg.own_delta is None else 1 - marg.own_delta,
                "declared": marg.declared,
                "paper_delta_times_M": marg.paper_delta_tokens,
                "M": marg.M,
                "max_s": marg.max_s,
                "max_o": marg.max_o,
                **_verdict_json(marg.verdict),
            }
        print(json.dumps(out, indent=2))
    else:
        print(
            f"kvstab prove: {rep.scheduler}, K={rep.K} active, Q={rep.Q} queued, "
            f"M={'symbolic' if setting.M is None else setting.M}, ŝ={setting.chunk}, B={setting.block}"
        )
        for o in rep.obligations:
            print(f"  {o.seconds:7.2f}s  {str(o.verdict):<48} {o.label()}")
        for line in rep.houdini_log:
            print(f"  houdini: {line}")
        print(f"verdict: {rep.verdict}  ({rep.seconds:.1f} s)")
        v = rep.verdict
        if hasattr(v, "assumptions"):
            for a in v.assumptions:  # type: ignore[attr-defined]
                print(f"  assuming {a}")
        if isinstance(v, Refuted) and v.trace is not None:
            print(v.trace.describe())
        if hasattr(v, "smt2") and v.smt2:  # type: ignore[attr-defined]
            print(f"  query kept at {v.smt2}")  # type: ignore[attr-defined]
        if marg is not None:
            d = "undecided" if marg.delta is None else f"{marg.delta} tokens (Δ/M = {marg.own_delta:.4f})"
            print(
                f"margin Δ: {d}; declared {marg.declared}; paper δ·M = ess sup(s+o) = {marg.paper_delta_tokens}  [{marg.verdict}]"
            )
            if marg.delta is not None:
                factor = 1 - marg.delta / marg.M
                if traits_of(sched).preempts:
                    print(
                        f"  certifies memory in use ≥ M − Δ while requests wait; with recompute preemption the "
                        f"wasted area also enters the drift, so μ(1 − Δ/M) = {factor:.4f}·μ is not certified"
                    )
                else:
                    print(f"  certified stability region: λ < μ(1 − Δ/M) = {factor:.4f}·μ")
            if marg.witness is not None:
                w = marg.witness
                print(f"  tight: active {list(w.active)} waiting {list(w.waiting)} -> memory {w.memory}")
    code = EXIT[type(rep.verdict).__name__]
    if marg is not None and code == 0 and marg.delta is None:
        code = 3
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab prove`` to the CLI."""
    from kvstab.cli import nonneg_int, positive_int

    p = sub.add_parser("prove", help="prove (z3) or refute a scheduler's per-slot memory invariant")
    p.add_argument("--scheduler", required=True, help="registered name or module:attr")
    p.add_argument("--K", type=positive_int, default=8, help="active-request slots (default 8)")
    p.add_argument("--Q", type=positive_int, default=4, help="queued-request slots the rule sees (default 4)")
    p.add_argument("--bmc", type=positive_int, default=12, help="bounded-model-checking depth in slots (default 12)")
    p.add_argument("--arrivals", type=positive_int, default=2, help="arrivals per slot in BMC (default 2)")
    p.add_argument("--M", type=positive_int, default=None, help="fix M (default: symbolic, any M)")
    p.add_argument("--chunk", type=positive_int, default=512, help="prefill chunk ŝ, fixed (default 512)")
    p.add_argument("--block", type=positive_int, default=1, help="KV block size B, fixed (default 1)")
    p.add_argument("--token-budget", type=positive_int, default=None, help="tokens per slot (vLLM max_num_batched_tokens)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help="cap on running requests")
    p.add_argument(
        "--strengthen",
        action="append",
        default=[],
        metavar="NAME|module:attr",
        help="extra invariant conjunct: a menu name or a user Conjunct (repeatable)",
    )
    p.add_argument("--no-houdini", action="store_true", help="do not search the menu for a strengthening")
    p.add_argument("--margin", action="store_true", help="also establish the work-conservation margin Δ (needs --M)")
    p.add_argument("--max-s", type=positive_int, default=16, help="prompt-length bound for --margin (default 16)")
    p.add_argument("--max-o", type=positive_int, default=8, help="output-length bound for --margin (default 8)")
    p.add_argument("--margin-K", type=positive_int, default=None, help="K for the margin search (default --K)")
    p.add_argument("--margin-Q", type=positive_int, default=None, help="Q for the margin search (default --Q)")
    p.add_argument("--rlimit", type=positive_int, default=200_000_000, help="z3 resource limit per query")
    p.add_argument("--seed", type=nonneg_int, default=0, help="z3 random seed (default 0)")
    p.add_argument("--smt2-dir", default=None, help="where undecided queries are saved")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_prove)
