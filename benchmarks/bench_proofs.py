"""Proof time against the number of active slots ``K`` for each built-in.

    python benchmarks/bench_proofs.py [--K 2 4 8 16] [--Q 4] [--timeout 120]

Each cell runs ``kvstab.proofs.prove`` (the default flow of ``kvstab prove``:
1-induction, quick BMC on a memory CTI, Houdini, BMC to ``--bmc`` slots) in
its own subprocess with a wall-clock limit, and prints the verdict and the
seconds.  After a cell exceeds the limit the larger ``K`` of that scheduler
are not run.  Target (issue 4): ``K = 8``, ``Q = 4`` under 10 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SCHEDULERS = ("current-fit", "reserve", "lookahead", "current-fit-no-preempt")

CHILD = """
import json, sys, time
from kvstab.proofs.prove import prove
name, K, Q, bmc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = time.perf_counter()
rep = prove(name, K=K, Q=Q, bmc_depth=bmc)
print(json.dumps({"verdict": type(rep.verdict).__name__, "seconds": time.perf_counter() - t,
                  "strengthening": list(rep.strengthening), "queries": len(rep.obligations)}))
"""


def run_cell(name: str, K: int, Q: int, bmc: int, timeout: float) -> dict[str, object]:
    """One ``prove`` in a fresh interpreter; ``{"verdict": "timeout"}`` past the limit."""
    t = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, name, str(K), str(Q), str(bmc)],
            capture_output=True,
            text=True,
            timeout=timeout,
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
    ap.add_argument("--timeout", type=float, default=120.0, help="wall-clock limit per cell, seconds")
    ap.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    args = ap.parse_args(argv)
    rows: dict[str, dict[int, str]] = {}
    for name in args.schedulers:
        rows[name] = {}
        skip = False
        for K in args.K:
            if skip:
                rows[name][K] = "not run"
                continue
            r = run_cell(name, K, args.Q, args.bmc, args.timeout)
            if r["verdict"] == "timeout":
                rows[name][K] = f"> {args.timeout:.0f} s"
                skip = True
            else:
                rows[name][K] = f"{float(r['seconds']):.1f} s {r['verdict']}"  # type: ignore[arg-type]
            print(f"{name} K={K}: {rows[name][K]}", file=sys.stderr, flush=True)
    print(f"| scheduler (Q = {args.Q}, bmc = {args.bmc}) | " + " | ".join(f"K = {k}" for k in args.K) + " |")
    print("|---|" + "---|" * len(args.K))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells[k] for k in args.K) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
