"""Work-conservation margins Δ of the built-ins, and the lemmas behind the theorems."""

from __future__ import annotations

import pytest

from kvstab.proofs.encoding import Setting
from kvstab.proofs.invariants import MENU
from kvstab.proofs.lemmas import _lyapunov, prove_lemmas
from kvstab.proofs.margins import work_conservation_margin
from kvstab.proofs.solver import Budget
from kvstab.proofs.verdicts import Proved, Refuted, passed
from kvstab.registry import load_scheduler

SE = Setting(M=64, chunk=8)
MAX_S, MAX_O = 16, 8


def _margin(name: str, K: int = 4, Q: int = 2, conj: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return work_conservation_margin(
        load_scheduler(name), SE, K, Q, MAX_S, MAX_O, conjuncts=[MENU[c] for c in conj], budget=Budget()
    )


def test_current_fit_margin_is_the_declared_one_and_below_the_papers() -> None:
    r = _margin("current-fit")
    assert isinstance(r.verdict, Proved)
    assert r.delta == r.declared == MAX_S + MAX_O - 1
    assert r.delta < r.paper_delta_tokens == MAX_S + MAX_O
    # the tightness witness is a concrete state using exactly M − Δ
    assert r.witness is not None and r.witness.memory == SE.M - r.delta
    assert r.own_delta == pytest.approx(r.delta / SE.M)


def test_negative_control_margin_is_its_declared_one() -> None:
    r = _margin("current-fit-no-preempt")
    assert isinstance(r.verdict, Proved) and r.delta == r.declared == min(SE.chunk, MAX_S) - 1


def test_reserve_margin_is_within_its_declaration() -> None:
    r = _margin("reserve", conj=("reserved peaks fit",))
    assert isinstance(r.verdict, Proved) and r.delta is not None and r.declared is not None
    assert r.delta <= r.declared
    assert r.delta > r.paper_delta_tokens  # reserve is far from work-conserving in the paper's sense


def test_margin_search_is_guarded_against_vacuity() -> None:
    # with 2 active slots of at most 24 tokens M = 64 is never full: no state
    # has a queue left, and the search must say so rather than return Δ = 0
    r = _margin("current-fit", K=2)
    assert r.delta is None and not passed(r.verdict)


def test_lemmas_are_proved() -> None:
    v, obs = prove_lemmas(Setting(M=None, chunk=512), K=2, Q=1, A=1)
    assert isinstance(v, Proved), [(o.label(), str(o.verdict)) for o in obs]
    assert {o.name for o in obs} == {"area/unit", "served/slot", "lyapunov"}


def test_lyapunov_identity_needs_the_wasted_term() -> None:
    obs = _lyapunov(Setting(M=None, chunk=512), Budget(), 2, 1, 1, wasted_term=False)
    assert isinstance(obs[-1].verdict, Refuted)


def test_margin_for_every_M() -> None:
    """With M symbolic the search looks for one Δ that holds for every M: current-fit
    has one (max s + max o − 1), reserve has none (its idle memory grows with M)."""
    se = Setting(M=None, chunk=8)
    r = work_conservation_margin(load_scheduler("current-fit"), se, 3, 2, MAX_S, MAX_O, budget=Budget())
    assert isinstance(r.verdict, Proved) and r.delta == MAX_S + MAX_O - 1 and r.M is None
    assert any("every M ≥ 24" in a for a in r.verdict.assumptions)
    r = work_conservation_margin(load_scheduler("reserve"), se, 3, 2, MAX_S, MAX_O, budget=Budget())
    assert r.delta is None and isinstance(r.verdict, Refuted) and "grows with M" in r.verdict.detail
