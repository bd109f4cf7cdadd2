"""The report's latency, memory and waste are at the measured load nearest below λ*, the terminal
prints the latency, and the verdict says in words how λ* compares with each baseline's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstab.audit.report import HEADER, nearest_below, summary_rows
from kvstab.cli.audit import _print_summary


def test_latency_is_at_the_measured_load_nearest_below_the_critical_rate(
    small_audit: tuple[int, Path, dict[str, Any]],
) -> None:
    _, out, data = small_audit
    col = HEADER.index("measured load nearest below λ* (req/s)")
    for row in summary_rows(data):
        st = data["stability"][row[0]]
        measured = [e["rate_per_s"] for e in st["search"] + st["grid"] if e["rate_per_s"] < st["critical_rate_per_s"]]
        assert measured and nearest_below(st)["rate_per_s"] == max(measured)
        assert row[col].startswith(f"{max(measured):.5g} (")
        ev = nearest_below(st)
        assert row[HEADER.index("TTFT p50/p90/p99 (s)")] == "/".join(f"{v:.3g}" for v in ev["ttft_s_p50_p90_p99"])
    assert "measured load nearest below λ*" in (out / "report.md").read_text()


def test_the_terminal_prints_latency(
    small_audit: tuple[int, Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, data = small_audit
    _print_summary(data, {"report.md": out / "report.md"})
    text = capsys.readouterr().out
    assert "TTFT p50/p90/p99 (s)" in text and "end-to-end p50/p90/p99 (s)" in text
    for row in summary_rows(data):
        assert row[HEADER.index("end-to-end p50/p90/p99 (s)")] in text


def test_the_verdict_says_in_words_whether_lambda_star_differs_from_each_baselines(
    small_audit: tuple[int, Path, dict[str, Any]],
) -> None:
    _, _, data = small_audit
    (line,) = [c for c in data["checks"] if c["name"] == "λ* against current-fit"]
    assert line["status"] == "info"
    a, b = data["stability"]["vllm-v1"]["critical_rate_ci_per_s"], data["stability"]["current-fit"]["critical_rate_ci_per_s"]
    word = "higher than" if a[0] > b[1] else "lower than" if a[1] < b[0] else "not distinguishable from"
    assert f"is {word} current-fit's λ*" in line["detail"], line
