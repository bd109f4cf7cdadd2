"""What the audit shows a reader: every curve visible when curves coincide, axes zoomed on λ*, one note
for the rates the point estimate decided (with h), messages cut only at a word boundary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvstab.audit import plots


def _region(name: str, star: float, rates: list[float]) -> Any:
    """A stand-in for a StabilityRegion: what the plots read of one."""
    evs = tuple(SimpleNamespace(rate=r, throughput=SimpleNamespace(value=min(r, star), low=min(r, star) - 0.01,
                                                                    high=min(r, star) + 0.01),
                                utilisation=min(1.0, r / star), waste=0.0) for r in rates)
    return SimpleNamespace(scheduler=name, critical_rate=star, low=star - 0.02, high=star + 0.02, all_evaluations=evs)


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The axes each plot would save."""
    axes: list[Any] = []

    def keep(plt: Any, fig: Any, ax: Any, path: Path) -> Path:
        axes.append(ax)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    return axes


def test_coinciding_curves_each_keep_a_visible_marker_and_the_axes_zoom_on_lambda_star(
    drawn: list[Any], tmp_path: Path
) -> None:
    # a variant identical to its baseline, searched from λ = 0.4 up to 4/s, everything happening near 3.2/s
    rates = [0.4, 1.6, 3.0, 3.1, 3.15, 3.2, 3.25, 3.3, 4.0]
    regions = [_region("my-rule", 3.2, rates), _region("current-fit", 3.2, rates)]
    plots.throughput_plot(regions, mu=3.3, mu_delta=3.1, path=tmp_path / "t.png")
    plots.memory_plot(regions, tmp_path / "m.png")
    for ax in drawn:
        lines = [ln for ln in ax.get_lines() if ln.get_marker() in plots._MARKERS]
        assert len(lines) == 2
        # different markers, hollow, the first drawn larger so the second shows inside it
        assert lines[0].get_marker() != lines[1].get_marker()
        assert lines[0].get_markersize() > lines[1].get_markersize()
        assert all(ln.get_markerfacecolor() == "none" for ln in lines)
        x0, x1 = ax.get_xlim()
        # the λ* intervals are inside the window, which is far narrower than the search from 0 to 4/s
        assert x0 <= 3.18 and x1 >= 3.22 and x1 - x0 < 1.0 and x0 > 2.5
    legend = [t.get_text() for t in drawn[0].get_legend().get_texts()]
    assert any("my-rule (λ* = 3.2/s)" in t for t in legend) and any("current-fit" in t for t in legend)


def test_the_zoom_keeps_distant_lambda_stars_both_in_view() -> None:
    lo, hi = plots.zoom([_region("a", 1.0, [1.0]), _region("b", 3.0, [3.0])])
    assert lo <= 0.98 and hi >= 3.02


def test_rates_classified_by_their_point_estimate_are_named_in_one_note_with_h() -> None:
    from kvstab.audit import stability

    class Search:
        profile = SimpleNamespace(max_evaluations=14)

        def evaluate(self, rate: float) -> Any:
            # every rate straddles h: the point estimate decides, stable below 3.2/s
            return SimpleNamespace(rate=rate, verdict="stable" if rate < 3.2 else "unstable",
                                   decided_by="point estimate", runs=(1,) * 8)

    notes: list[str] = []
    evaluations: list[Any] = []
    stability._bisect(Search(), 3.0, 0.01, 0.05, 3.3, evaluations, notes)  # type: ignore[arg-type]
    said = [n for n in notes if "undecided" in n]
    assert len(evaluations) > 3 and len(said) == 1, notes
    assert f"{len(evaluations)} rates" in said[0] and "h = 0.05/s" in said[0] and "8 seeds" in said[0]


def test_a_clipped_message_ends_on_a_whole_word_and_says_it_was_cut() -> None:
    from kvstab.testing.pytest_plugin import clip

    text = "scheduler declares FCFS but request 2 was admitted before earlier arrival(s) [1] " * 3
    got = clip(text, 60)
    assert len(got) <= 60 and got.endswith("…") and text.startswith(got[:-1])
    assert text[len(got) - 1] == " " and clip("short", 60) == "short"
