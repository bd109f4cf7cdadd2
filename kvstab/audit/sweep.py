"""``kvstab sweep``: the stability sweep alone, over any grid.

The grid is the product of schedulers, workloads (or traces' length laws), ``M``,
``ŝ``, ``b̄`` and rates (absolute, or as multiples of each configuration's
``μ``), times ``replicates``.  Every point is a :class:`~kvstab.audit.runs.Point`
run by :func:`~kvstab.audit.runs.run_point` on a ``concurrent.futures``
executor (local processes by default; Dask's ``Client.get_executor()``).

A point's seed is derived from its key — everything that defines it but the
scheduler, so schedulers meet the same arrivals — so its result does not
depend on the worker or the order.  Each finished point is appended to
``points.jsonl`` at once (one line, flushed and fsynced); ``resume`` skips the
points already there, so a killed sweep resumed gives the same rows as an
uninterrupted one.  ``sweep.csv`` is written in grid order at the end.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvstab.audit.runs import Point, PointResult, derive_seed, load_workload, run_point
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams

__all__ = ["SweepGrid", "grid_points", "run_sweep", "CSV_COLUMNS", "CHECKPOINT", "point_key", "json_row"]

CHECKPOINT = "points.jsonl"
CSV_COLUMNS = [
    "scheduler", "workload", "M", "chunk", "block", "bbar_s", "rate_per_s", "load_over_mu", "mu_per_s", "replicate",
    "seed", "slots", "arrived", "completed", "throughput_per_s", "growth_per_slot", "in_system_end",
    "memory_utilisation", "waste_fraction", "preemptions", "ttft_p50_slots", "ttft_p90_slots", "ttft_p99_slots",
    "e2e_p50_slots", "e2e_p90_slots", "e2e_p99_slots", "fit_probability", "dropped_oversize",
    # μ is the no-sharing formula: with prefix caching measured/μ may exceed 1
    "prefix_caching", "measured_over_mu",
]


@dataclass(frozen=True, slots=True)
class SweepGrid:
    """The axes of a sweep (each a non-empty tuple)."""

    schedulers: tuple[str, ...] = field(metadata={"help": "scheduler specs"})
    workloads: tuple[str, ...] = field(metadata={"help": "workload specs"})
    M: tuple[int, ...] = field(metadata={"help": "KV capacities"})
    chunk: tuple[int, ...] = field(metadata={"help": "prefill chunks ŝ"})
    bbar: tuple[float, ...] = field(metadata={"help": "batch times b̄ (s)"})
    rates: tuple[float, ...] = field(default=(), metadata={"help": "arrival rates (req/s)"})
    loads: tuple[float, ...] = field(default=(), metadata={"help": "arrival rates as multiples of μ"})
    slots: int = field(default=10_000, metadata={"help": "horizon per point"})
    replicates: int = field(default=1, metadata={"help": "seeds per grid cell"})
    seed: int = field(default=0, metadata={"help": "base seed"})
    block: int = field(default=1, metadata={"help": "KV block size B"})
    drop_oversize: bool = field(
        default=False, metadata={"help": "drop requests that cannot fit in M; μ is then of the law given fitting"}
    )
    prefix_caching: tuple[bool, ...] = field(
        default=(),
        metadata={"help": "whether each scheduler's points run with prefix caching, in the order of schedulers "
                  "(empty: off for all; the command line fills it as each engine modelled runs by default)"},
    )

    def __post_init__(self) -> None:
        for name in ("schedulers", "workloads", "M", "chunk", "bbar"):
            if not getattr(self, name):
                raise InvalidArgument(f"the sweep grid needs at least one value of {name}")
        if self.prefix_caching and len(self.prefix_caching) != len(self.schedulers):
            raise InvalidArgument(f"the sweep grid has {len(self.schedulers)} schedulers but "
                                  f"{len(self.prefix_caching)} prefix-caching settings (one per scheduler)")
        if not self.rates and not self.loads:
            raise InvalidArgument("the sweep grid needs rates (--rates λ,…) or loads (--loads λ/μ,…)")


def point_key(p: Point, replicate: int) -> str:
    """The identity of a point in the checkpoint (its seed is derived from it)."""
    key: list[Any] = [p.scheduler, p.workload, p.params.M, p.params.chunk, p.params.block, p.params.bbar, repr(p.rate),
                      p.slots, replicate]
    if p.drop_oversize:  # named only when set, so checkpoints written before the flag keep their keys
        key.append("drop-oversize")
    if p.params.prefix_caching:  # likewise
        key.append("prefix-caching")
    return json.dumps(key)


@dataclass(frozen=True, slots=True)
class _Cell:
    point: Point
    replicate: int
    mu: float
    fit_p: float = 1.0  # P(s + o fits in M): the share of arrivals that reach the server

    @property
    def key(self) -> str:
        return point_key(self.point, self.replicate)


def grid_points(grid: SweepGrid) -> list[_Cell]:
    """Every point of the grid, in grid order, with its derived seed and ``μ``.

    With ``drop_oversize``, ``μ`` is of the law given ``s + o`` fitting in ``M``
    (what reaches the server), and a load ``x`` offers ``x·μ`` of fitting
    requests: the arrival rate is ``x·μ/P(fit)``."""
    from kvstab.theory import stability_report

    cells: list[_Cell] = []
    for wl, M, chunk, bbar in itertools.product(grid.workloads, grid.M, grid.chunk, grid.bbar):
        params = ModelParams(M=M, chunk=chunk, block=grid.block, bbar=bbar)
        law, fit_p = load_workload(wl).given_fit(params) if grid.drop_oversize else (load_workload(wl), 1.0)
        mu = stability_report(law, params).mu_per_s
        rates = [*grid.rates, *(x * mu / fit_p for x in grid.loads)]
        caching = dict(zip(grid.schedulers, grid.prefix_caching))
        for sched, rate, rep in itertools.product(grid.schedulers, rates, range(grid.replicates)):
            # the seed ignores the scheduler (and caching): every scheduler meets the same arrivals
            seed = derive_seed("sweep", grid.seed, wl, M, chunk, grid.block, bbar, repr(rate), grid.slots, rep)
            server = replace(params, prefix_caching=caching.get(sched, False))
            point = Point(sched, server, wl, rate, grid.slots, seed, drop_oversize=grid.drop_oversize)
            cells.append(_Cell(point, rep, mu, fit_p))
    return cells


def _row(cell: _Cell, r: PointResult) -> dict[str, Any]:
    p = cell.point
    return {
        "scheduler": p.scheduler, "workload": p.workload, "M": p.params.M, "chunk": p.params.chunk,
        "block": p.params.block, "bbar_s": p.params.bbar, "rate_per_s": p.rate, "load_over_mu": p.rate * cell.fit_p / cell.mu,
        "mu_per_s": cell.mu, "replicate": cell.replicate, "seed": p.seed, "slots": p.slots, "arrived": r.arrived,
        "completed": r.completed, "throughput_per_s": r.throughput / p.params.bbar, "growth_per_slot": r.slope,
        "in_system_end": r.in_system_end, "memory_utilisation": r.utilisation, "waste_fraction": r.waste,
        "preemptions": r.preemptions,
        **{f"ttft_p{q}_slots": v for q, v in zip((50, 90, 99), r.ttft)},
        **{f"e2e_p{q}_slots": v for q, v in zip((50, 90, 99), r.e2e)},
        "fit_probability": cell.fit_p, "dropped_oversize": r.dropped,
        "prefix_caching": p.params.prefix_caching, "measured_over_mu": r.throughput / p.params.bbar / cell.mu,
    }


#: why a column of a row can be undefined (NaN in the CSV, null in JSON)
_UNDEFINED = {
    "ttft": "no request that arrived after the warm-up finished within the horizon: no latency to take percentiles of",
    "e2e": "no request that arrived after the warm-up finished within the horizon: no latency to take percentiles of",
}


def json_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as strict JSON: an undefined (NaN) value becomes ``null`` and
    ``undefined`` says why, column by column (JSON has no NaN; a parser that
    follows the standard refuses the ``NaN`` Python would print)."""
    out: dict[str, Any] = {}
    why: dict[str, str] = {}
    for k, v in row.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = None
            why[k] = _UNDEFINED.get(k.split("_", 1)[0], "not a number: the run measured nothing to divide by")
        else:
            out[k] = v
    if why:
        out["undefined"] = why
    return out


def read_checkpoint(path: Path) -> dict[str, dict[str, Any]]:
    """Rows already finished, by key.  A last line cut short by a kill is dropped
    (and cut from the file, so appending continues on a clean line)."""
    done: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return done
    raw = path.read_bytes()
    good = 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        row = rec["row"]
        # strict JSON holds an undefined value as null, named under "undefined": back to NaN, as the CSV has it
        for k in row.pop("undefined", None) or {}:
            if row.get(k) is None:
                row[k] = math.nan
        done[rec["key"]] = row
        good += len(line)
    if good < len(raw):
        with open(path, "r+b") as fh:
            fh.truncate(good)
    return done


def run_sweep(
    grid: SweepGrid,
    out: Path,
    *,
    executor: Executor | None = None,
    resume: bool = False,
    log: Callable[[str], None] = lambda _line: None,
) -> list[dict[str, Any]]:
    """Run every point of ``grid`` not yet in ``out/points.jsonl``; write
    ``out/sweep.csv`` (grid order) and plots; return the rows."""
    cells = grid_points(grid)
    ck = out / CHECKPOINT
    if ck.exists() and not resume:
        raise InvalidArgument(f"{ck} exists from an earlier sweep; pass --resume to continue it, or another --out")
    # every point's workload must fit its server: checked before any point runs or any checkpoint is made
    checked: set[tuple[str, Any]] = set()
    for c in cells:
        if (c.point.workload, c.point.params) not in checked:
            load_workload(c.point.workload).check_fits(c.point.params, drop_oversize=grid.drop_oversize)
            checked.add((c.point.workload, c.point.params))
    done = read_checkpoint(ck)
    todo = [c for c in cells if c.key not in done]
    log(f"sweep: {len(cells)} points, {len(cells) - len(todo)} already done, {len(todo)} to run")
    handle: list[Any] = []  # the checkpoint, opened when the first point finishes (a failed start leaves none)
    try:

        def record(cell: _Cell, r: PointResult) -> None:
            row = _row(cell, r)
            done[cell.key] = row
            if not handle:
                handle.append(open(ck, "a", encoding="utf-8"))  # noqa: SIM115 - closed in the finally below
            fh = handle[0]
            fh.write(json.dumps({"key": cell.key, "row": json_row(row)}, allow_nan=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            log(f"  {cell.point.scheduler} λ = {cell.point.rate:.5g}/s rep {cell.replicate}: "
                f"throughput {row['throughput_per_s']:.5g}/s, growth {row['growth_per_slot']:+.3g}/slot")

        if executor is None:
            for c in todo:
                record(c, run_point(c.point))
        else:
            futures: dict[Future[PointResult], _Cell] = {executor.submit(run_point, c.point): c for c in todo}
            for f in as_completed(futures):
                record(futures[f], f.result())
    finally:
        for fh in handle:
            fh.close()
    rows = [done[c.key] for c in cells]
    write_csv(rows, out / "sweep.csv")
    if rows:
        plot_sweep(rows, out / "sweep.png")
    return rows


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """``sweep.csv``: one row per point, :data:`CSV_COLUMNS`, ``repr`` floats (exact)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})


def _groups(rows: Sequence[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    keyf = lambda r: (r["scheduler"], r["workload"], r["M"], r["chunk"], r["bbar_s"])  # noqa: E731
    for k, g in itertools.groupby(sorted(rows, key=lambda r: (keyf(r), r["rate_per_s"])), key=keyf):
        yield f"{k[0]} {k[1]} M={k[2]} ŝ={k[3]} b̄={k[4]}", list(g)


def plot_sweep(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Throughput / μ vs λ / μ, one line per configuration (replicates averaged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    top = 1.0
    for label, g in _groups(rows):
        by_rate: dict[float, list[dict[str, Any]]] = {}
        for r in g:
            by_rate.setdefault(r["rate_per_s"], []).append(r)
        xs = [v[0]["load_over_mu"] for v in by_rate.values()]
        ys = [sum(r["throughput_per_s"] / r["mu_per_s"] for r in v) / len(v) for v in by_rate.values()]
        ax.plot(xs, ys, marker="o", ms=3, lw=1, label=label)
        top = max(top, *xs)
    ax.plot([0, top], [0, top], color="grey", ls="--", lw=0.8, label="throughput = λ")
    ax.axhline(1.0, color="black", lw=1, label="μ")
    ax.set_title("kvstab sweep: throughput vs load")
    ax.set_xlabel("λ / μ")
    ax.set_ylabel("throughput / μ")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

