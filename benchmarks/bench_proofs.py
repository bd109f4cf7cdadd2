"""Proof time against the number of active slots ``K`` for each built-in: memory and the declared claims.

    taskset -c 1 python benchmarks/bench_proofs.py [--K 2 4 8 16] [--Q 4] [--timeout 60] [--selfcheck 100000]

Each cell runs, in its own subprocess, ``kvstab.proofs.prove`` (the memory
invariant) and then ``kvstab.proofs.claims.prove_claims`` (what the rule
declares), each with ``--timeout`` as its total budget (what it leaves
undecided is ``Unknown``, not a kill; a kill 30 s later is the backstop), and
prints the verdicts, the wall seconds, the CPU seconds of the child (the
machine is shared: wall time alone is noisy) and the 1-minute load average
when the cell started.

Rows, for every built-in (``vllm-v1`` also with ``B = 16``, a token budget
of 2048 and ``max_num_seqs = 256``):

* **bounded** (``kvstab prove --bounded --claims --K k``): the bounded flow
  at ``K = k``, ``Q = --Q``, and the claims at ``min(k, 8)``, ``min(Q, 8)``
  (the CLI's cap); after a memory (or claims) ``Unknown`` the larger ``K`` of
  that row are not run;
* **default** (``kvstab prove --claims --K k``): the theorem for any number of
  requests where the rule is in the prefix-fold class, its claims likewise
  (each claim falls back to the bounded check where its one-step facts fail).
  A verdict marked "(any K)" does not depend on ``K``: it is measured once and
  covers every column; a rule outside the class gets its bounded flow at each
  ``K``.

Target (issue 13): every built-in ``Proved`` at ``K = 8``, ``Q = 4`` in ≤ 10 s.
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

#: the CLI's cap on the bounded claims (``kvstab/cli/prove.py``)
CLAIMS_MAX = 8

CHILD = """
import json, sys, time
from kvstab.proofs.claims import prove_claims
from kvstab.proofs.encoding import Setting
from kvstab.proofs.prove import prove, resolve
from kvstab.proofs.solver import Budget
name, K, Q, cK, cQ, bmc, block, tb, seqs, unbounded, total, with_claims = sys.argv[1:13]
setting = Setting(block=int(block), token_budget=None if tb == "-" else int(tb),
                  max_num_seqs=None if seqs == "-" else int(seqs))
t, c = time.perf_counter(), time.process_time()
rep = prove(name, K=int(K), Q=int(Q), bmc_depth=int(bmc), setting=setting, unbounded=unbounded == "1",
            budget=Budget(total_s=float(total)))
t1, c1 = time.perf_counter(), time.process_time()
out = {"verdict": type(rep.verdict).__name__ + (" (any K)" if rep.unbounded else ""), "seconds": t1 - t,
       "cpu_seconds": c1 - c}
if with_claims == "0":
    print(json.dumps(out))
    sys.exit(0)
claims = prove_claims(resolve(name)[0], setting, K=int(cK), Q=int(cQ), spec=name, budget=Budget(total_s=float(total)),
                      unbounded=unbounded == "1")
t2, c2 = time.perf_counter(), time.process_time()
free = sum(1 for x in claims.claims if x.scope == "any number of requests")
print(json.dumps({**out, "claims": type(claims.verdict).__name__, "claims_free": free, "claims_n": len(claims.claims),
                  "claims_seconds": t2 - t1, "claims_cpu_seconds": c2 - c1}))
"""


def run_cell(
    name: str, K: int, Q: int, bmc: int, timeout: float, block: int = 1, budget: int | None = None,
    seqs: int | None = None, unbounded: bool = False, with_claims: bool = True,
) -> dict[str, object]:
    """One ``prove`` and one ``prove_claims`` in a fresh interpreter; ``{"verdict": "timeout"}`` past the limit."""
    t = time.perf_counter()
    argv = [name, K, Q, min(K, CLAIMS_MAX), min(Q, CLAIMS_MAX), bmc, block, budget or "-", seqs or "-",
            int(unbounded), timeout, int(with_claims)]
    load = os.getloadavg()[0]
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, *map(str, argv)],
            capture_output=True, text=True, timeout=2 * timeout + 30, check=True,
        )
    except subprocess.TimeoutExpired:
        return {"verdict": "timeout", "seconds": time.perf_counter() - t, "load": load}
    except subprocess.CalledProcessError as exc:
        return {"verdict": "error", "seconds": time.perf_counter() - t, "stderr": exc.stderr[-300:], "load": load}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "load": load}


def _memory(r: dict[str, object]) -> str:
    if r["verdict"] in ("timeout", "error"):
        return f"{r['verdict']} after {float(r['seconds']):.0f} s"  # type: ignore[arg-type]
    return f"{float(r['seconds']):.1f} s ({float(r['cpu_seconds']):.1f} cpu) {r['verdict']}"  # type: ignore[arg-type]


def _claims(r: dict[str, object]) -> str:
    if "claims" not in r:
        return "not run"
    n, free = int(r["claims_n"]), int(r["claims_free"])  # type: ignore[call-overload]
    scope = "any K" if free == n else ("bounded" if free == 0 else f"{free} of {n} any K")
    return f"{float(r['claims_seconds']):.1f} s ({float(r['claims_cpu_seconds']):.1f} cpu) {r['claims']} ({scope})"  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--Q", type=int, default=4)
    ap.add_argument("--bmc", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=60.0, help="total budget of each proof in a cell, seconds")
    ap.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS))
    ap.add_argument("--selfcheck", type=int, default=0, help="time the encoding self-check on N states per rule")
    args = ap.parse_args(argv)
    settings: list[tuple[str, str, int, int | None, int | None]] = [(n, n, 1, None, None) for n in args.schedulers]
    if "vllm-v1" in args.schedulers:
        settings.append(("vllm-v1, B = 16, token budget 2048, max_num_seqs 256", "vllm-v1", 16, 2048, 256))
    rows: dict[str, dict[int, dict[str, object] | str]] = {}
    load0 = os.getloadavg()
    for unbounded in (False, True):
        for label, name, block, tb, seqs in settings:
            row = f"{label} ({'default' if unbounded else '--bounded'})"
            rows[row] = {}
            stop_memory = stop_claims = False
            for K in args.K:
                if stop_memory:
                    rows[row][K] = "not run"
                    continue
                first = rows[row].get(args.K[0])
                if isinstance(first, dict) and str(first["verdict"]).endswith("(any K)") and first.get("claims_free") == first.get("claims_n"):
                    rows[row][K] = "same proof (any K)"
                    continue
                r = run_cell(name, K, args.Q, args.bmc, args.timeout, block, tb, seqs, unbounded, not stop_claims)
                rows[row][K] = r
                # an undecided cell spent its budget: larger K would too
                stop_memory = r["verdict"] in ("timeout", "error") or str(r["verdict"]).startswith("Unknown")
                stop_claims = stop_claims or str(r.get("claims", "")).startswith("Unknown")
                print(f"{row} K={K}: {_memory(r)}; claims {_claims(r)}; load {float(r['load']):.2f}",  # type: ignore[arg-type]
                      file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print(f"load average (1, 5, 15 min) before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
          f"after {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; {os.cpu_count()} cores; "
          f"affinity {sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}")
    for what, fmt in (("memory invariant", _memory), ("declared claims", _claims)):
        print(f"\n{what}: | scheduler (Q = {args.Q}, bmc = {args.bmc}) | " + " | ".join(f"K = {k}" for k in args.K) + " |")
        print("|---|" + "---|" * len(args.K))
        for row, cells in rows.items():
            shown = [c if isinstance(c, str) else f"{fmt(c)} [load {float(c['load']):.1f}]" for c in (cells[k] for k in args.K)]  # type: ignore[arg-type]
            print(f"| {row} | " + " | ".join(shown) + " |")
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
