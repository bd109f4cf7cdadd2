"""``kvstab props``: the property suite as a kvstab command.

It runs ``pytest --pyargs kvstab.props`` in a child process (a fresh
interpreter, so each run starts from a clean plugin and Hypothesis state), from
any directory, and exits with pytest's status: 0 every property holds, 1 a
property failed (the counterexample and its one-line commands are printed), 2
bad input.  Arguments after ``--`` go to pytest unchanged::

    kvstab props --scheduler my_pkg.sched:SCHEDULER --profile ci -- -x -k p1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

from kvstab.errors import InvalidArgument

__all__ = ["register", "main", "pytest_command"]

#: pytest's exit status for a usage error (a bad option, an unknown scheduler)
_PYTEST_USAGE_ERROR = 4


def pytest_command(schedulers: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """The pytest command line ``kvstab props`` runs."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "kvstab.props"]
    for spec in schedulers:
        cmd += ["--scheduler", spec]
    return cmd + list(extra)


def _parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from kvstab.testing.pytest_plugin import BUDGETS

    p.add_argument("--scheduler", action="append", default=[], metavar="NAME|module:attr",
                   help="scheduler to audit (repeatable; default: every registered built-in, negative controls excluded)")
    p.add_argument("--profile", default=None, metavar="NAME",
                   help=f"cost profile: {', '.join(BUDGETS)} (default: $KVSTAB_PROFILE, else ci)")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="further arguments for pytest, after --")
    return p


def _run(args: argparse.Namespace) -> int:
    from kvstab.testing.pytest_plugin import BUDGETS

    env = dict(os.environ)
    if args.profile is not None:
        if args.profile not in BUDGETS:
            raise InvalidArgument(f"--profile {args.profile!r} is not a kvstab profile; valid: {', '.join(BUDGETS)}")
        env["KVSTAB_PROFILE"] = args.profile
    code = subprocess.call(pytest_command(args.scheduler, args.pytest_args), env=env)
    # pytest already printed its one line for a usage error; the status is kvstab's "bad input"
    return 2 if code == _PYTEST_USAGE_ERROR else code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``kvstab props`` to the CLI."""
    p = sub.add_parser("props", help="run the property suite (pytest --pyargs kvstab.props) against a scheduler")
    _parser(p)
    p.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvstab.cli.props …``: the same as ``kvstab props …``."""
    args = _parser(argparse.ArgumentParser(prog="kvstab props", description=__doc__)).parse_args(argv)
    try:
        return _run(args)
    except InvalidArgument as exc:
        print(f"kvstab props: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
