"""Benchmark: the paper's 8-GPU experiment — 8 identical replicas behind round-robin.

Usage::

    python benchmarks/bench_fleet.py [--schedulers current-fit,vllm-v1] [--horizon 6000] [--seeds 4]
                                     [--tolerance 0.01] [--out bench-fleet]
    python benchmarks/bench_fleet.py --speed 1000000 [--schedulers current-fit]

The paper's setting (``docs/MODEL.md``): Meta-Llama-3-8B on A100s, M = 131 000,
ŝ = 512, b̄ = 0.0372 s, P/D 1:1 (``s, o ~ U(10, 1600)``), 8 data-parallel
replicas, stateless round-robin.  For each scheduler (``vllm-v1`` with vLLM's
16-token blocks) it prints

* ``8·μ`` (theory; round-robin on identical replicas loses nothing),
* the fleet's critical rate ``λ*`` by bisection on the queue growth, with its
  95 % interval (:func:`kvstab.fleet.critical.find_fleet_critical_rate`),
* the saturated fleet throughput at 1.2·8μ with its interval,
* the gap ``|8μ − λ*|/λ*`` beside the paper's measured 8-GPU gap (3.38 %),
* the wall time of one fleet run at 8μ (static routing, fast engine),

and writes ``queue-SCHEDULER.png``: the requests waiting in the 8 queues (left)
and in the fleet (right) against time at 0.9·λ* and 1.1·λ* (the shape of the
paper's Fig. 4: bounded below the transition, linear growth above it).
"""

from __future__ import annotations

import argparse
import os
import time

from kvstab.fleet import Replica, poisson_times, simulate_fleet
from kvstab.fleet.critical import find_fleet_critical_rate
from kvstab.fleet.simulate import replica_infos
from kvstab.metrics import against_threshold
from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M, ModelParams
from kvstab.workload import PAPER_WORKLOADS

#: the paper's reported gap |μ_theory − μ_gpu|/μ_gpu for 8 replicas (docs/MODEL.md)
PAPER_GAP_8GPU = 0.0338
REPLICAS = 8


def _plot(path: str, runs: list[tuple[str, object]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, res in runs:
        ax.plot(res.grid_s, res.waiting.sum(axis=0), label=label)  # type: ignore[attr-defined]
        ax2.plot(res.grid_s, res.in_system.sum(axis=0), label=label)  # type: ignore[attr-defined]
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests waiting (all 8 queues)")
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("requests in the fleet (waiting + running)")
    fig.suptitle("8 replicas, round-robin, paper 1:1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _speed(requests: int, scheduler: str) -> None:
    """Time one event-loop run of the paper's 8 replicas behind JSQ (compiled replicas), and a short
    run of the reference loop beside it for the per-request cost it replaces."""
    w = PAPER_WORKLOADS["paper-1:1"]
    block = 16 if scheduler == "vllm-v1" else 1
    fleet = [Replica(ModelParams(M=PAPER_M, chunk=PAPER_CHUNK, block=block, bbar=PAPER_BBAR), scheduler)
             for _ in range(REPLICAS)]
    lam = 24.0
    arr = poisson_times(w, lam, requests / lam, seed=7)
    warm = poisson_times(w, lam, 20.0, seed=1)
    t0 = time.perf_counter()
    simulate_fleet(fleet, "jsq", w, warm)  # loads the cached kernels (compiles them on a fresh checkout)
    load = time.perf_counter() - t0
    c0, t0 = time.process_time(), time.perf_counter()
    res = simulate_fleet(fleet, "jsq", w, arr)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"== {REPLICAS} × {scheduler} (paper server), jsq, λ = {lam:g}/s, {len(arr)} requests over {arr.horizon_s:g} s")
    print(f"  path: {res.path_text}")
    print(f"  wall {wall:.1f} s, CPU {cpu:.1f} s ({1e6 * cpu / len(arr):.1f} µs CPU per request); "
          f"first call (kernel load) {load:.1f} s")
    thr = res.fleet.throughput
    print(f"  fleet throughput {thr.value:.4g}/s [{thr.low:.4g}, {thr.high:.4g}], in system at the end "
          f"{res.fleet.in_system_end}" if thr is not None else "  fleet throughput n/a")
    ref = poisson_times(w, lam, 100.0, seed=7)
    t0 = time.perf_counter()
    simulate_fleet(fleet, "jsq", w, ref, compiled=False)
    per = (time.perf_counter() - t0) / len(ref)
    print(f"  reference event loop: {1e6 * per:.0f} µs per request on {len(ref)} requests "
          f"(→ {per * len(arr) / 60:.0f} min for this run)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedulers", default="current-fit,vllm-v1")
    ap.add_argument("--horizon", type=float, default=6000.0, help="seconds per replication")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=0.01, help="half-width target, × 8μ")
    ap.add_argument("--out", default="bench-fleet")
    ap.add_argument("--speed", type=int, default=0, metavar="REQUESTS",
                    help="only time the event loop: 8 paper replicas behind JSQ at λ = 24/s for about this many "
                         "requests (the issue's target: 1000000 in ≤ 60 s on one core)")
    args = ap.parse_args()
    if args.speed:
        _speed(args.speed, args.schedulers.split(",")[0])
        return
    os.makedirs(args.out, exist_ok=True)
    w = PAPER_WORKLOADS["paper-1:1"]
    for name in args.schedulers.split(","):
        block = 16 if name == "vllm-v1" else 1
        params = ModelParams(M=PAPER_M, chunk=PAPER_CHUNK, block=block, bbar=PAPER_BBAR)
        fleet = [Replica(params, name, f"A100-{k}") for k in range(REPLICAS)]
        infos, _ = replica_infos(fleet, w)
        mu8 = sum(i.mu for i in infos)
        print(f"== {name}: {REPLICAS} replicas, M = {PAPER_M}, ŝ = {PAPER_CHUNK}, B = {block}, b̄ = {PAPER_BBAR} s, "
              f"paper 1:1, round-robin; horizon {args.horizon:g} s × {args.seeds} seeds")
        t0 = time.perf_counter()
        res = simulate_fleet(fleet, "round-robin", w, poisson_times(w, mu8, args.horizon, seed=7))
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        cr = find_fleet_critical_rate(fleet, "round-robin", w, horizon_s=args.horizon, tolerance=args.tolerance,
                                      seeds=args.seeds, log=print)
        search = time.perf_counter() - t0
        gap = abs(mu8 - cr.critical) / cr.critical
        sat = cr.saturated
        print(f"  8·μ (theory)            : {mu8:.4f} req/s (μ = {mu8 / REPLICAS:.4f})")
        print(f"  λ* (bisection)          : {cr.critical:.4f} req/s [{cr.low:.4f}, {cr.high:.4f}]"
              f"{'' if cr.resolved else ' (unresolved)'}")
        print(f"  growth threshold h      : {cr.threshold:.4g} req/s (a rate is stable when its growth is below h, "
              "not below 0: above λ* the growth is λ − λ*, so the search finds λ* + h and reports λ* = that − h)")
        if sat is not None:
            gsat = abs(mu8 - sat.value) / sat.value
            print(f"  saturated throughput    : {sat.value:.4f} req/s [{sat.low:.4f}, {sat.high:.4f}] "
                  f"(gap to 8μ {100 * gsat:.2f} %)")
        print(f"  gap |8μ − λ*|/λ*        : {100 * gap:.2f} %   (paper, 8 A100s: {100 * PAPER_GAP_8GPU:.2f} %)")
        print(f"  one fleet run at 8μ     : {one:.2f} s wall, {res.path_text}, {len(res.replicas[0].arrival_s) * 8} requests")
        print(f"  search                  : {search:.1f} s wall, {len(cr.evaluations)} rates")
        for note in cr.notes:
            print(f"  note: {note}")
        runs = []
        for f in (0.9, 1.1):
            rate = f * cr.critical
            r = simulate_fleet(fleet, "round-robin", w, poisson_times(w, rate, args.horizon, seed=11))
            runs.append((f"λ = {f:g}·λ* = {rate:.2f}/s", r))
            tail = r.waiting.sum(axis=0)[len(r.grid_s) // 2 :]
            print(f"  at {f:g}·λ*: waiting over the last half: mean {tail.mean():.1f}, max {tail.max():.0f}; "
                  f"{r.fleet.in_system_end} in system at the end; "
                  + (f"{against_threshold(r.fleet.queue_slope, cr.threshold)}" if r.fleet.queue_slope is not None
                     else "growth n/a"))
        png = os.path.join(args.out, f"queue-{name}.png")
        _plot(png, runs)
        print(f"  figure                  : {png}")


if __name__ == "__main__":
    main()
