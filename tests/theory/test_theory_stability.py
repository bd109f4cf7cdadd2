"""μ, δ, the theorems' algebra, sensitivities, provisioning and the WAIT identity."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.theory import provisioning as P
from kvstab.theory import stability as St
from kvstab.theory import wait as Wt
from kvstab.theory.area import expected_g, mu
from kvstab.theory.claims import Claim, is_closed
from kvstab.theory.report import stability_report
from kvstab.workload import PAPER_WORKLOADS, Fixed, Uniform, Workload


@pytest.mark.parametrize("claim", St.stability_claims() + P.provisioning_claims(), ids=lambda c: c.name)
def test_stability_and_provisioning_claims(claim: Claim) -> None:
    assert claim.holds(), claim.difference()


@pytest.mark.parametrize("claim", Wt.wait_claims(2), ids=lambda c: c.name)
def test_wait_identity(claim: Claim) -> None:
    assert claim.holds(), claim.difference()


def test_wait_identity_single_type() -> None:
    assert all(c.holds() for c in Wt.wait_claims(1))


def test_derived_expressions_are_closed() -> None:
    exprs = [
        St.mu_expr(),
        St.guarantee_expr(),
        St.reserve_limit_expr(),
        St.drift_upper(),
        St.drift_lower(),
        *St.critical_rates().values(),
        *St.sensitivities().values(),
        P.replicas_expr(),
        P.guarantee_replicas_expr(),
        P.tp_capacity_expr(),
        P.mixture_mu_expr(3)[0],
    ]
    assert all(is_closed(e) for e in exprs)


lens = st.integers(1, 3000)


@given(lens, lens, st.integers(1, 500), st.integers(1, 1024), st.sampled_from([1, 16]))
def test_mu_monotone(s_: int, o_: int, ds: int, chunk: int, block: int) -> None:
    base = ModelParams(M=200_000, chunk=chunk, block=block, bbar=0.03)
    w = Workload(s=Fixed(s_), o=Fixed(o_))
    m0 = mu(w, base)
    # μ falls with s and with o (with B > 1 a longer request may round to the
    # same blocks, so only "does not rise" holds there)
    longer_s = mu(Workload(s=Fixed(s_ + ds), o=Fixed(o_)), base)
    longer_o = mu(Workload(s=Fixed(s_), o=Fixed(o_ + ds)), base)
    if block == 1:
        assert longer_s < m0 and longer_o < m0
    else:
        assert longer_s <= m0 and longer_o <= m0
        assert mu(Workload(s=Fixed(s_ + ds * block), o=Fixed(o_)), base) < m0
    # ... rises with M ...
    assert mu(w, ModelParams(M=200_000 + ds, chunk=chunk, block=block, bbar=0.03)) > m0
    # ... and with ŝ.  For the exact g only along multiples: the holdings under
    # k·ŝ are a subsequence of those under ŝ (s = 4: ŝ = 2 holds 2, 4 but
    # ŝ = 3 holds 3, 4, more area); the paper's continuous g rises with any ŝ.
    k = 1 + ds % 4
    multiple = mu(w, ModelParams(M=200_000, chunk=chunk * k, block=block, bbar=0.03))
    assert multiple >= m0
    if s_ > chunk and k > 1 and block == 1:
        assert multiple > m0
    cont = ModelParams(M=200_000, chunk=chunk, g="continuous", bbar=0.03)
    assert mu(w, ModelParams(M=200_000, chunk=chunk + ds, g="continuous", bbar=0.03)) > mu(w, cont)


def test_exact_mu_is_not_monotone_in_any_chunk_increase() -> None:
    # the counterexample behind the "multiples only" statement above
    w = Workload(s=Fixed(4), o=Fixed(1))
    assert mu(w, ModelParams(M=100, chunk=3, bbar=1.0)) < mu(w, ModelParams(M=100, chunk=2, bbar=1.0))


def test_mu_falls_with_correlation() -> None:
    # same marginals, comonotone versus antitone pairing
    v = list(range(1, 401))
    params = ModelParams(chunk=128, bbar=0.03)
    up = Workload.joint(v, v)
    down = Workload.joint(v, v[::-1])
    assert mu(up, params) < mu(down, params)


def test_report_paper_setting() -> None:
    rep = stability_report(PAPER_WORKLOADS["paper-1:1"], ModelParams(bbar=0.0372), lam=50.0, rho=0.8)
    assert rep.mu_per_s == pytest.approx(131_000 / (0.0372 * expected_g(PAPER_WORKLOADS["paper-1:1"], ModelParams())))
    assert rep.delta == pytest.approx(3200 / 131_000)
    assert rep.guarantee_per_s == pytest.approx(rep.mu_per_s * (1 - rep.delta))
    assert rep.reserve_limit_per_s < rep.guarantee_per_s  # "far below μ"
    assert rep.replicas == math.ceil(50 / (0.8 * rep.mu_per_s))
    assert rep.guarantee_replicas == math.ceil(50 / rep.guarantee_per_s)
    assert not rep.guarantee_empty


def test_empty_guarantee_is_not_a_negative_rate() -> None:
    rep = stability_report(Workload(s=Uniform(10, 1600), o=Uniform(10, 1600)), ModelParams(M=3000, bbar=0.03), lam=1.0)
    assert rep.delta > 1 and rep.guarantee_empty
    assert rep.guarantee_per_s is None and rep.guarantee_replicas is None
    d = rep.as_dict()
    assert d["guarantee_empty"] is True and "empty" in d["guarantee_note"]
    # δ = 1 exactly is empty too
    assert stability_report(Workload(s=Fixed(10), o=Fixed(10)), ModelParams(M=20, bbar=1.0)).guarantee_per_s is None


def test_block_rounding_enters_delta() -> None:
    rep = stability_report(Workload(s=Fixed(10), o=Fixed(7)), ModelParams(M=1000, block=16, bbar=1.0))
    assert rep.ess_sup_total == 32


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"bbar": 0.0}, "b̄"),
        ({"bbar": -1.0}, "b̄"),
        ({"bbar": math.inf}, "b̄"),
        ({"rho": 0.0}, "ρ"),
        ({"rho": 1.5}, "ρ"),
        ({"lam": 0.0}, "λ"),
        ({"lam": math.nan}, "λ"),
    ],
)
def test_bad_input(kwargs: dict[str, float], match: str) -> None:
    args = {"bbar": 0.03, "rho": 1.0, "lam": 1.0} | kwargs
    with pytest.raises(InvalidArgument, match=match):
        stability_report(PAPER_WORKLOADS["paper-1:1"], ModelParams(bbar=args["bbar"]), lam=args["lam"], rho=args["rho"])


def test_provisioning_numbers() -> None:
    assert P.replicas(10.0, 3.0, 1.0) == 4
    assert P.replicas(9.0, 3.0, 1.0) == 3  # exact multiples do not round up
    assert P.replicas(9.0, 3.0, 0.5) == 6
    assert P.guarantee_replicas(9.0, 3.0, 0.25) == 4
    assert P.guarantee_replicas(9.0, 3.0, 1.0) is None
    with pytest.raises(InvalidArgument, match="ρ"):
        P.replicas(1.0, 1.0, 0.0)
    assert P.tp_capacity(80e9, 16e9, 131072, 2) == int((160e9 - 16e9) / 131072)
    with pytest.raises(InvalidArgument, match="no room"):
        P.tp_capacity(8e9, 16e9, 131072, 1)


def test_mixture_is_harmonic_mean_of_phases() -> None:
    params = ModelParams()
    e1 = expected_g(PAPER_WORKLOADS["paper-2:1"], params)
    e2 = expected_g(PAPER_WORKLOADS["paper-1:2"], params)
    mix = P.mixture_mu([0.5, 0.5], [e1, e2], params)
    m1, m2 = params.M / (0.0372 * e1), params.M / (0.0372 * e2)
    assert mix == pytest.approx(1 / (0.5 / m1 + 0.5 / m2))
    with pytest.raises(InvalidArgument, match="sum to 1"):
        P.mixture_mu([0.5, 0.6], [e1, e2], params)
