"""Proof time against the number of active slots ``K`` for each built-in.

    python benchmarks/bench_proofs.py [--K 2 4 8 16] [--Q 4] [--timeout 60] [--selfcheck 100000]

Each cell runs ``kvstab.proofs.prove`` (the default flow of ``kvstab prove``:
1-induction, quick BMC on a memory CTI, Houdini, BMC to ``--bmc`` slots) in
its own subprocess with ``--timeout`` as the run's total budget (what it
leaves undecided is ``Unknown``) and a kill 30 s later as the backstop, and
prints the verdict, the wall seconds and the CPU seconds of the child (the
machine is shared: wall time alone is noisy), and the load average before
and after.  After a cell exceeds the limit the larger ``K`` of that scheduler
are not run.  Rows: the built-ins at ``B = 1``; ``vllm-v1`` with ``B = 16``
and a token budget of 2048; and the unbounded proof (``--unbounded``, no
``K``) of each built-in.  Target (issue 13): ``K = 8``, ``Q = 4`` under 10 s.
``--selfcheck N`` also times the encoding's self-check on ``N`` random states
per rule (the test suite runs 10 500 in all).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SCHEDULERS = ("current-fit", "reserve", "lookahead", "vllm-v1", "sglang", "current-fit-no-preempt")

CHILD = """
import json, sys, time
from kvstab.proofs.encoding import Setting
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
name, K, Q, bmc, block, budget, unbounded, total = sys.argv[1:9]
setting = Setting(block=int(block), token_budget=None if budget == "-" else int(budget))
t, c = time.perf_counter(), time.process_time()
rep = prove(name, K=int(K), Q=int(Q), bmc_depth=int(bmc), setting=setting, unbounded=unbounded == "1",
            budget=Budget(total_s=float(total)))
print(json.dumps({"verdict": type(rep.verdict).__name__ + (" (any K)" if rep.unbounded else ""),
                  "seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
                  "strengthening": list(rep.strengthening), "queries": len(rep.obligations)}))
"""

def run_cell(
    name: str, K: int, Q: int, bmc: int, timeout: float, block: int = 1, budget: int | None = None, unbounded: bool = False
) -> dict[str, object]:
    """One ``prove`` in a fresh interpreter; ``{"verdict": "timeout"}`` past the limit."""
    t = time.perf_counter()
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                name,
                str(K),
                str(Q),
                str(bmc),
                str(block),
                "-" if budget is None else str(budget),
                "1" if unbounded else "0",
                str(timeout),
            ],
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            check=True,
        )
    except subprocess.TimeoutExpired:
        return {"verdict": "timeout", "seconds": time.perf_counter() - t}
    except subprocess.CalledProcessError as exc:
        return {"verdict": "error", "seconds": time.perf_counter() - t, "stderr": exc.stderr[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--Q", type=int, default=4)
    ap.add_argument("--bmc", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=60.0, help="total budget per cell, seconds")
    ap.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    ap.add_argument("--selfcheck", type=int, default=0, help="time the encoding self-check on N states per rule")
    args = ap.parse_args(argv)
    rows_spec: dict[str, tuple[str, int, int | None, bool]] = {n: (n, 1, None, False) for n in args.schedulers}
    if "vllm-v1" in args.schedulers:
        rows_spec["vllm-v1, B = 16, token budget 2048"] = ("vllm-v1", 16, 2048, False)
    for n in args.schedulers:
        rows_spec[f"{n} --unbounded"] = (n, 1, None, True)
    rows: dict[str, dict[int, str]] = {}
    load0 = os.getloadavg()
    for label, (name, block, tb, unbounded) in rows_spec.items():
        rows[label] = {}
        skip = False
        for K in args.K:
            if skip:
                rows[label][K] = "not run"
                continue
            r = run_cell(name, K, args.Q, args.bmc, args.timeout, block, tb, unbounded)
            if r["verdict"] == "timeout":
                rows[label][K] = f"> {args.timeout:.0f} s (killed)"
                skip = True
            else:
                cpu = r.get("cpu_seconds")
                rows[label][K] = f"{float(r['seconds']):.1f} s{'' if cpu is None else f' ({float(cpu):.1f} cpu)'} {r['verdict']}"  # type: ignore[arg-type]
                # an undecided cell spent its budget: larger K would too
                skip = str(r["verdict"]).startswith("Unknown")
            print(f"{label} K={K}: {rows[label][K]}", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; {os.cpu_count()} cores")
    print(f"| scheduler (Q = {args.Q}, bmc = {args.bmc}) | " + " | ".join(f"K = {k}" for k in args.K) + " |")
    print("|---|" + "---|" * len(args.K))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells[k] for k in args.K) + " |")
    if args.selfcheck:
        selfcheck(args.selfcheck)
    return 0


def selfcheck(n: int) -> None:
    """Time the encoding's self-check: ``n`` random states per rule against ``Engine.step``."""
    import random

    from kvstab.model import tokens_held
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.selfcheck import CompiledStep, compare, engine_step
    from kvstab.registry import builtin_names, load_scheduler

    rng = random.Random(0)
    se = Setting(M=None, chunk=3, block=2, token_budget=5)
    total, bad, t0 = 0, 0, time.perf_counter()
    for name in builtin_names(include_negative=True):
        step = CompiledStep(load_scheduler(name), se, 3, 3)
        for _ in range(n):
            M = rng.randint(4, 48)

            def req(M: int = M) -> tuple[int, int]:
                while True:
                    s, o = rng.randint(1, 16), rng.randint(1, 10)
                    if tokens_held(s + o, se.block) <= M:
                        return s, o

            act = []
            for _ in range(rng.randint(0, 3)):
                s, o = req()
                act.append((s, o, rng.randint(1, s + o - 1)) if s + o > 1 else (1, 1, 1))
            state = (M, tuple(act), tuple(req() for _ in range(rng.randint(0, 3))))
            bad += bool(compare(step(state), engine_step(step.scheduler, se, state)))
            total += 1
    secs = time.perf_counter() - t0
    print(f"self-check: {total} states, {bad} disagreements, {secs:.1f} s ({secs / total * 1e6:.0f} µs per state)")


if __name__ == "__main__":
    raise SystemExit(main())
