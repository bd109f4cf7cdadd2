"""Benchmark: a fleet's critical rate λ* for each router, on prompts with shared prefixes.

Usage::

    python benchmarks/bench_fleet_routers.py [--case tenants|mooncake|both] [--routers …]
                                             [--horizon S] [--seeds N] [--tolerance T]

Two cases, each replica a ``vllm-v1`` server with prefix caching on its own block pool:

* ``tenants``: 4 small servers (M = 480, ŝ = 16, B = 4, b̄ = 0.05 s), the law
  ``s=U(40,48),o=U(4,8),prefix=tenants(8,32,1)`` (8 tenants, a 32-token system prompt each,
  Zipf(1) popularity: the hottest sends 37 % of the requests);
* ``mooncake``: 4 paper servers (M = 131 000, ŝ = 512, B = 16, b̄ = 0.0372 s), the rows of the
  shipped Mooncake conversation trace in its order with their ``hash_ids`` as prompts, at the
  Poisson rate searched (``kvstab fleet critical --trace mooncake-conversation``).

For each router it prints λ* with its interval (bisection on the queue growth,
:func:`kvstab.fleet.critical.find_fleet_critical_rate`), Σμ (the no-sharing formula), the
saturated throughput and the wall time of the search.  The same figures come from
``kvstab fleet critical --replica … --router R [--trace mooncake-conversation] --workload …``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvstab.data import trace_path
from kvstab.fleet import Replica
from kvstab.fleet.arrivals import trace_rows_poisson
from kvstab.fleet.critical import find_fleet_critical_rate
from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M, ModelParams
from kvstab.traces import load_trace
from kvstab.workload import Workload, parse_workload

ROUTERS = "round-robin,jsq,prefix-affinity,consistent-hash,sglang-router"


def _case(name: str) -> tuple[list[Replica], Workload, Any, str]:
    if name == "tenants":
        params = ModelParams(M=480, chunk=16, block=4, bbar=0.05, prefix_caching=True)
        w = parse_workload("s=U(40,48),o=U(4,8),prefix=tenants(8,32,1)")
        return [Replica(params, "vllm-v1") for _ in range(4)], w, None, "router block 4"
    trace = load_trace(str(trace_path("mooncake-conversation")))
    params = ModelParams(M=PAPER_M, chunk=PAPER_CHUNK, block=16, bbar=PAPER_BBAR, prefix_caching=True)
    w = Workload.joint(trace.s, trace.o, name="mooncake-conversation")

    def draw(rate: float, horizon: float, seed: int, prompts: bool) -> Any:
        return trace_rows_poisson(trace, rate, horizon, seed, prompts=prompts)

    return [Replica(params, "vllm-v1") for _ in range(4)], w, draw, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("tenants", "mooncake", "both"), default="both")
    ap.add_argument("--routers", default=ROUTERS)
    ap.add_argument("--horizon", type=float, default=None, help="seconds per replication (default: per case)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.03, help="half-width target, × Σμ")
    args = ap.parse_args()
    for case in ("tenants", "mooncake") if args.case == "both" else (args.case,):
        fleet, w, draw, _ = _case(case)
        horizon = args.horizon or (200.0 if case == "tenants" else 400.0)
        print(f"== {case}: {len(fleet)} × vllm-v1 (M = {fleet[0].params.M}, B = {fleet[0].params.block}, caching on), "
              f"{w.describe()}, horizon {horizon:g} s × {args.seeds} seeds, tolerance {args.tolerance:g}·Σμ")
        print(f"  {'router':<34} {'λ* [interval] /s':>30} {'λ*/Σμ':>7} {'saturated /s':>14} {'wall s':>7}")
        for spec in args.routers.split(","):
            router = spec
            if case == "tenants" and spec in ("consistent-hash", "sglang-router"):
                router = f"{spec}:block=4"  # the server's block: the 32-token prompts are 8 blocks of it
            t0 = time.perf_counter()
            cr = find_fleet_critical_rate(fleet, router, w, horizon_s=horizon, tolerance=args.tolerance,
                                          seeds=args.seeds, max_seeds=4, draw=draw)
            wall = time.perf_counter() - t0
            sat = "n/a" if cr.saturated is None else f"{cr.saturated.value:.4g}"
            print(f"  {router:<34} {cr.critical:>9.4g} [{cr.low:.4g}, {cr.high:.4g}]{'' if cr.resolved else '?':1} "
                  f"{cr.critical / cr.mu_total:>7.3f} {sat:>14} {wall:>7.1f}", flush=True)
        print(f"  Σμ (no-sharing) = {cr.mu_total:.4g}/s")


if __name__ == "__main__":
    from kvstab.errors import KvstabError

    try:
        main()
    except KvstabError as exc:  # a horizon too short for the trace, a bad router spec: one line
        raise SystemExit(f"bench_fleet_routers: {exc}") from None
