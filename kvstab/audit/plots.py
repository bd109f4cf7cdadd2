"""The audit's PNG plots (matplotlib, headless).

Each function draws one figure from measured regions and returns the file it
wrote; nothing here computes a number the report does not also state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstab.audit.stability import StabilityRegion

__all__ = ["zoom", "throughput_plot", "queue_plot", "memory_plot", "waste_plot", "write_plots"]


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


#: one marker per curve, drawn hollow and shrinking from the first curve to the last, so that
#: curves that coincide (a variant whose λ* equals its baseline's) still show every one of them
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _style(i: int, n: int) -> dict[str, Any]:
    """The line style of curve ``i`` of ``n``: its own marker, hollow, larger for earlier curves."""
    return {"marker": _MARKERS[i % len(_MARKERS)], "ms": 3 + 2.5 * (n - 1 - i), "mfc": "none", "mew": 1.1,
            "lw": 1, "ls": ("-", "--", "-.", ":")[i % 4]}


def zoom(regions: Sequence[StabilityRegion]) -> tuple[float, float]:
    """The rates a plot shows: every λ* interval, widened by one and a half times the spread of the
    intervals (at least 5 % of the largest λ*) on each side, and clipped at 0 — the region of interest,
    where a variant and its baselines differ, rather than the whole search from λ = 0."""
    lo, hi = min(r.low for r in regions), max(r.high for r in regions)
    span = max(hi - lo, 0.05 * max(r.critical_rate for r in regions))
    return max(0.0, lo - 1.5 * span), hi + 1.5 * span


def throughput_plot(regions: Sequence[StabilityRegion], mu: float, mu_delta: float | None, path: Path) -> Path:
    """Throughput vs λ with 95 % intervals, ``λ*`` intervals, and the ``μ``, ``μ(1−δ)`` lines, zoomed on
    the λ* intervals (:func:`zoom`; every rate measured is in ``report.json``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    x0, x1 = zoom(regions)
    ys: list[float] = []
    for i, r in enumerate(regions):
        evs = [e for e in r.all_evaluations if x0 <= e.rate <= x1]
        x = [e.rate for e in evs]
        y = [e.throughput.value for e in evs]
        err = [[e.throughput.value - e.throughput.low for e in evs], [e.throughput.high - e.throughput.value for e in evs]]
        ys += [e.throughput.low for e in evs] + [e.throughput.high for e in evs]
        line = ax.errorbar(x, y, yerr=err, capsize=2, label=f"{r.scheduler} (λ* = {r.critical_rate:.4g}/s)",
                           **_style(i, len(regions)))
        ax.axvspan(r.low, r.high, color=line[0].get_color(), alpha=0.15)
        ax.axvline(r.critical_rate, color=line[0].get_color(), ls=":", lw=1)
    ax.plot([x0, x1], [x0, x1], color="grey", lw=0.8, ls="--", label="throughput = λ")
    ax.axhline(mu, color="black", lw=1.2, label=f"μ = {mu:.4g}/s")
    if mu_delta is not None:
        ax.axhline(mu_delta, color="black", lw=1, ls="-.", label=f"μ(1−δ) = {mu_delta:.4g}/s")
    ax.set_xlim(x0, x1)
    # the measured throughputs and the diagonal over the window; μ lines show when they fall inside
    y0, y1 = min([*ys, x0]), max([*ys, x1])
    pad = 0.05 * (y1 - y0 or 1.0)
    ax.set_ylim(max(0.0, y0 - pad), y1 + pad)
    ax.set_xlabel("arrival rate λ (requests/s)")
    ax.set_ylabel("throughput (requests/s)")
    ax.set_title("Throughput vs λ around λ* (bands: λ* intervals)")
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
    x0, x1 = zoom(regions)
    for i, r in enumerate(regions):
        evs = [e for e in r.all_evaluations if x0 <= e.rate <= x1]
        line = ax.plot([e.rate for e in evs], [getattr(e, attr) for e in evs], label=r.scheduler,
                       **_style(i, len(regions)))
        ax.axvline(r.critical_rate, color=line[0].get_color(), ls=":", lw=1)
    ax.set_xlim(x0, x1)
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
