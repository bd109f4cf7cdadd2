"""Prefix caching: what sharing buys, and what the engine that models it costs.

Run: python benchmarks/bench_prefix_cache.py [--slots 2000] [--load 1.2]

On the shared-system-prompt case of issue 25 (every request 1,280 prompt tokens of
which 1,024 are shared, 256 out; M = 65,536, B = 16, budget 512, max_num_seqs 256),
for each built-in rule the caching runs: the saturated rate with caching on and off
(completions per slot over the second half, flooded at ``--load`` × the rate
measured with caching on), their ratio, and the engine's speed with caching on (slots
and requests per second).  The issue's speed target — 10⁶ requests at 1.2× the
saturated rate in ≤ 10 s on one core — needs a compiled engine with the pool; the
figure printed is the reference engine's, the only one that carries the pool today.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from kvstab.arrivals import poisson_arrivals
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import simulate
from kvstab.workload import parse_workload

SERVER = ModelParams(M=65_536, chunk=512, block=16, token_budget=512, max_num_seqs=256, bbar=1.0, prefix_caching=True)
WORKLOAD = "s=const(1280),o=const(256),prefix=shared(1024)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--slots", type=int, default=2000)
    ap.add_argument("--load", type=float, default=1.2, help="arrivals per slot as a multiple of the caching-on rate")
    args = ap.parse_args()
    if args.slots < 100 or not args.load > 0:
        ap.error("--slots must be >= 100 and --load > 0")
    w = parse_workload(WORKLOAD)
    half = args.slots // 2
    print(f"{WORKLOAD}, M={SERVER.M}, B={SERVER.block}, budget {SERVER.token_budget}, {args.slots} slots")
    print(f"{'scheduler':<14}{'on /slot':>10}{'off /slot':>11}{'on/off':>8}{'slots/s':>10}{'req/s':>9}")
    for name in ("vllm-v1", "current-fit", "reserve", "lookahead"):
        server = SERVER if name == "vllm-v1" else replace(SERVER, token_budget=None, max_num_seqs=None)
        rule = load_scheduler(name)
        # flood at a rate above what caching sustains: first a probe of the saturated rate
        probe = simulate(rule, server, poisson_arrivals(w, 2.0, server, 600, seed=1), 600)
        rate = args.load * max(float(probe.completed[300:].mean()), 0.01)
        plan = poisson_arrivals(w, rate, server, args.slots, seed=0)
        t0 = time.perf_counter()
        on = simulate(rule, server, plan, args.slots)
        wall = time.perf_counter() - t0
        off = simulate(rule, replace(server, prefix_caching=False), plan, args.slots)
        a, b = float(on.completed[half:].mean()), float(off.completed[half:].mean())
        print(
            f"{name:<14}{a:>10.4f}{b:>11.4f}{a / b if b else float('inf'):>8.2f}"
            f"{args.slots / wall:>10.0f}{len(on.s) / wall:>9.0f}"
        )


if __name__ == "__main__":
    main()
