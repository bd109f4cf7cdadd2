"""``kvstab prove``: prove or refute a scheduler's memory invariant.

Prints every obligation with its verdict, the final verdict with the
assumptions it carries (or the replayed counterexample and the one-line
``kvstab replay …`` command), and, with ``--margin``, the work-conservation
margin ``Δ``.  Exit status: 0 proved, 1 refuted, 3 unknown, 2 bad input, and
4 when ``--margin`` proves a margin that contradicts the declared one.

The JSON output is the same, byte for byte, run after run: every wall-clock
figure sits in its one ``timings`` field.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvstab.errors import InvalidArgument
from kvstab.proofs.verdicts import verdict_json

if TYPE_CHECKING:
    from kvstab.proofs.claims import ClaimResult
    from kvstab.proofs.margins import MarginResult
    from kvstab.proofs.prove import ProofReport
    from kvstab.proofs.verdicts import Verdict

__all__ = ["register"]


#: seconds of the total budget kept for the declared claims (at most a quarter of it)
CLAIMS_RESERVE_S = 20.0

#: a run quieter than this (seconds) prints no progress
PROGRESS_AFTER_S = 3.0

#: exit status of a margin the proof contradicts (declared smaller than proved)
MARGIN_CONTRADICTED = 4


def _exit_code(v: Verdict) -> int:
    from kvstab.proofs.verdicts import Proved, Refuted, Unknown

    match v:
        case Proved():
            return 0
        case Refuted():
            return 1
        case Unknown():
            return 3
    raise AssertionError(f"not a verdict: {v!r}")


@dataclass(frozen=True, slots=True)
class _Outcome:
    report: ProofReport
    margin: MarginResult | None
    claims: ClaimResult | None = None
    #: the bounds the claims were checked at (they are bounded proofs, whatever the memory verdict's scope)
    claims_K: int = 0
    claims_Q: int = 0
    #: --K or --Q was above the cap of the bounded claims
    claims_capped: bool = False


def _check_smt2_dir(text: str) -> Path:
    """The ``--smt2-dir`` folder, made and checked writable before any solving."""
    path = Path(text)
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidArgument(f"--smt2-dir {text!r}: {str(parent)!r} is a file, not a folder; give a folder")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgument(f"--smt2-dir {text!r} cannot be created ({exc.strerror}); give a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidArgument(f"--smt2-dir {text!r} is not writable; give a writable folder")
    return path


def _to_stderr(line: str) -> None:
    sys.stderr.write(f"kvstab prove: {line}\n")
    sys.stderr.flush()


def _run(args: argparse.Namespace) -> _Outcome:
    """Orchestration: validate, prove, and establish the margin."""
    from kvstab.cli.flags import prefix_caching_for, server_params
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.invariants import MENU, load_conjunct
    from kvstab.proofs.margins import work_conservation_margin
    from kvstab.proofs.prove import prove, resolve
    from kvstab.proofs.solver import Budget, progress_after

    smt2_dir = _check_smt2_dir(args.smt2_dir) if args.smt2_dir else None
    caching = prefix_caching_for(args, args.scheduler) if args.prefix_caching else False
    if caching and (args.claims or args.margin):
        raise InvalidArgument(
            "--prefix-caching on proves the memory invariant only (the claims and the margin are not yet proved with "
            "shared blocks): drop --claims and --margin, or prove them with --prefix-caching off"
        )
    # M left out is a symbolic M: the server's other fields fix the setting, M stands in at B
    server = server_params(args, M=args.M if args.M is not None else args.block, prefix_caching=caching)
    setting = Setting.from_params(server, symbolic_M=args.M is None, caching=caching)
    budget = Budget(
        rlimit=args.rlimit,
        seed=args.seed,
        timeout_ms=int(args.timeout * 1000),
        smt2_dir=smt2_dir or Budget().smt2_dir,
        keep_all=smt2_dir is not None,
        total_s=args.total_timeout,
        progress=progress_after(_to_stderr, PROGRESS_AFTER_S),
    ).started()  # one clock for the invariant, the margin and the claims
    # the claims are one-slot queries (seconds): with --claims the invariant and the margin stop early
    # enough to leave them their share, so that a long bounded flow cannot leave every claim Unknown
    first = budget.keeping(min(CLAIMS_RESERVE_S, args.total_timeout / 4)) if args.claims else budget
    extra = [load_conjunct(s) for s in args.strengthen]
    sched, _ = resolve(args.scheduler)
    rep = prove(
        args.scheduler,
        K=args.K,
        Q=args.Q,
        bmc_depth=args.bmc,
        setting=setting,
        strengthen=extra,
        use_houdini=not args.no_houdini,
        arrivals_per_slot=args.arrivals,
        budget=first,
        unbounded=args.unbounded,
    )
    marg = None
    if args.margin:
        # the margin is established over the states of the invariant just proved
        used = [MENU[n] for n in rep.strengthening if n in MENU] + [c for c in extra if c.name not in MENU]
        budget.group("work-conservation margin Δ")
        marg = work_conservation_margin(
            sched,
            setting,
            args.margin_K or args.K,
            args.margin_Q or args.Q,
            args.max_s,
            args.max_o,
            conjuncts=used,
            budget=first,
        )
    claims = None
    if args.claims:
        from kvstab.proofs.claims import CLAIMS_MAX, prove_claims

        # a rule made of folds gets each claim for any number of requests where its one-step facts hold;
        # the rest are checked at bounds, at most CLAIMS_MAX (the two-copy queries grow fast), and every
        # output says which scope each claim has
        cK, cQ = min(args.K, CLAIMS_MAX), min(args.Q, CLAIMS_MAX)
        budget.group("declared claims")
        claims = prove_claims(sched, setting, K=cK, Q=cQ, spec=args.scheduler, budget=budget, unbounded=args.unbounded)
        return _Outcome(rep, marg, claims, cK, cQ, (cK, cQ) != (args.K, args.Q))
    return _Outcome(rep, marg, claims)


def _certified(args: argparse.Namespace, marg: MarginResult) -> tuple[float | None, str]:
    """The rate ``kvstab.theory.certified.policy_guarantee`` certifies with the *proved* Δ (as a fraction of μ)."""
    from kvstab.proofs.prove import resolve
    from kvstab.theory.certified import policy_guarantee
    from kvstab.workload import Uniform, Workload

    sched, _ = resolve(args.scheduler)
    params = marg_params(args)
    # the margin run's length bounds, as a workload (the declared margin is read at the same bounds)
    bounds = Workload(s=Uniform(1, marg.max_s), o=Uniform(1, marg.max_o))
    return policy_guarantee(sched, params, bounds, 1.0, proved_margin=marg.delta)


def marg_params(args: argparse.Namespace) -> Any:
    """The concrete server parameters of a ``--margin`` run."""
    from kvstab.cli.flags import server_params

    return server_params(args)


def _margin_contradicted(marg: MarginResult | None) -> bool:
    """A declared margin smaller than the proved one claims more than is true."""
    return marg is not None and marg.delta is not None and marg.declared is not None and marg.declared < marg.delta


def _json(args: argparse.Namespace, out: _Outcome) -> str:
    rep, marg = out.report, out.margin
    doc: dict[str, Any] = {
        "scheduler": rep.scheduler,
        "K": rep.K,
        "Q": rep.Q,
        "unbounded": rep.unbounded,
        "invariants": list(rep.invariants),
        "notes": list(rep.notes),
        "strengthening": list(rep.strengthening),
        "houdini": list(rep.houdini_log),
        "obligations": [{"check": o.label(), **verdict_json(o.verdict)} for o in rep.obligations],
        **verdict_json(rep.verdict),
    }
    if marg is not None:
        doc["margin"] = {
            "delta": marg.delta,
            "delta_over_M": marg.own_delta,
            "one_minus_delta_over_M": None if marg.own_delta is None else 1 - marg.own_delta,
            "declared": marg.declared,
            "contradicts_declared": _margin_contradicted(marg),
            "paper_delta_times_M": marg.paper_delta_tokens,
            "M": marg.M,
            "max_s": marg.max_s,
            "max_o": marg.max_o,
            **verdict_json(marg.verdict),
        }
    if out.claims is not None:
        from kvstab.proofs.claims_folds import SCOPE

        doc["claims_bounds"] = {"K": out.claims_K, "Q": out.claims_Q}
        doc["claims"] = [
            {
                "claim": c.name,
                **verdict_json(c.verdict),
                "bounds": c.scope if c.scope == SCOPE else f"at most {out.claims_K} active and {out.claims_Q} queued requests",
                "note": c.note,
                "facts": list(c.facts),
                "obligations": [{"check": o.label(), **verdict_json(o.verdict)} for o in c.obligations],
                "witness": c.witness,
                "pair": None
                if c.pair is None
                else {
                    "M": c.pair.M,
                    "first": {"active": [list(a) for a in c.pair.first[0]], "waiting": [list(w) for w in c.pair.first[1]]},
                    "second": {
                        "active": [list(a) for a in c.pair.second[0]],
                        "waiting": [list(w) for w in c.pair.second[1]],
                    },
                    "decisions": list(c.pair.decisions),
                    "replayed": c.pair.replayed,
                    "replay_commands": list(c.pair.commands),
                },
            }
            for c in out.claims.claims
        ]
    # wall-clock figures vary run to run: all of them, and only them, here
    doc["timings"] = {
        "total_s": rep.seconds,
        "obligations_s": [o.seconds for o in rep.obligations],
        "margin_s": None if marg is None else [o.seconds for o in marg.obligations],
        "claims_s": None if out.claims is None else [sum(o.seconds for o in c.obligations) for c in out.claims.claims],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _text(args: argparse.Namespace, out: _Outcome) -> str:
    from kvstab.proofs.verdicts import Proved, Refuted, Unknown

    rep, marg = out.report, out.margin
    se = rep.setting
    bounds = "any number of requests" if rep.unbounded else f"K={rep.K} active, Q={rep.Q} queued"
    lines = [
        f"kvstab prove: {rep.scheduler}, {bounds}, "
        f"M={'symbolic' if se.M is None else se.M}, ŝ={se.chunk}, B={se.block}; "
        f"budget {args.total_timeout:g} s in all, {args.timeout:g} s and rlimit {args.rlimit} per query"
    ]
    lines += [f"  {o.seconds:7.2f}s  {str(o.verdict):<48} {o.label()}" for o in rep.obligations]
    lines += [f"  houdini: {line}" for line in rep.houdini_log]
    lines += [f"  {line}" for line in rep.invariants]
    lines += [f"  note: {n}" for n in rep.notes]
    v = rep.verdict
    lines.append(f"verdict: {v}  ({rep.seconds:.1f} s)")
    match v:
        case Proved():
            lines += [f"  assuming {a}" for a in v.assumptions]
        case Refuted() if v.trace is not None:
            lines.append(v.trace.describe())
        case Unknown() if v.smt2:
            lines.append(f"  query kept at {v.smt2}")
    if out.claims is not None:
        lines += _claims_text(out)
    if marg is not None:
        if marg.delta is None:
            d = "undecided"
        elif marg.M is None:
            d = f"{marg.delta} tokens for every M ≥ {marg.paper_delta_tokens}"
        else:
            d = f"{marg.delta} tokens (Δ/M = {marg.own_delta:.4f})"
        lines.append(
            f"margin Δ: {d}; declared {marg.declared}; paper δ·M = ess sup(s+o) = {marg.paper_delta_tokens}  "
            f"[{marg.verdict}]"
        )
        if marg.delta is not None and marg.M is not None:
            rate, why = _certified(args, marg)
            lines.append(f"  certified: {why}" if rate is None else f"  certified stability region: λ < {rate:.4f}·μ ({why})")
        if _margin_contradicted(marg):
            lines.append(
                f"  FAILED: the declared margin {marg.declared} is smaller than the proved Δ = {marg.delta}; "
                "the scheduler's margin() claims more than is true"
            )
        if marg.witness is not None:
            w = marg.witness
            lines.append(f"  tight: active {list(w.active)} waiting {list(w.waiting)} -> memory {w.memory}")
    return "\n".join(lines)


def _claims_text(out: _Outcome) -> list[str]:
    """The declared claims, each with its scope: for any number of requests, or the bounds it was checked at."""
    from kvstab.proofs.claims import CLAIMS_MAX
    from kvstab.proofs.claims_folds import SCOPE
    from kvstab.proofs.verdicts import Proved

    assert out.claims is not None
    cs = out.claims.claims
    free = [c for c in cs if c.scope == SCOPE]
    bounds = f"K ≤ {out.claims_K}, Q ≤ {out.claims_Q}"
    notes = {c.note for c in cs if c.scope != SCOPE}
    # a rule outside the class has one reason for every claim: say it once
    shared = next(iter(notes)) if len(notes) == 1 and not free else None
    head = f"declared claims: {len(free)} for any number of requests, {len(cs) - len(free)} bounded ({bounds}"
    head += f"; --K/--Q above {CLAIMS_MAX} are capped here)" if len(free) < len(cs) and out.claims_capped else ")"
    lines = [head]
    if shared:
        lines.append(f"  bounded because: {shared}")
    if free and isinstance(free[0].verdict, Proved):
        lines.append("  the claims for any number of requests assume:")
        lines += [f"    {a}" for a in free[0].verdict.assumptions]
    for c in cs:
        lines.append(f"claim {c.name}: {c.verdict}  [{c.scope if c.scope == SCOPE else bounds}]")
        lines += [f"  rests on {f}" for f in c.facts]
        if c.note and not shared:
            lines.append(f"  note: {c.note}")
        if c.witness:
            lines += [f"  {line}" for line in c.witness.splitlines()]
    return lines


def _cmd_prove(args: argparse.Namespace) -> int:
    from kvstab.cli.flags import decide_limit
    from kvstab.proofs.encoding import decide_time_limit
    from kvstab.proofs.solver import Interrupted, ctrl_c_stops_solving
    from kvstab.registry import load_scheduler

    try:
        limit = decide_limit(args, load_scheduler(args.scheduler))
        with ctrl_c_stops_solving(), decide_time_limit(limit):
            out = _run(args)
    except Interrupted as exc:
        sys.stderr.write(f"kvstab prove: {exc}\n")
        return 130
    print(_json(args, out) if args.json else _text(args, out))
    code = _exit_code(out.report.verdict)
    if out.claims is not None and code == 0:
        code = _exit_code(out.claims.verdict)
    if out.margin is not None and code == 0:
        if out.margin.delta is None:
            code = 3
        elif _margin_contradicted(out.margin):
            code = MARGIN_CONTRADICTED
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab prove`` to the CLI."""
    from kvstab import validation as v
    from kvstab.cli.flags import (
        DEFAULT_DECIDE_TIMEOUT_S,
        add_prefix_caching,
        add_server_arguments,
        arg_type,
        decide_timeout,
        nonneg_int,
        positive_float,
        positive_int,
    )
    from kvstab.proofs.solver import DEFAULT_TOTAL_S, MAX_RLIMIT

    p = sub.add_parser("prove", help="prove (z3) or refute a scheduler's per-slot memory invariant")
    p.add_argument("--scheduler", required=True, help="registered name or module:attr")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--unbounded",
        dest="unbounded",
        action="store_true",
        default=True,
        help="(the default) prove for any number of requests where the rule is made of kvstab.contract's folds; "
        "other rules get the bounded proof and a note saying so",
    )
    scope.add_argument(
        "--bounded",
        dest="unbounded",
        action="store_false",
        help="only the bounded proof (K active, Q queued requests)",
    )
    bound = arg_type(v.positive_int, "a bound", maximum=64)
    p.add_argument("--K", type=bound, default=8, help="active-request slots (default 8)")
    p.add_argument("--Q", type=bound, default=4, help="queued-request slots the rule sees (default 4)")
    p.add_argument("--bmc", type=bound, default=12, help="bounded-model-checking depth in slots (default 12)")
    p.add_argument("--arrivals", type=bound, default=2, help="arrivals per slot in BMC (default 2)")
    add_server_arguments(p, defaults={"M": None}, omit=("g", "bbar"))
    add_prefix_caching(p, follows_engine=False)
    p.add_argument(
        "--strengthen",
        action="append",
        default=[],
        metavar="NAME|module:attr",
        help="extra invariant conjunct: a menu name or a user Conjunct (repeatable)",
    )
    p.add_argument(
        "--claims",
        action="store_true",
        help="also prove what the scheduler declares: FCFS admissions, non-clairvoyance (two copies), progress",
    )
    p.add_argument("--no-houdini", action="store_true", help="do not search the menu for a strengthening")
    p.add_argument(
        "--margin",
        action="store_true",
        help="also establish the work-conservation margin Δ (at --M, or one Δ for every M when M is symbolic)",
    )
    p.add_argument("--max-s", type=positive_int, default=16, help="prompt-length bound for --margin (default 16)")
    p.add_argument("--max-o", type=positive_int, default=8, help="output-length bound for --margin (default 8)")
    p.add_argument("--margin-K", type=bound, default=None, help="K for the margin search (default --K)")
    p.add_argument("--margin-Q", type=bound, default=None, help="Q for the margin search (default --Q)")
    p.add_argument(
        "--rlimit",
        type=arg_type(v.positive_int, "--rlimit", maximum=MAX_RLIMIT),
        default=200_000_000,
        help=f"z3 resource limit per query (deterministic; at most {MAX_RLIMIT})",
    )
    p.add_argument("--timeout", type=positive_float, default=300.0, help="wall-clock budget per query, seconds")
    p.add_argument(
        "--total-timeout",
        type=arg_type(v.positive_float, "--total-timeout"),
        default=DEFAULT_TOTAL_S,
        help=f"wall-clock budget of the whole run, seconds (default {DEFAULT_TOTAL_S:g}); what is undecided "
        "when it ends is Unknown and says so",
    )
    p.add_argument(
        "--decide-timeout",
        type=decide_timeout,
        default=DEFAULT_DECIDE_TIMEOUT_S,
        metavar="S",
        help=f"fail if one call of the rule's decide (on symbolic values or a decoded state) takes longer than "
        f"S seconds (default {DEFAULT_DECIDE_TIMEOUT_S:g} for a plug-in, none for a built-in; 0: no limit)",
    )
    p.add_argument("--seed", type=nonneg_int, default=0, help="z3 random seed (default 0)")
    p.add_argument("--smt2-dir", default=None, help="keep every obligation here as SMT-LIB (certificates)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_prove)
