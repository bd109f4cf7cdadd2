"""The audit's margin Δ: at the audited M (one Δ for every M where the proof gives one), else at the
largest M the bounded search reaches, named; and its lines say each word once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstab.audit.audit import MarginResult, _check_proofs, proofs_section
from kvstab.audit.profiles import get_profile
from kvstab.audit.report import markdown
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler

PARAMS = ModelParams(M=240, chunk=8, bbar=0.05)


def _margin_check(name: str, tmp_path: Path) -> tuple[str, MarginResult | None]:
    lines: list[str] = []
    sec = proofs_section(load_scheduler(name), name, PARAMS, get_profile("dev"), tmp_path, lines.append)
    (check,) = [c for c in _check_proofs(sec) if c.name == "margin Δ"]
    return check.detail, sec.margin


def test_a_policy_with_one_margin_for_every_M_gets_it_at_the_audited_M(tmp_path: Path) -> None:
    detail, m = _margin_check("current-fit", tmp_path)
    assert m is not None and m.M is None and m.audited_M == 240
    peak = get_profile("dev").margin_max_s + get_profile("dev").margin_max_o
    assert detail.startswith(f"Δ = 11 tokens for every M ≥ {peak}, so at the audited M = 240"), detail
    # the declared margin is compared at the audited M
    assert "declared 11" in detail and m.to_json()["where"] in detail


def test_a_policy_whose_idle_memory_grows_with_M_names_the_M_it_is_given_at(tmp_path: Path) -> None:
    detail, m = _margin_check("reserve", tmp_path)
    small = get_profile("dev").margin_M
    assert m is not None and m.M == small
    assert f"at M = {small}, the largest M the bounded search reaches (not the audited M = 240: " \
           "no constant Δ holds for every M)" in detail, detail


def test_no_word_twice_in_the_margin_and_certificate_lines(small_audit: tuple[int, Path, dict[str, Any]]) -> None:
    _, out, data = small_audit
    md = markdown(data)
    assert "Δ Δ" not in md and "— —" not in md
    assert "Δ Δ" not in (out / "report.html").read_text()
    assert "for every M ≥" in md


def test_the_proofs_progress_line_says_margin_once(tmp_path: Path) -> None:
    from kvstab.audit.audit import AuditConfig, run_audit

    lines: list[str] = []
    cfg = AuditConfig("current-fit", PARAMS, "s=U(1,16),o=U(1,16)", baselines=(), profile=get_profile("dev"),
                      skip=("properties", "stability"))
    run_audit(cfg, smt2_dir=tmp_path, log=lines.append)
    (line,) = [ln for ln in lines if ln.startswith("proofs: memory invariant Proved")]
    assert "margin Δ Δ" not in line and "margin: Δ = 11 tokens" in line, line
