"""Fleet theory: the claims, the numeric twins against the sympy forms, the known two-replica case."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.errors import InvalidArgument
from kvstab.theory import fleet as F
from kvstab.theory.claims import Claim, is_closed

rates = st.lists(st.floats(0.01, 100.0, allow_nan=False), min_size=3, max_size=3)
splits = st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0)), min_size=3, max_size=3).filter(lambda p: sum(p) > 1e-3)


@pytest.mark.parametrize("claim", F.fleet_claims(), ids=lambda c: c.name)
def test_fleet_claims_hold(claim: Claim) -> None:
    assert claim.holds(), claim.difference()
    assert is_closed(claim.lhs) and is_closed(claim.rhs)


def test_known_case_two_replicas_one_twice_as_fast() -> None:
    mu2 = 1.7
    mus = [2 * mu2, mu2]
    assert F.critical_rate(mus) == pytest.approx(2 * mu2)  # round-robin
    assert F.critical_rate(mus, F.optimal_split(mus)) == pytest.approx(3 * mu2)
    assert F.round_robin_loss(mus) == pytest.approx(1 / 3)


_MU, _DELTA, _P = F.fleet_symbols(3)
_ARGS = (*_MU, *_DELTA, *_P)
_FORMS = {
    name: sp.lambdify(_ARGS, expr, modules="math")
    for name, expr in {
        "split": F.split_rate_expr(3),
        "guarantee": F.split_guarantee_expr(3),
        "rr": F.round_robin_rate_expr(3),
        "loss": F.round_robin_loss_expr(3),
        **{f"p{i}": e for i, e in enumerate(F.optimal_split_expr(3))},
    }.items()
}


@settings(max_examples=40, deadline=None)
@given(rates, splits)
def test_numeric_twins_equal_the_sympy_forms(mus: list[float], raw: list[float]) -> None:
    p = np.array(raw) / sum(raw)
    deltas = [0.1, 0.3, 0.05]
    args = (*mus, *deltas, *p)
    if (p > 0).all():
        assert F.critical_rate(mus, p) == pytest.approx(_FORMS["split"](*args), rel=1e-9)
        assert F.guaranteed_rate(mus, deltas, p) == pytest.approx(_FORMS["guarantee"](*args), rel=1e-9)
    assert F.critical_rate(mus) == pytest.approx(_FORMS["rr"](*args), rel=1e-9)
    assert F.round_robin_loss(mus) == pytest.approx(_FORMS["loss"](*args), abs=1e-12)
    opt = [_FORMS[f"p{i}"](*args) for i in range(3)]
    np.testing.assert_allclose(F.optimal_split(mus), opt, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(rates, splits)
def test_no_split_beats_the_proportional_one(mus: list[float], raw: list[float]) -> None:
    p = np.array(raw) / sum(raw)
    best = F.critical_rate(mus, F.optimal_split(mus))
    assert best == pytest.approx(sum(mus), rel=1e-12)
    assert F.critical_rate(mus, p) <= best * (1 + 1e-12)
    assert F.critical_rate(mus) <= best * (1 + 1e-12)  # round-robin is one split


def test_guarantee_split_and_empty_guarantee() -> None:
    mus, deltas = [3.0, 1.0], [0.5, 0.0]
    p = F.optimal_split(mus, deltas)
    np.testing.assert_allclose(p, [0.6, 0.4])
    assert F.guaranteed_rate(mus, deltas, p) == pytest.approx(2.5)
    assert F.guaranteed_rate(mus, 1.0) is None
    with pytest.raises(InvalidArgument, match="no split"):
        F.optimal_split(mus, [1.0, 1.2])


def test_replicas_to_add() -> None:
    assert F.replicas_to_add(10.0, [2.0, 3.0], 2.0) == 3  # (10 − 5)/2 → 3
    assert F.replicas_to_add(4.0, [2.0, 3.0], 2.0) == 0
    assert F.replicas_to_add(4.0, [2.0, 3.0], 2.0, rho_=0.5) == 2  # 8 − 5 = 3 → 2 of rate 2


@pytest.mark.parametrize(
    "call",
    [
        lambda: F.critical_rate([]),
        lambda: F.critical_rate([1.0, -1.0]),
        lambda: F.critical_rate([1.0, float("nan")]),
        lambda: F.critical_rate([1.0, 2.0], [0.5, 0.6]),
        lambda: F.critical_rate([1.0, 2.0], [1.0]),
        lambda: F.guaranteed_rate([1.0], [-0.1]),
        lambda: F.replicas_to_add(float("inf"), [1.0], 1.0),
    ],
)
def test_bad_fleets_are_refused(call: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgument):
        call()


def test_report_and_document_section() -> None:
    rep = F.fleet_report([2.0, 1.0], 0.2, lam=2.5)
    assert rep.ideal_rate == pytest.approx(3.0) and rep.round_robin_rate == pytest.approx(2.0)
    assert rep.optimal_guarantee == pytest.approx(2.4) and rep.round_robin_guarantee == pytest.approx(1.6)
    text = "\n".join(rep.lines())
    assert "AT OR ABOVE" in text  # 2.5 is above round-robin's 2
    from kvstab.theory.document import _section_fleet

    section = _section_fleet()
    assert "Fleets" in section and "NOT proved" not in section
    assert sp.latex(sp.Symbol("mu_1")) in section


def test_derive_typesets_a_fleet(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import kvstab.theory.document as document
    from kvstab.cli import main

    monkeypatch.setattr(document, "SECTIONS", ())  # the fixed sections are built in test_theory_cli
    assert main(["derive", "--numbers", "--replicas-mu", "2", "1"]) == 0
    text = capsys.readouterr().out
    fleet = text[text.index("The numbers for this fleet") :]
    assert "(any router, critical) & 3" in fleet and "(round-robin, critical) & 2" in fleet
    assert "The numbers for this workload" in text and text.isascii()


def test_heterogeneous_deltas() -> None:
    # a replica whose δ_i ≥ 1 takes nothing under the guarantee split, and voids round-robin's guarantee
    rep = F.fleet_report([3.0, 1.0, 2.0], [0.5, 1.5, 0.0], lam=None)
    assert rep.guarantee_split == pytest.approx((1.5 / 3.5, 0.0, 2.0 / 3.5))
    assert rep.optimal_guarantee == pytest.approx(3.5) and rep.round_robin_guarantee is None
    assert F.fleet_report([1.0], 2.0).optimal_guarantee is None


def test_mu_fleet_of_capacities(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvstab.cli import main

    assert main(["mu", "--replicas-M", "131000", "65500", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    mu, S = d["mu_per_s"], d["ess_sup_total"]
    assert d["fleet"]["mus"] == pytest.approx([mu, mu / 2])
    assert d["fleet"]["deltas"] == pytest.approx([S / 131000, S / 65500])
    assert d["fleet"]["round_robin_rate"] == pytest.approx(mu)  # 2·min μ_i = 2·μ/2
    assert d["fleet"]["ideal_rate"] == pytest.approx(1.5 * mu)
