"""``kvstab audit --window``: the queue window every simulation of the audit shows the rule, as
``kvstab simulate --window`` does."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _audit_support import SMALL

from kvstab.audit import stability
from kvstab.audit.audit import AuditConfig, run_audit
from kvstab.audit.profiles import get_profile
from kvstab.audit.runs import Point, run_point
from kvstab.cli import main
from kvstab.model import DEFAULT_WINDOW, ModelParams

TESTS = Path(__file__).resolve().parents[1]
ONLY_THEORY = ["--skip", "proofs", "--skip", "properties", "--skip", "stability", "--quiet"]


def test_audit_takes_window_and_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--scheduler", "current-fit", *SMALL, "--window", "64", *ONLY_THEORY,
                 "--out", str(tmp_path / "a")]) == 0
    assert "window 64" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "report.json").read_text())["window"] == 64
    assert "queue window 64" in (tmp_path / "a" / "report.md").read_text()
    assert main(["audit", "--scheduler", "current-fit", *SMALL, *ONLY_THEORY, "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "report.json").read_text())["window"] == DEFAULT_WINDOW


def test_a_bad_window_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--scheduler", "current-fit", *SMALL, "--window", "0", *ONLY_THEORY, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "queue window" in err.splitlines()[-1], err


class _Seen(Exception):
    """Stops the search at its first batch of points."""


def test_every_stability_run_gets_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Point] = []

    def record(points: list[Point], *_args: object, **_kw: object) -> None:
        seen.extend(points)
        raise _Seen

    monkeypatch.setattr(stability, "run_points", record)
    cfg = AuditConfig("current-fit", ModelParams(M=240, chunk=8, bbar=0.05), "s=U(1,16),o=U(1,16)", baselines=(),
                      profile=get_profile("dev"), skip=("proofs", "properties"), window=64)
    with pytest.raises(_Seen):
        run_audit(cfg)
    assert seen and all(p.window == 64 for p in seen)


def test_a_reordering_rule_runs_differently_with_a_wider_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # shortest prompt first sees more of the queue with a wider window: the run is not the same
    monkeypatch.syspath_prepend(str(TESTS / "plugins"))
    base = Point("sample_plugins:SHORTEST_PROMPT_FIRST", ModelParams(M=240, chunk=8, bbar=0.05),
                 "s=U(1,16),o=U(1,16)", rate=40.0, slots=2000, seed=3)
    narrow, wide = run_point(base), run_point(dataclasses.replace(base, window=64))
    # (overloaded: one request at a time) the shortest of 64 finishes more requests than the shortest of 8
    assert wide.completed > narrow.completed
