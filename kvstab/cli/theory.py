"""``kvstab mu`` and ``kvstab derive``: the theory's numbers and its derivation document.

``kvstab mu`` prints ``E[g]``, ``μ``, ``δ``, ``μ(1 − δ)``, the reserve limit and
(with ``--lambda``) the replicas for a load, for a workload spec or a trace
file.  When ``δ ≥ 1`` it prints the numbers that still mean something, says
plainly that the stability guarantee is empty, and exits with status 1.  With
``--replicas-mu`` it also prints the stability region of a fleet of replicas
with those service rates (:mod:`kvstab.theory.fleet`).

``kvstab derive`` writes the derivation document (``--out``, default stdout);
``--pdf`` compiles it with ``pdflatex``.  Give any of ``--workload``, ``--M``,
``--chunk``, ``--bbar``, ``--block``, ``--g`` (or ``--numbers``) to append the
quantities instantiated for that setting; flags left out take the paper's values.

Both take the server flags of :mod:`kvstab.cli.flags` (declared once, from
``ModelParams``); every value, path and output is checked before any work
starts, and a bad one is one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from kvstab import validation as v
from kvstab.cli.flags import add_server_arguments, arg_type, rate, server_params
from kvstab.errors import InvalidArgument
from kvstab.jsonform import dumps
from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M, ModelParams

if TYPE_CHECKING:
    from kvstab.theory.fleet import FleetReport
    from kvstab.theory.report import StabilityReport
    from kvstab.theory.sharing_area import SharingReport
    from kvstab.workload import Workload

__all__ = ["register"]

#: the flags whose presence asks ``derive`` for the numbers section
_MODEL_FLAGS = ("workload", "M", "chunk", "bbar", "block", "g")
#: the theory models neither a running cap nor a token budget: ``mu`` does not take them
_OMIT = ("token_budget", "max_num_seqs")
#: the most replicas ``--replicas-mu`` takes (a fleet of a million GPUs is no typo's fault)
_MAX_REPLICAS = 10**6

_utilisation = arg_type(v.unit_fraction, "the target utilisation ρ")
_service_rate = arg_type(v.positive_float, "a replica's service rate μ_i", maximum=v.MAX_RATE)
_capacity = arg_type(v.positive_int, "a replica's KV capacity M_i", maximum=v.MAX_TOKENS)


def _readable_file(path: str, what: str) -> str:
    """``path`` if it names a readable regular file (or a trace shipped with kvstab, by short name),
    else one clear line."""
    from kvstab.data import TRACES, trace_path

    if not os.path.exists(path) and path in TRACES:
        path = str(trace_path(path))
    if not os.path.exists(path):
        raise InvalidArgument(f"{what} {path!r}: no such file (nor a shipped trace: {', '.join(sorted(TRACES))})")
    if os.path.isdir(path):
        raise InvalidArgument(f"{what} {path!r} is a directory; give a trace file (CSV or JSONL)")
    if not os.path.isfile(path):
        raise InvalidArgument(f"{what} {path!r} is not a regular file; give a trace file (CSV or JSONL)")
    if not os.access(path, os.R_OK):
        raise InvalidArgument(f"{what} {path!r} cannot be read (permission denied)")
    return path


def _check_spec_paths(spec: str) -> None:
    # the paths inside trace(PATH) and empirical(PATH) get the same checks as --trace
    for m in re.finditer(r"(trace|empirical)\(([^)]*)\)", spec, re.IGNORECASE):
        _readable_file(m.group(2).strip(), f"--workload {m.group(1)}(PATH):")


def _workload(args: argparse.Namespace) -> Workload:
    from kvstab.workload import Workload, parse_workload

    trace = args.trace
    try:
        if trace is not None:
            if args.workload is not None:
                raise InvalidArgument(f"give either --workload or --trace, not both (got --workload {args.workload!r})")
            from kvstab.traces import load_trace

            tr = load_trace(_readable_file(trace, "--trace"))
            return Workload.joint(tr.s, tr.o, name=f"trace({trace})")
        spec = args.workload if args.workload is not None else "paper-1:1"
        _check_spec_paths(spec)
        return parse_workload(spec)
    except OSError as exc:  # a file that vanished or became unreadable between the check and the read
        raise InvalidArgument(f"cannot read {exc.filename!r}: {exc.strerror}") from None
    except UnicodeError as exc:
        raise InvalidArgument(f"the trace is not UTF-8 text ({exc})") from None
    except OverflowError:
        # the trace loader stores lengths as int64; a longer one is no request any KV cache holds
        raise InvalidArgument(
            f"a length in {trace or args.workload!r} does not fit in 64 bits; lengths must be at most "
            f"{v.MAX_TOKENS} tokens"
        ) from None


def _params(args: argparse.Namespace) -> ModelParams:
    return server_params(args)


def _fleet(args: argparse.Namespace, rep: StabilityReport) -> FleetReport | None:
    """The fleet of ``--replicas-mu`` (the workload's ``δ`` on each) or of
    ``--replicas-M`` (each replica with its own ``M_i``: ``μ_i = μ·M_i/M`` since
    ``E[g]`` does not depend on ``M``, and ``δ_i = S/M_i``)."""
    from kvstab.theory.fleet import fleet_report

    if args.replicas_mu is not None:
        if len(args.replicas_mu) > _MAX_REPLICAS:
            raise InvalidArgument(f"--replicas-mu takes at most {_MAX_REPLICAS} rates, got {len(args.replicas_mu)}")
        return fleet_report(args.replicas_mu, rep.delta, lam=args.lam)
    if args.replicas_M is not None:
        if len(args.replicas_M) > _MAX_REPLICAS:
            raise InvalidArgument(f"--replicas-M takes at most {_MAX_REPLICAS} capacities, got {len(args.replicas_M)}")
        small = [m for m in args.replicas_M if m < rep.block]
        if small:
            raise InvalidArgument(f"--replicas-M {small[0]} is below the block size B = {rep.block}")
        mus = [rep.mu_per_s * m / rep.M for m in args.replicas_M]
        return fleet_report(mus, [rep.ess_sup_total / m for m in args.replicas_M], lam=args.lam)
    return None


def _cmd_mu(args: argparse.Namespace) -> int:
    from kvstab.theory.report import EMPTY_GUARANTEE, stability_report

    t0 = time.perf_counter()
    workload = _workload(args)
    params = _params(args)
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    rep = stability_report(workload, params, lam=args.lam, rho=args.rho)
    fleet = _fleet(args, rep)
    sharing = _sharing(workload, params, args.lifecycle)
    chat = _chat_estimate(workload, params, args.lifecycle)
    t_mu = time.perf_counter() - t1
    if args.json:
        out = rep.as_dict()
        if fleet is not None:
            out["fleet"] = fleet.as_dict()
        out["sharing"] = sharing.as_dict() if sharing is not None else None
        # a conversation law's μ_share: an estimate (docs/theory.md (c)), apart from the derived forms
        out["sharing_estimate"] = chat.as_dict() if chat is not None else None
        out["timing_s"] = {"load": t_load, "compute": t_mu}
        print(dumps(out, indent=2))
    else:
        _print_mu(rep, args.derivation)
        if sharing is not None:
            print("\n".join(_sharing_lines(sharing, params.bbar)))
        elif chat is not None:
            print(f"μ with sharing  ≈ {chat.mu_share_per_s:.6g} req/s for prefix={chat.law}: a mean-field estimate, "
                  "not a bound (4–16 % above the measured saturated rate, most at short think times; "
                  "docs/theory.md (c)); no guarantee is derived")
        elif workload.prefix is not None:
            print(f"μ with sharing  = not derived for prefix={workload.prefix.describe()} (closed forms: shared, "
                  "tenants, fewshot; chat as an estimate)")
        if fleet is not None:
            print("\n".join(fleet.lines()))
    if rep.guarantee_empty:
        # μ is what was asked for and it still holds: only the sufficient side is empty
        sys.stderr.write(
            f"kvstab mu: μ = {rep.mu_per_s:.6g} req/s is still the necessary bound (no scheduler is stable above "
            f"it); only the sufficient one is lost: {EMPTY_GUARANTEE}\n"
        )
        return 1
    return 0


def _sharing(workload: Workload, params: ModelParams, lifecycle: str) -> SharingReport | None:
    from kvstab.theory.sharing_area import sharing_report

    return sharing_report(workload, params, lifecycle)


def _chat_estimate(workload: Workload, params: ModelParams, lifecycle: str) -> SharingReport | None:
    """The conversation law's mean-field ``μ_share`` (``None`` for any other law)."""
    from kvstab.prefix_laws import Conversation

    if not isinstance(workload.prefix, Conversation):
        return None
    from kvstab.theory.sharing_lru_area import chat_report

    return chat_report(workload, params, lifecycle)


def _sharing_lines(sh: SharingReport, bbar: float) -> list[str]:
    """``μ`` with the shared prompt held once, beside the paper's (theory/sharing.py)."""
    g = sh.guarantee_share_per_s
    up = sh.upper_per_slot
    return [
        f"with prefix caching ({sh.law}, {sh.lifecycle} lifecycle; docs/theory.md, 'Prefix caching'):",
        f"  E[g_h]        = {sh.E_g_net:.6g} token-slots  (area net of the shared part; paper's E[g] = {sh.E_g:.6g})",
        f"  H             = {sh.held_once:.6g} tokens held once  (all shared segments: {sh.held_once_all}; "
        f"N̄ = {sh.mean_running:.4g} running)",
        f"  μ_share       = {sh.mu_share_per_s:.6g} req/s  ((M − H)/(b̄·E[g_h]); paper's μ = "
        f"{sh.mu_per_slot / bbar:.6g}, gain {sh.gain:.3f}×)",
        "  δ_share       = " + ("none (H ≥ M)" if sh.delta_share is None else f"{sh.delta_share:.6g}")
        + f"  (S_h = {sh.ess_sup_net})",
        "  μ_share(1−δ)  = " + ("none" if g is None else f"{g:.6g} req/s"),
        f"  saturated ≈     {sh.predicted_per_slot / bbar:.6g} req/s  (the least ceiling: {sh.binding})",
        "  any policy ≤    " + ("not computed" if up is None else f"{up / bbar:.6g} req/s  (M/(b̄·E[g⁻(s − h, o)]))"),
    ]


def _print_mu(rep: StabilityReport, derivation: bool) -> None:
    m = rep.moments
    lines = [
        f"kvstab mu: {rep.workload}, M={rep.M}, ŝ={rep.chunk}, B={rep.block}, b̄={rep.bbar_s} s, {rep.g_convention} g",
    ]
    if derivation:
        conv = (
            "ŝ(E[n²] − E[n])/2 + E[s] + E[s·o] + (E[o] + E[o²])/2"
            if rep.g_convention == "exact"
            else "(E[s] + E[s²]/ŝ)/2 + E[s·o] + (E[o] + E[o²])/2"
        )
        lines += [
            f"  E[s] = {m.Es:.6g}, E[s²] = {m.Es2:.6g}, E[o] = {m.Eo:.6g}, E[o²] = {m.Eo2:.6g}",
            f"  E[s·o] = {m.Eso:.6g} (Cov = {m.cov:.6g}, corr = {m.corr():.3f}), E[n] = {m.En:.6g}, E[n²] = {m.En2:.6g}",
            f"  E[g] = {conv}" + ("  (B = 1)" if rep.block == 1 else "  + block rounding (exact sum, B > 1)"),
        ]
    lines += [
        f"E[g]            = {rep.E_g:.6g} token-slots",
        f"μ = M/(b̄·E[g])  = {rep.mu_per_s:.6g} req/s  ({rep.mu_per_slot:.6g} req/slot)"
        + ("  (the necessary bound: no scheduler is stable above it, whatever δ)" if rep.guarantee_empty else ""),
        f"δ = S/M         = {rep.delta:.6g}  (S = ess sup(s+o) = {rep.ess_sup_total})",
    ]
    if rep.guarantee_per_s is None:
        lines.append("μ(1−δ)          = none: the stability guarantee is empty (δ ≥ 1)")
    else:
        lines.append(
            f"μ(1−δ)          = {rep.guarantee_per_s:.6g} req/s  (stable below this for a policy that never leaves a "
            "fitting head waiting and does not preempt; kvstab prove --margin gives a scheduler's own)"
        )
    if rep.delta > 1:
        lines.append("reserve limit   = undefined: requests with s + o > M can never be served")
    else:
        lines.append(f"reserve limit   = {rep.reserve_limit_per_s:.6g} req/s  (M/(b̄·E[peak·(n+o)]))")
    if rep.lam_per_s is not None:
        lines.append(f"replicas        = {rep.replicas} for λ = {rep.lam_per_s:g} req/s at ρ = {rep.rho:g}  (⌈λ/(ρμ)⌉)")
        gr = rep.guarantee_replicas
        lines.append(f"guaranteed      = {gr if gr is not None else 'none (δ ≥ 1)'} replicas  (⌈λ/(μ(1−δ))⌉)")
    print("\n".join(lines))


def _check_out(path: str) -> None:
    """Refuse an ``--out`` that cannot be written, before any work: the file is
    opened for appending (and removed again if this created it), so whatever
    the system would refuse later is refused now."""
    if not path:
        raise InvalidArgument("--out is empty; give a file name such as derivation.tex")
    if os.path.isdir(path):
        raise InvalidArgument(f"--out {path!r} is a directory; give a file name such as derivation.tex")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InvalidArgument(f"--out {path!r}: the folder {parent!r} does not exist")
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="ascii"):
            pass
    except OSError as exc:
        raise InvalidArgument(f"--out {path!r}: cannot write there ({exc.strerror})") from None
    if not existed:
        os.remove(path)


def _cmd_derive(args: argparse.Namespace) -> int:
    from kvstab.errors import KvstabError

    # everything that can be refused is refused before the derivation (which takes seconds)
    if args.pdf and args.out is None:
        raise InvalidArgument("--pdf needs --out PATH.tex (the PDF is written beside it)")
    if args.pdf and shutil.which("pdflatex") is None:
        raise KvstabError("pdflatex not found; install TeX (Debian: texlive-latex-base) or omit --pdf")
    if args.out is not None:
        _check_out(args.out)
    from kvstab.theory.report import Instance

    instance = None
    fleet: FleetReport | None = None
    fleet_given = args.replicas_mu is not None or args.replicas_M is not None
    if args.numbers or fleet_given or any(getattr(args, f) is not None for f in _MODEL_FLAGS) or args.trace is not None:
        # the workload's default is applied in _workload (it must stay None beside --trace)
        defaults = {"M": PAPER_M, "chunk": PAPER_CHUNK, "bbar": PAPER_BBAR, "block": 1, "g": "exact"}
        for f, val in defaults.items():
            if getattr(args, f) is None:
                setattr(args, f, val)
        instance = Instance(_workload(args), _params(args), args.lam, args.rho)
        # the numbers section's values, computed now so that a refusal (a replica count
        # beyond any fleet, an unsupported block period) comes before the document's seconds
        from kvstab.theory.report import stability_report

        rep = stability_report(instance.workload, instance.params, instance.lam, instance.rho)
        fleet = _fleet(args, rep)
    # the document imports sympy (about a second): only once every input is known good
    from kvstab.theory.document import compile_pdf, derivation_tex

    text = derivation_tex(instance, fleet=fleet)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w", encoding="ascii") as fh:
            fh.write(text)
    except OSError as exc:
        raise InvalidArgument(f"--out {args.out!r}: cannot write ({exc.strerror})") from None
    print(f"wrote {args.out}")
    if args.pdf:
        print(f"wrote {compile_pdf(args.out)}")
    return 0


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default=None,
        help="workload spec (default paper-1:1: s, o ~ U(10, 1600)): paper-1:1 | paper-2:1 | paper-1:2 | "
        "s=DIST,o=DIST with DIST one of U(a,b), const(v), geom(p,cap), empirical(PATH) | trace(PATH)[,independent]",
    )
    p.add_argument("--trace", metavar="PATH", default=None, help="a trace file: the joint law of its (s, o) rows")
    p.add_argument("--lambda", dest="lam", type=rate, default=None, help="arrival rate λ (req/s) to provision for")
    p.add_argument("--rho", type=_utilisation, default=1.0, help="target utilisation ρ in (0, 1] (default 1)")
    fleet = p.add_mutually_exclusive_group()
    fleet.add_argument(
        "--replicas-mu",
        metavar="MU",
        type=_service_rate,
        nargs="+",
        default=None,
        help="service rates μ_i (req/s) of a fleet's replicas (the workload's δ on each): print (derive: typeset) "
        "the fleet's stability region, the optimal static split and what round-robin loses",
    )
    fleet.add_argument(
        "--replicas-M",
        metavar="M",
        type=_capacity,
        nargs="+",
        default=None,
        help="KV capacities M_i (tokens) of a fleet's replicas, each with this workload, b̄, ŝ and B: "
        "μ_i = M_i/(b̄·E[g]), δ_i = S/M_i; the same fleet report as --replicas-mu",
    )


def register(subparsers: Any) -> None:
    """Add ``mu`` and ``derive`` to the ``kvstab`` command line."""
    mu = subparsers.add_parser(
        "mu",
        help="μ, δ, μ(1−δ), the reserve limit and replicas for a workload or a trace",
        description="Print E[g], μ = M/(b̄·E[g]), δ = ess sup(s+o)/M, μ(1−δ), the reserve policy's limit and, "
        "with --lambda, the replicas for that load.",
        epilog="Exit status: 0; 1 when δ ≥ 1 (the stability guarantee is empty: the numbers are printed, "
        "with one line on stderr saying so); 2 on invalid input.",
    )
    add_server_arguments(mu, omit=_OMIT)
    _add_common(mu)
    mu.add_argument("--derivation", action="store_true", help="also print the moments and the E[g] formula used")
    mu.add_argument(
        "--lifecycle",
        choices=("kvstab", "vllm"),
        default="kvstab",
        help="request lifecycle of μ with sharing (vllm: the first output comes with the last prefill chunk; "
        "default kvstab)",
    )
    mu.add_argument("--json", action="store_true", help="machine-readable output")
    mu.set_defaults(func=_cmd_mu)

    de = subparsers.add_parser(
        "derive",
        help="write the LaTeX derivation document",
        description="Write the derivation document. Any of --workload/--M/--chunk/--bbar/--block/--g/--trace "
        "(or --numbers) appends the quantities for that setting; flags left out take the paper's values.",
    )
    # None marks "not given", so that the document is instantiated only on request
    add_server_arguments(de, omit=_OMIT, defaults={f: None for f in _MODEL_FLAGS if f != "workload"})
    paper = {"M": PAPER_M, "chunk": PAPER_CHUNK, "bbar": PAPER_BBAR, "block": 1, "g": "exact"}
    for action in de._actions:
        if action.dest in paper and action.help:
            # "not given" must stay None to tell derive whether to add the numbers section
            action.help = action.help.replace(
                "(default None)", f"(if left out with others given: {paper[action.dest]})"
            )
    _add_common(de)
    de.add_argument("--numbers", action="store_true", help="instantiate with the paper's 1:1 setting")
    de.add_argument("--out", metavar="PATH", default=None, help="write the .tex here (default: stdout)")
    de.add_argument("--pdf", action="store_true", help="also compile it with pdflatex (needs --out)")
    de.set_defaults(func=_cmd_derive)
