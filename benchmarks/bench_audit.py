"""`kvstab audit` on the paper's setting: wall time and the resolution of λ*.

Run: python benchmarks/bench_audit.py [--profile ci] [--scheduler current-fit]
     [--baseline NAME ...] [--skip properties] [--workers N]
     python benchmarks/bench_audit.py --scheduler benchmarks.plugins.lookahead_headroom:SCHEDULER
       (a lookahead-style plug-in built from the contract's projection combinator: the
       ci profile's 3-minute target holds for plug-ins too)
Prints the wall time of each section and in all (target: ≤ 180 s with the ci
profile), and for each scheduler λ*, its interval and its half-width as a
fraction of μ (target: ≤ 1 %).  The simulations run on whatever engine
`kvstab.audit.runs.run_point` calls.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# the project root, so that the plug-ins under benchmarks/plugins load as module:attr
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvstab.audit.audit import AuditConfig, run_audit  # noqa: E402
from kvstab.audit.profiles import PROFILES  # noqa: E402
from kvstab.model import PAPER_BBAR, ModelParams  # noqa: E402

TARGET_S = 180.0
TARGET_HALF_WIDTH = 0.01


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", choices=tuple(PROFILES), default="ci")
    ap.add_argument("--scheduler", default="current-fit")
    ap.add_argument("--baseline", action="append", default=None, help="default current-fit and vllm-v1; 'none' for none")
    ap.add_argument("--skip", action="append", default=[], choices=("proofs", "properties", "stability"))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    baselines = tuple(b for b in (args.baseline or ["current-fit", "vllm-v1"]) if b != "none")
    cfg = AuditConfig(args.scheduler, ModelParams(bbar=PAPER_BBAR), "paper-1:1", baselines=baselines,
                      profile=PROFILES[args.profile], skip=tuple(args.skip))
    log = (lambda _l: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    ex = ProcessPoolExecutor(args.workers) if args.workers > 1 else None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as smt2:
        res = run_audit(cfg, executor=ex, smt2_dir=Path(smt2), log=log)
    wall = time.perf_counter() - t0
    if ex is not None:
        ex.shutdown()
    print(f"kvstab audit {args.scheduler} (baselines {', '.join(baselines) or 'none'}), paper-1:1, M={cfg.params.M}, "
          f"ŝ={cfg.params.chunk}, b̄={PAPER_BBAR} s, profile {args.profile}, skipped {args.skip or 'nothing'}")
    for name, secs in res.seconds.items():
        print(f"  {name:<11} {secs:8.1f} s")
    print(f"  {'total':<11} {wall:8.1f} s   (target ≤ {TARGET_S:.0f} s: {'met' if wall <= TARGET_S else 'missed'})")
    for name, r in res.regions.items():
        hw = r.half_width / r.mu
        print(f"  {name:<24} λ* = {r.critical_rate:.5g}/s [{r.low:.5g}, {r.high:.5g}] = {r.critical_rate / r.mu:.4f}·μ, "
              f"half-width {hw:.2%} of μ (target ≤ {TARGET_HALF_WIDTH:.0%}: {'met' if hw <= TARGET_HALF_WIDTH else 'missed'})"
              f", {r.saturated.runs[0].point.slots} slots × {len(r.saturated.runs)} seeds per rate")
    print(f"verdict: {res.verdict}")


if __name__ == "__main__":
    main()
