"""The ``kvstab`` command line: the top of the command-line floor.

This module only dispatches.  Each command lives in a CLI module beside the
code it drives — ``kvstab.cli_simulate`` (``simulate``), ``kvstab.cli_replay``
(``replay``, ``check``), and each sub-package's ``cli`` module
(``kvstab.theory.cli``, ``kvstab.proofs.cli``, ``kvstab.empirical.cli``) —
and registers itself through ``register(subparsers)``.  CLI modules import
downward only (shared flags come from :mod:`kvstab.flags`, never from here).
A command's function returns an exit status; any
:class:`~kvstab.errors.KvstabError` becomes one line on stderr and exit
status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from kvstab.errors import InvariantViolation, KvstabError

__all__ = ["main", "build_parser", "add_model_arguments", "positive_float", "positive_int"]

#: modules that add sub-commands (each defines ``register(subparsers)``)
COMMAND_MODULES = (
    "kvstab.cli_simulate",
    "kvstab.cli_replay",
    "kvstab.theory.cli",
    "kvstab.proofs.cli",
    "kvstab.empirical.cli",
    "kvstab.audit.cli",
    "kvstab.live.cli",
    "kvstab.props_cli",
    "kvstab.fleet.cli",
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


# --- kept for the sub-packages' CLIs until they take their flags from kvstab.flags
# (importing kvstab.cli from below is an upward import; tests/test_layers.py lists them)


def _typed(kind: Callable[[str], Any], test: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not test(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return v

    conv.__name__ = what
    return conv


positive_int = _typed(int, lambda v: v > 0, "a positive integer")
positive_float = _typed(float, lambda v: v > 0 and v != float("inf"), "a positive number")
nonneg_int = _typed(int, lambda v: v >= 0, "a non-negative integer")
fraction = _typed(float, lambda v: 0 <= v < 1, "a number in [0, 1)")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The server and workload flags of ``kvstab mu`` / ``derive`` (defaults: the paper's 1:1 setting)."""
    from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M

    p.add_argument("--workload", default="paper-1:1", help="workload spec (default paper-1:1: s, o ~ U(10, 1600))")
    p.add_argument("--M", type=positive_int, default=PAPER_M, help=f"KV capacity in tokens (default {PAPER_M})")
    p.add_argument("--chunk", type=positive_int, default=PAPER_CHUNK, help=f"prefill chunk ŝ (default {PAPER_CHUNK})")
    p.add_argument("--bbar", type=positive_float, default=PAPER_BBAR, help=f"batch time b̄ in s (default {PAPER_BBAR})")
    p.add_argument("--block", type=positive_int, default=1, help="KV block size B in tokens (default 1)")
    p.add_argument("--g", choices=("exact", "continuous"), default="exact", help="g convention (default exact)")


# --- the commands of this module


def _cmd_schedulers(args: argparse.Namespace) -> int:
    from kvstab.contract import traits_of
    from kvstab.registry import registry

    rows = []
    for s in registry():
        rows.append({"name": s.name, "description": s.description, "tags": traits_of(s).tags()})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every available sub-command."""
    parser = _Parser(prog="kvstab", description="Verify the stability of LLM inference under KV-cache limits.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # the sub-package has no CLI (yet); anything else is a real error
                continue
            raise
        mod.register(sub)
        if name == "kvstab.cli_simulate":  # `kvstab --help` lists schedulers second, as it always has
            sch = sub.add_parser("schedulers", help="list the registered schedulers")
            sch.add_argument("--json", action="store_true")
            sch.set_defaults(func=_cmd_schedulers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvstab`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InvariantViolation as exc:
        # the scheduler broke the model: a finding about the scheduler (exit 1, as replay and check
        # give), not bad input
        sys.stderr.write(f"kvstab {args.command}: invariant violated: {_one_line(exc)}\n")
        return 1
    except KvstabError as exc:
        sys.stderr.write(f"kvstab {args.command}: error: {_one_line(exc)}\n")
        return 2
    except KeyboardInterrupt as exc:
        why = f" {exc}" if str(exc) else ""
        sys.stderr.write(f"kvstab {args.command}: interrupted{why}\n")
        return 130
    except BrokenPipeError:
        return 1


def _one_line(exc: BaseException) -> str:
    """An error message on one line (a plug-in's message may hold newlines)."""
    return " ".join(str(exc).split("\n"))


if __name__ == "__main__":
    raise SystemExit(main())
