"""The ``kvstab`` command line: one module per command, and this dispatcher.

The commands live beside each other in this package (as ``vllm/entrypoints/cli``
does it): ``simulate``, ``schedulers``, ``replay``/``check``, ``mu``/``derive``
(:mod:`kvstab.cli.theory`), ``prove``, ``empirical``, ``audit``/``sweep``,
``fleet``/``plan``, ``serve``/``bench`` (:mod:`kvstab.cli.live`) and ``props``.
Each module defines ``register(subparsers)``; shared flags come from
:mod:`kvstab.cli.flags`.  The dispatcher knows every command's name and help
line from :data:`COMMANDS` and imports only the module of the command being
run, so ``kvstab --help`` and a bad command answer without loading a wing.

A command's function returns an exit status; any
:class:`~kvstab.errors.KvstabError` becomes one line on stderr and exit
status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from kvstab.errors import InvariantViolation, KvstabError

__all__ = ["main", "build_parser", "COMMANDS", "Command"]


@dataclass(frozen=True, slots=True)
class Command:
    """A sub-command: its name, the module that registers it, and its one-line help."""

    name: str
    module: str
    help: str


#: every sub-command, in the order ``kvstab --help`` lists them
COMMANDS: tuple[Command, ...] = (
    Command("simulate", "kvstab.cli.simulate",
            "simulate a scheduler (fast or reference engine) and compare throughput with μ"),
    Command("schedulers", "kvstab.cli.schedulers", "list the registered schedulers"),
    Command("replay", "kvstab.cli.replay",
            "replay a concrete workload slot by slot (the fast engine for built-ins, else the reference simulator)"),
    Command("check", "kvstab.cli.replay",
            "run a workload through every property check of the audit suite (properties 1–8), slot by slot on the "
            "reference engine's states (the per-slot checks keep the reference engine as the oracle)"),
    Command("mu", "kvstab.cli.theory", "μ, δ, μ(1−δ), the reserve limit and replicas for a workload or a trace"),
    Command("derive", "kvstab.cli.theory", "write the LaTeX derivation document"),
    Command("prove", "kvstab.cli.prove", "prove (z3) or refute a scheduler's per-slot memory invariant"),
    Command("empirical", "kvstab.cli.empirical",
            "cross-check μ against vLLM 0.33.0's own scheduler; batch-time calibration"),
    Command("audit", "kvstab.cli.audit",
            "audit a scheduler end to end: theory, proofs, properties, stability region, report"),
    Command("sweep", "kvstab.cli.audit", "the stability sweep over a grid of rates, M, ŝ, b̄, schedulers, workloads"),
    Command("serve", "kvstab.cli.live", "an OpenAI-compatible server emulating vLLM's scheduler (for tests and rehearsals)"),
    Command("bench", "kvstab.cli.live", "load an OpenAI-compatible server and compare its saturated rate with μ"),
    Command("props", "kvstab.cli.props",
            "run the property suite (pytest --pyargs kvstab.props) against a scheduler"),
    Command("fleet", "kvstab.cli.fleet", "replicas behind a router: simulate, critical rate, routers"),
    Command("plan", "kvstab.cli.fleet", "the cheapest fleet from a GPU menu (MILP), verified by simulation"),
    Command("tune", "kvstab.cli.tune", "vLLM/SGLang flags for a target λ, or λ* of existing flags (--from-flags)"),
)

_BY_NAME = {c.name: c for c in COMMANDS}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every command listed, the full flags of ``command`` only
    (``None``: of every command, which imports every command module)."""
    parser = _Parser(prog="kvstab", description="Verify the stability of LLM inference under KV-cache limits.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    loaded: set[str] = set()
    for c in COMMANDS:
        if command is not None and c.name != command:
            if c.module not in loaded:
                sub.add_parser(c.name, help=c.help)  # listed for --help; its flags are not needed
            continue
        if c.module in loaded:
            continue
        loaded.add(c.module)
        importlib.import_module(c.module).register(sub)
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` loading only the chosen command's module (the first word that is a command)."""
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen in _BY_NAME:
        # the chosen command's module registers its sibling commands too: stubs would clash
        module = _BY_NAME[chosen].module
        parser = _Parser(prog="kvstab", description="Verify the stability of LLM inference under KV-cache limits.")
        sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
        importlib.import_module(module).register(sub)
        return parser.parse_args(argv)
    return build_parser(command="").parse_args(argv)  # help, or a one-line error naming the bad command


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvstab`` console script."""
    args = _parse(list(sys.argv[1:] if argv is None else argv))
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
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise  # a fault in kvstab itself keeps its traceback
        # SystemExit, GeneratorExit or another BaseException inside a command comes from a plug-in's
        # code (kvstab's own exits happen while parsing, above): it must not end kvstab silently
        sys.stderr.write(f"kvstab {args.command}: error: {_plugin_blame(args, exc)}\n")
        return 2


#: the flags through which a command loads code of the user's (``module:attr``)
_PLUGIN_FLAGS = ("scheduler", "schedulers", "baseline", "baselines", "replica", "router", "routers", "strengthen")


def _plugin_blame(args: argparse.Namespace, exc: BaseException) -> str:
    """The line for a ``BaseException`` a plug-in raised inside a command: what it
    raised, and which plug-in (the module of the deepest frame outside kvstab and
    the standard library, else the plug-ins the command line names)."""
    from kvstab.errors import plugin_fault

    given: list[str] = []
    for key in _PLUGIN_FLAGS:
        value = getattr(args, key, None)
        given += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str)]
    named = ", ".join(repr(g) for g in given) or "a plug-in"
    module = _plugin_module(exc)
    where = f" (module {module!r})" if module is not None else ""
    return f"plug-in {named}{where} raised {plugin_fault(exc)}"


def _plugin_module(exc: BaseException) -> str | None:
    """The module of the deepest traceback frame outside kvstab and the standard library."""
    import sysconfig
    import traceback

    stdlib = sysconfig.get_paths()["stdlib"]
    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        name = str(frame.f_globals.get("__name__", ""))
        if name == "kvstab" or name.startswith("kvstab.") or frame.f_code.co_filename.startswith(stdlib):
            continue
        found = name
    return found


def _one_line(exc: BaseException) -> str:
    """An error message on one line (a plug-in's message may hold newlines)."""
    return " ".join(str(exc).split("\n"))


if __name__ == "__main__":
    raise SystemExit(main())
