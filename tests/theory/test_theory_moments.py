"""E[g]: the moment formula and the closed forms against enumeration and sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from kvstab.model import ModelParams
from kvstab.theory import moments as Mo
from kvstab.theory.area import expected_g, expected_reserve_area, g_blocks, lifetime_area, peak_tokens, workload_moments
from kvstab.theory.claims import Claim, is_closed
from kvstab.theory.symbols import K, a, a_o, b, b_o, corr, o, p, s, shat
from kvstab.workload import PAPER_WORKLOADS, Fixed, Geometric, Uniform, Workload


def enumerate_eg(w: Workload, params: ModelParams) -> float:
    """E[g] by brute force over the (s, o) grid of an independent workload."""
    assert w.s is not None and w.o is not None
    sv, sp_ = w.s.support()
    ov, op = w.o.support()
    S, Og = np.meshgrid(sv, ov, indexing="ij")
    return float((lifetime_area(S.ravel(), Og.ravel(), params).reshape(S.shape) * np.outer(sp_, op)).sum())


_UNIFORM = {c: sp.lambdify((a, b, a_o, b_o, shat), Mo.eg_uniform(c), modules=["math"]) for c in ("exact", "continuous")}

uniforms = st.tuples(st.integers(1, 120), st.integers(0, 120)).map(lambda t: Uniform(t[0], t[0] + t[1]))


@pytest.mark.parametrize("claim", Mo.moment_claims(), ids=lambda c: c.name)
def test_moment_claims(claim: Claim) -> None:
    assert claim.holds(), claim.difference()


def test_closed_forms_are_closed() -> None:
    for conv in ("exact", "continuous"):
        for e in (
            Mo.eg_moments(conv),
            Mo.eg_covariance(conv),
            Mo.eg_uniform(conv),
            Mo.eg_fixed(conv),
            Mo.eg_geometric_output(conv),
            Mo.eg_correlated_uniform(conv),
        ):
            assert is_closed(e), e
    assert all(is_closed(e) for e in (*Mo.geometric_moments(), *Mo.chunk_count_sums(), *Mo.uniform_moments(a, b)))


def test_expectation_refuses_unknown_monomials() -> None:
    with pytest.raises(ValueError, match="no moment symbol"):
        Mo.expectation_of(s**3)


@given(uniforms, uniforms, st.integers(1, 40), st.sampled_from(["exact", "continuous"]), st.sampled_from([1, 1, 4, 16]))
def test_expected_g_equals_enumeration(us: Uniform, uo: Uniform, chunk: int, conv: str, block: int) -> None:
    conv = "exact" if block > 1 else conv
    params = ModelParams(M=10**6, chunk=chunk, block=block, g=conv)  # type: ignore[arg-type]
    w = Workload(s=us, o=uo)
    assert expected_g(w, params) == pytest.approx(enumerate_eg(w, params), rel=1e-12)


@given(uniforms, uniforms, st.integers(1, 40), st.sampled_from(["exact", "continuous"]))
def test_uniform_closed_form(us: Uniform, uo: Uniform, chunk: int, conv: str) -> None:
    f = _UNIFORM[conv]
    params = ModelParams(M=10**6, chunk=chunk, g=conv)  # type: ignore[arg-type]
    got = f(us.a, us.b, uo.a, uo.b, chunk)
    assert got == pytest.approx(enumerate_eg(Workload(s=us, o=uo), params), rel=1e-12)


def test_paper_workload_closed_form() -> None:
    w = PAPER_WORKLOADS["paper-1:1"]
    assert _UNIFORM["exact"](10, 1600, 10, 1600, 512) == pytest.approx(expected_g(w, ModelParams()), rel=1e-12)


@pytest.mark.parametrize("prob,cap", [(0.01, 2000), (0.3, 5), (1.0, 4), (0.05, 1)])
def test_geometric_moments(prob: float, cap: int) -> None:
    m1, m2 = Mo.geometric_moments()
    v, w = Geometric(prob, cap).support()
    if prob == 1.0:  # the closed form has a removable 0/0 at p = 1: take the limit
        got1, got2 = (float(sp.limit(m.subs(K, cap), p, 1)) for m in (m1, m2))
    else:
        got1, got2 = (float(m.subs({p: prob, K: cap})) for m in (m1, m2))
    assert got1 == pytest.approx(float(v @ w), rel=1e-9)
    assert got2 == pytest.approx(float(v**2 @ w), rel=1e-9)


def test_geometric_output_workload() -> None:
    w = Workload(s=Uniform(10, 700), o=Geometric(0.02, 300))
    f = sp.lambdify((a, b, p, K, shat), Mo.eg_geometric_output("continuous"))
    params = ModelParams(chunk=64, g="continuous")
    assert f(10, 700, 0.02, 300, 64) == pytest.approx(expected_g(w, params), rel=1e-10)


def test_fixed_lengths() -> None:
    f = sp.lambdify((s, o, shat), Mo.eg_fixed("exact"), modules=["math"])
    w = Workload(s=Fixed(1000), o=Fixed(77))
    assert f(1000, 77, 512) == expected_g(w, ModelParams())


def test_covariance_term_is_explicit_in_a_correlated_joint_law() -> None:
    # a correlated joint law: E[g] differs from the independent one by exactly Cov(s, o)
    rng = np.random.default_rng(1)
    s_ = rng.integers(1, 2000, size=5000)
    o_ = np.maximum(1, s_ // 3 + rng.integers(0, 50, size=5000))
    params = ModelParams(chunk=512)
    joint = Workload.joint(s_, o_)
    m = workload_moments(joint, 512)
    indep = expected_g(joint, params) - m.cov
    f = sp.lambdify(tuple(sorted(Mo.eg_covariance("exact").free_symbols, key=str)), Mo.eg_covariance("exact"))
    assert m.cov > 0 and m.corr() > 0.9
    # the covariance form evaluated with the joint law's moments reproduces the row mean
    vals = {"C_so": m.cov, "E_n": m.En, "E_n2": m.En2, "E_o": m.Eo, "E_o2": m.Eo2, "E_s": m.Es, "shat": 512}
    syms = sorted(Mo.eg_covariance("exact").free_symbols, key=str)
    assert f(*[vals[str(x)] for x in syms]) == pytest.approx(expected_g(joint, params), rel=1e-12)
    assert expected_g(joint, params) - indep == pytest.approx(m.cov)


def test_correlated_uniform_closed_form() -> None:
    # comonotone pair s = o ~ U(1, 50): correlation 1
    v = np.arange(1, 51)
    joint = Workload.joint(v, v)
    f = sp.lambdify((a, b, a_o, b_o, shat, corr), Mo.eg_correlated_uniform("continuous"))
    assert f(1, 50, 1, 50, 10, 1.0) == pytest.approx(
        expected_g(joint, ModelParams(chunk=10, g="continuous")), rel=1e-12
    )


def test_moment_formula_agrees_with_sample_mean() -> None:
    # E[g] against the sample mean of g over 200,000 draws: inside a 5-sigma band
    # (two-sided; a false failure has probability < 1e-6)
    w = PAPER_WORKLOADS["paper-2:1"]
    params = ModelParams(block=16)
    rng = np.random.default_rng(20260)
    s_, o_ = w.sample(rng, 200_000)
    g = g_blocks(s_, o_, params.chunk, params.block)
    half = 5 * g.std(ddof=1) / math.sqrt(g.size)
    assert abs(g.mean() - expected_g(w, params)) < half


@given(uniforms, uniforms, st.integers(1, 40), st.sampled_from([1, 8]))
def test_reserve_area_equals_enumeration(us: Uniform, uo: Uniform, chunk: int, block: int) -> None:
    sv, sp_ = us.support()
    ov, op = uo.support()
    S, Og = np.meshgrid(sv, ov, indexing="ij")
    brute = float((peak_tokens(S + Og, block) * (-(-S // chunk) + Og) * np.outer(sp_, op)).sum())
    params = ModelParams(M=10**6, chunk=chunk, block=block)
    assert expected_reserve_area(Workload(s=us, o=uo), params) == pytest.approx(brute, rel=1e-12)
    # uniform marginals put equal weight on every grid cell, so the grid's rows
    # as a joint law must give the same number through the row-wise path
    joint = Workload.joint(S.ravel(), Og.ravel())
    assert expected_reserve_area(joint, params) == pytest.approx(brute, rel=1e-12)
