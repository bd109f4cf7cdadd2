"""Replay speed: vLLM's own scheduler vs kvstab's simulator on the same workload.

    python benchmarks/bench_replay.py [--steps 4000] [--M 131000] [--workload paper-1:1] [--load 1.3]

Runs one overloaded Poisson plan three ways and prints steps per second:

* ``vllm``   — vLLM 0.33.0's v1 ``Scheduler`` driven by ``kvstab.empirical`` (needs the vLLM extra);
* ``model``  — kvstab's engine with the ``vllm-v1`` rule and vLLM's request lifecycle
  (what the cross-check compares step for step);
* ``simulate`` — the core ``kvstab.simulator.simulate`` with the ``vllm-v1`` rule
  (kvstab's own lifecycle: restart on preemption).

A speed target lives here, not in the tests (tests/README.md: no timed assertions).
"""

from __future__ import annotations

import argparse
import time

from kvstab.arrivals import poisson_arrivals
from kvstab.empirical.replay import ReplayConfig, replay_model, replay_vllm
from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import simulate
from kvstab.theory.area import expected_g
from kvstab.workload import parse_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--M", type=int, default=131_000)
    ap.add_argument("--workload", default="paper-1:1")
    ap.add_argument("--load", type=float, default=1.3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    w = parse_workload(args.workload)
    cfg = ReplayConfig.for_capacity(args.M, 16, max_num_batched_tokens=512, max_num_seqs=256)
    mu = cfg.M / expected_g(w, ModelParams(M=cfg.M, chunk=512, g="continuous"))
    plan = poisson_arrivals(w, args.load * mu, ModelParams(bbar=1.0), args.steps, seed=args.seed)
    print(f"{args.workload}, M={cfg.M}, B=16, budget 512, {args.steps} steps, {len(plan)} requests, load {args.load}")

    rows = []
    try:
        load_vllm()  # import time is not replay time
        real = replay_vllm(plan, cfg, args.steps)
        rows.append(("vllm (vLLM 0.33.0 Scheduler)", real.wall_s, int(real.completed.sum())))
    except VllmUnavailable as exc:
        real = None
        print(f"vllm: skipped: {exc}")
    model = replay_model(plan, cfg, args.steps)
    rows.append(("model (kvstab engine, vllm-v1 + vLLM lifecycle)", model.wall_s, int(model.completed.sum())))
    t0 = time.perf_counter()
    sim = simulate(load_scheduler("kvstab.schedulers.vllm_v1:SCHEDULER"), cfg.params(), plan, args.steps)
    rows.append(("simulate (kvstab engine, vllm-v1, restart lifecycle)", time.perf_counter() - t0, int(sim.completed.sum())))

    width = max(len(r[0]) for r in rows)
    for name, secs, done in rows:
        print(f"{name:<{width}}  {secs:7.2f} s  {args.steps / secs:8.0f} steps/s  {done} completed")
    if real is not None:
        diff = real.first_difference(model)
        print("model vs vllm: " + ("identical, step for step" if diff is None else f"differ: {diff}"))


if __name__ == "__main__":
    main()
