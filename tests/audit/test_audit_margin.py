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


def _stand_in(monkeypatch: Any, answers: dict[tuple[int | None, int], tuple[str, int | None, float]]) -> list[tuple[int | None, int, int]]:
    """Replace z3's margin search by canned answers ``(M, K) -> (verdict, Δ, seconds it takes)``
    (the clock it spends is faked by moving the budget's deadline); returns the calls made."""
    import kvstab.proofs.margins as margins
    from kvstab.proofs.margins import MarginResult as Found
    from kvstab.proofs.verdicts import Proved, Refuted, Unknown

    calls: list[tuple[int | None, int, int]] = []
    verdicts = {"Proved": Proved("stand-in"), "Refuted": Refuted(None, "stand-in"), "Unknown": Unknown("stand-in")}

    def search(scheduler: Any, setting: Any, K: int, Q: int, max_s: int, max_o: int, *, conjuncts: Any = (),
               budget: Any = None) -> Found:
        calls.append((setting.M, K, Q))
        word, delta, secs = answers[(setting.M, K)]
        clock[0] += secs
        return Found("x", setting.M, max_s, max_o, delta, verdicts[word], None, None, ())

    clock = [0.0]
    monkeypatch.setattr(margins, "work_conservation_margin", search)
    import time

    from kvstab.proofs import solver

    monkeypatch.setattr(solver.Budget, "left", lambda self: None if self.deadline is None
                        else self.deadline - self.reserved_s - time.monotonic() - clock[0])
    return calls


def test_the_margin_searches_half_the_bounds_first_and_the_full_ones_only_where_affordable(monkeypatch: Any) -> None:
    """A lookahead-style projection's search at the ci bounds does not end in the budget: the search
    at half the bounds runs first; a refutation for every M there stands (its witness is a state at
    the full bounds too); the full bounds run only where the budget left is GROWTH × what the
    smaller search took, and an Unknown there keeps the smaller search's Δ."""
    from kvstab.audit.audit import GROWTH, _margin
    from kvstab.proofs.solver import Budget

    ci = get_profile("ci")
    K, Q, small = ci.proof_K, ci.proof_Q, ci.margin_M
    sched = load_scheduler("lookahead")

    def run(answers: dict[tuple[int | None, int], tuple[str, int | None, float]]) -> tuple[Any, list[Any]]:
        calls = _stand_in(monkeypatch, answers)
        budget = Budget(total_s=160.0).started()
        return _margin(sched, "lookahead", ModelParams(M=131_000, chunk=512), ci, (), budget), calls

    # refuted for every M at half the bounds: not searched again; M = 64 at half, too slow to grow
    m, calls = run({(None, K // 2): ("Refuted", None, 1.0), (small, K // 2): ("Proved", 55, 15.0)})
    assert calls == [(None, K // 2, Q // 2), (small, K // 2, Q // 2)]
    assert (m.delta, m.K, m.Q, m.M) == (55, K // 2, Q // 2, small)
    # a quick one grows to the full bounds, whose Δ (at least the smaller one's) is reported
    m, calls = run({(None, K // 2): ("Refuted", None, 0.0), (small, K // 2): ("Proved", 55, 0.2),
                    (small, K): ("Proved", 57, 0.6)})
    assert calls[-1] == (small, K, Q) and (m.delta, m.K, m.Q) == (57, K, Q)
    # Δ for every M proved at half the bounds is only a lower bound: the full bounds decide it
    m, calls = run({(None, K // 2): ("Proved", 23, 0.3), (None, K): ("Proved", 23, 3.5)})
    assert calls == [(None, K // 2, Q // 2), (None, K, Q)] and (m.delta, m.M, m.K) == (23, None, K)
    # an Unknown at the full bounds keeps the smaller search's Δ
    m, calls = run({(None, K // 2): ("Refuted", None, 0.0), (small, K // 2): ("Proved", 55, 1.0),
                    (small, K): ("Unknown", None, 100.0)})
    assert (m.delta, m.K) == (55, K // 2) and 160.0 > GROWTH * 1.0
