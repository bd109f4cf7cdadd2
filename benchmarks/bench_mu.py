"""Benchmark: μ for a 30,000-row trace (target: under 100 ms, loading excluded).

Usage::

    python benchmarks/bench_mu.py [PATH] [--rows 30000] [--block 1] [--repeat 20]

PATH defaults to the ShareGPT length trace shipped in ``kvstab/data/traces/``;
without it, a synthetic 30,000-row trace (heavy-tailed, correlated lengths) is
written to a temporary file so the benchmark always measures the same path:
``load_trace`` → ``Workload.joint`` → :func:`kvstab.theory.stability_report`.

Reports: loading the CSV; the first μ in a fresh process (numpy only: the
forms are generated from sympy ahead of time, see ``kvstab.theory.codegen``);
the median of later calls; and the median of the full report.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from kvstab.data import trace_path
from kvstab.model import ModelParams
from kvstab.theory import mu, stability_report
from kvstab.traces import load_trace
from kvstab.workload import Workload

DEFAULT = str(trace_path("sharegpt"))


def _synthetic(rows: int, path: str) -> None:
    rng = np.random.default_rng(0)
    s = np.minimum(8192, rng.lognormal(7.0, 1.0, rows).astype(np.int64) + 1)
    o = np.minimum(4096, (rng.lognormal(5.0, 1.0, rows) * (1 + 1000 / s)).astype(np.int64) + 1)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("s,o\n")
        fh.writelines(f"{a},{b}\n" for a, b in zip(s, o))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=DEFAULT)
    ap.add_argument("--rows", type=int, default=30_000)
    ap.add_argument("--block", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path
        if not os.path.isfile(path):
            path = os.path.join(tmp, "synthetic.csv")
            _synthetic(args.rows, path)
        t0 = time.perf_counter()
        trace = load_trace(path)
        t_load = time.perf_counter() - t0
    w = Workload.joint(trace.s[: args.rows], trace.o[: args.rows], name=os.path.basename(path))
    params = ModelParams(block=args.block)
    t0 = time.perf_counter()
    first = mu(w, params)
    t_first = time.perf_counter() - t0
    mu_times, report_times = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        value = mu(w, params)
        mu_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        stability_report(w, params, lam=50.0)
        report_times.append(time.perf_counter() - t0)
    assert value == first
    print(f"trace            {path} ({w.joint_s.size if w.joint_s is not None else 0} rows, B = {args.block})")
    print(f"load CSV         {t_load * 1e3:8.1f} ms")
    print(f"μ, first call    {t_first * 1e3:8.1f} ms  (first call in this process)")
    print(f"μ, median        {statistics.median(mu_times) * 1e3:8.2f} ms  over {args.repeat} calls")
    print(f"full report      {statistics.median(report_times) * 1e3:8.2f} ms  (μ, δ, μ(1−δ), reserve limit, replicas)")
    print(f"μ = {first:.6g} req/s")


if __name__ == "__main__":
    main()
