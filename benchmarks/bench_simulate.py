"""Reference-simulator speed: slots per second for each built-in on the paper's 1:1 setting.

Run: python benchmarks/bench_simulate.py [--slots 3000]
Prints one row per scheduler: wall time, slots/s, completions, and the
`kvstab simulate` default run's wall time (target: under 30 s).
"""

from __future__ import annotations

import argparse
import time

from kvstab.arrivals import poisson_arrivals
from kvstab.errors import InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import builtin_names, load_scheduler
from kvstab.simulator import simulate
from kvstab.theory import mu
from kvstab.workload import PAPER_WORKLOADS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slots", type=int, default=3000)
    ap.add_argument("--load", type=float, default=1.2, help="λ/μ")
    args = ap.parse_args()
    w = PAPER_WORKLOADS["paper-1:1"]
    params = ModelParams()
    rate = args.load * mu(w, params)
    plan = poisson_arrivals(w, rate, ModelParams(), args.slots, seed=0)
    print(f"paper-1:1, M={params.M}, ŝ={params.chunk}, λ={args.load}·μ, {args.slots} slots")
    print(f"{'scheduler':<24}{'wall s':>8}{'slots/s':>10}  completed")
    for name in builtin_names(include_negative=True):
        t0 = time.perf_counter()
        try:
            res = simulate(load_scheduler(name), params, plan, args.slots)
            done = str(int(res.completed.sum()))
        except InvariantViolation as exc:
            done = f"violation at slot {exc.slot}"
        wall = time.perf_counter() - t0
        print(f"{name:<24}{wall:>8.2f}{args.slots / wall:>10.0f}  {done}")


if __name__ == "__main__":
    main()
