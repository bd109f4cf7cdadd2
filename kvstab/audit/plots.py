"""The audit's PNG plots (matplotlib, headless).

Each function draws one figure from measured regions and returns the file it
wrote; nothing here computes a number the report does not also state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstab.audit.stability import StabilityRegion

__all__ = ["throughput_plot", "queue_plot", "memory_plot", "waste_plot", "write_plots"]


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def throughput_plot(regions: Sequence[StabilityRegion], mu: float, mu_delta: float | None, path: Path) -> Path:
    """Throughput vs λ with 95 % intervals, ``λ*`` intervals, and the ``μ``, ``μ(1−δ)`` lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    top = 0.0
    for r in regions:
        evs = r.all_evaluations
        x = [e.rate for e in evs]
        y = [e.throughput.value for e in evs]
        err = [[e.throughput.value - e.throughput.low for e in evs], [e.throughput.high - e.throughput.value for e in evs]]
        line = ax.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=f"{r.scheduler}")
        ax.axvspan(r.low, r.high, color=line[0].get_color(), alpha=0.15)
        ax.axvline(r.critical_rate, color=line[0].get_color(), ls=":", lw=1)
        top = max(top, max(x))
    ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="throughput = λ")
    ax.axhline(mu, color="black", lw=1.2, label=f"μ = {mu:.4g}/s")
    if mu_delta is not None:
        ax.axhline(mu_delta, color="black", lw=1, ls="-.", label=f"μ(1−δ) = {mu_delta:.4g}/s")
    ax.set_xlabel("arrival rate λ (requests/s)")
    ax.set_ylabel("throughput (requests/s)")
    ax.set_title("Throughput vs λ (bands: λ* intervals)")
    ax.legend(fontsize=8, loc="upper left")
    return _save(plt, fig, ax, path)


def queue_plot(region: StabilityRegion, path: Path) -> Path:
    """Number in system over time just below and just above ``λ*`` (one seed each)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for ev, style in ((region.below, "-"), (region.above, "-")):
        if ev is None:
            continue
        run = ev.runs[0]
        xs = [i * run.series_step * region.params.bbar for i in range(len(run.queue_series))]
        ax.plot(xs, run.queue_series, style, lw=1,
                label=f"λ = {ev.rate:.4g}/s ({ev.rate / region.critical_rate:.2f}·λ*)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests in system")
    ax.set_title(f"{region.scheduler}: queue just below and above λ* = {region.critical_rate:.4g}/s")
    ax.legend(fontsize=8)
    return _save(plt, fig, ax, path)


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> Path:
    """Grid, layout, write the PNG and free the figure (every plot of the report ends so)."""
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _per_rate(regions: Sequence[StabilityRegion], path: Path, attr: str, ylabel: str, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for r in regions:
        evs = r.all_evaluations
        line = ax.plot([e.rate for e in evs], [getattr(e, attr) for e in evs], marker="o", ms=3, lw=1, label=r.scheduler)
        ax.axvline(r.critical_rate, color=line[0].get_color(), ls=":", lw=1)
    ax.set_xlabel("arrival rate λ (requests/s)  (dotted: λ*)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(plt, fig, ax, path)


def memory_plot(regions: Sequence[StabilityRegion], path: Path) -> Path:
    """Mean memory utilisation (memory / M) vs λ."""
    return _per_rate(regions, path, "utilisation", "memory used / M", "Memory utilisation vs λ")


def waste_plot(regions: Sequence[StabilityRegion], path: Path) -> Path:
    """Preemption waste (area thrown away / area served) vs λ."""
    return _per_rate(regions, path, "waste", "wasted area / served area", "Preemption waste vs λ")


def write_plots(regions: Sequence[StabilityRegion], mu: float, mu_delta: float | None, out: Path) -> dict[str, Path]:
    """Every plot of the report into ``out``; name → file."""
    return {
        "throughput": throughput_plot(regions, mu, mu_delta, out / "throughput.png"),
        "queue": queue_plot(regions[0], out / "queue.png"),
        "memory": memory_plot(regions, out / "memory.png"),
        "waste": waste_plot(regions, out / "waste.png"),
    }
