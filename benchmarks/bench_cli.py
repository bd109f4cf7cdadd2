"""How fast the command line answers: min/median/max wall time over N process runs.

Each case starts a fresh ``python -m kvstab.cli`` process (what the console
script does) and waits for it to print and exit; the figure is wall time from
start to exit. The target (issue 23) is 0.3 s for ``kvstab --help``,
``kvstab``, ``kvstab simulate --bad-flag`` and ``kvstab schedulers``.

usage: python benchmarks/bench_cli.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES: tuple[tuple[str, ...], ...] = (
    ("--help",),
    (),
    ("simulate", "--bad-flag"),
    ("schedulers",),
)


def _runs(text: str) -> int:
    """``--runs``: a whole number of process runs, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more runs") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} runs measure nothing; give 1 or more")
    return n


def measure(args: tuple[str, ...], runs: int) -> list[float]:
    """Wall seconds of ``runs`` fresh processes of ``kvstab ARGS``."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvstab.cli", *args], capture_output=True, check=False)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    """Print one line per case: min, median and max wall time."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=_runs, default=10, help="process runs per case (default 10)")
    runs = ap.parse_args().runs
    measure(("--help",), 1)  # warm the file cache and the bytecode
    for case in CASES:
        t = measure(case, runs)
        name = "kvstab " + " ".join(case)
        print(f"{name:<30} min {min(t):.3f} s  median {statistics.median(t):.3f} s  max {max(t):.3f} s  ({runs} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
