"""Sums over length laws without their supports, against enumeration and exact integers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.model import ModelParams, tokens_held
from kvstab.theory.area import expected_g, expected_reserve_area, lifetime_area, peak_tokens, workload_moments
from kvstab.theory.laws import (
    Points,
    Run,
    chunk_index_residues,
    circular_convolve,
    law_of,
    length_moments,
    residues,
)
from kvstab.workload import Fixed, Geometric, LengthDist, Uniform, Workload


def points(run: Run) -> Points:
    x = np.arange(run.length)
    w = run.q ** x.astype(np.float64)
    return Points(run.a + x, w / w.sum())


runs = st.builds(
    Run,
    a=st.integers(1, 5000),
    length=st.one_of(st.integers(1, 300), st.integers(65_000, 140_000)),  # both sides of the √L split
    q=st.sampled_from([1.0, 0.99999, 0.999, 0.5, 0.0]),
)


@settings(max_examples=25, deadline=None)
@given(runs, st.integers(1, 700))
def test_run_moments_equal_enumeration(run: Run, chunk: int) -> None:
    got, want = length_moments(run, chunk), length_moments(points(run), chunk)
    for g, w in zip((got.Ex, got.Ex2, got.En, got.En2, got.Exn), (want.Ex, want.Ex2, want.En, want.En2, want.Exn)):
        assert g == pytest.approx(w, rel=1e-11)


@settings(max_examples=25, deadline=None)
@given(runs, st.integers(1, 64), st.integers(1, 600))
def test_run_residues_equal_enumeration(run: Run, K: int, chunk: int) -> None:
    p, m1 = residues(run, K)
    pp, mm = residues(points(run), K)
    np.testing.assert_allclose(p, pp, rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(m1, mm, rtol=1e-10, atol=1e-12 * float(mm.max()))
    np.testing.assert_allclose(
        chunk_index_residues(run, chunk, K), chunk_index_residues(points(run), chunk, K), rtol=1e-10, atol=1e-15
    )


def test_circular_convolution_is_the_law_of_a_sum_mod_K() -> None:
    rng = np.random.default_rng(0)
    for K in (1, 7, 16, 3000):
        x, y = rng.random(K), rng.random(K)
        want = np.zeros(K)
        for u in range(K) if K <= 16 else ():
            for v in range(K):
                want[(u + v) % K] += x[u] * y[v]
        z = circular_convolve(x, y)
        if K <= 16:
            np.testing.assert_allclose(z, want, rtol=1e-12)
        assert z.sum() == pytest.approx(x.sum() * y.sum(), rel=1e-12)


def test_uniform_of_a_billion_points_is_exact() -> None:
    # E[s], E[n], E[n²], E[s·n] of U(1, b) in exact integers: Σ_{x ≤ N} ⌈x/ŝ⌉ over q full chunks and r extra
    b, chunk = 10**9 + 7, 512
    q, r = divmod(b, chunk)
    sum_n = chunk * q * (q + 1) // 2 + r * (q + 1)
    sum_n2 = chunk * q * (q + 1) * (2 * q + 1) // 6 + r * (q + 1) ** 2
    # Σ_c c·Σ_{x in chunk c} x with Σ_{x in chunk c} x = ŝ²(c − 1) + ŝ(ŝ + 1)/2
    full = chunk * chunk * (q - 1) * q * (q + 1) // 3 + chunk * (chunk + 1) // 2 * q * (q + 1) // 2
    sum_sn = full + (q + 1) * (r * q * chunk + r * (r + 1) // 2)
    m = length_moments(law_of(Uniform(1, b)), chunk)
    assert m.Ex == pytest.approx((b + 1) / 2, rel=1e-14)
    assert m.Ex2 == pytest.approx((b + 1) * (2 * b + 1) / 6, rel=1e-13)
    assert m.En == pytest.approx(sum_n / b, rel=1e-13)
    assert m.En2 == pytest.approx(sum_n2 / b, rel=1e-13)
    assert m.Exn == pytest.approx(sum_sn / b, rel=1e-13)


def test_geometric_with_a_huge_cap_matches_the_untruncated_law() -> None:
    # P(o > 10⁹) = 0.999^(10⁹) underflows: the truncated law is the geometric law itself
    m = length_moments(law_of(Geometric(0.001, 10**9)), 1)
    assert m.Ex == pytest.approx(1000, rel=1e-12)
    assert m.Ex2 == pytest.approx((2 - 0.001) / 0.001**2, rel=1e-12)
    assert m.En == pytest.approx(m.Ex) and m.En2 == pytest.approx(m.Ex2)


def brute(w: Workload, params: ModelParams) -> tuple[float, float]:
    assert w.s is not None and w.o is not None
    sv, ps = w.s.support()
    ov, po = w.o.support()
    S, O = np.meshgrid(sv, ov, indexing="ij")
    P = np.outer(ps, po)
    g = lifetime_area(S.ravel(), O.ravel(), params).reshape(S.shape)
    reserve = peak_tokens(S + O, params.block) * (-(-S // params.chunk) + O)
    return float((g * P).sum()), float((reserve * P).sum())


@pytest.mark.parametrize(
    "s,o",
    [
        (Uniform(70_000, 71_500), Uniform(1, 300)),
        (Geometric(0.0001, 70_000), Uniform(3, 12)),
        (Uniform(5, 70_000), Geometric(0.3, 20)),
        (Fixed(100_000), Geometric(0.00002, 100_000)),
    ],
    ids=lambda d: d.describe(),
)
@pytest.mark.parametrize("chunk,block", [(512, 16), (37, 16), (1000, 24), (7, 1), (3, 5)])
def test_long_supports_equal_enumeration(s: LengthDist, o: LengthDist, chunk: int, block: int) -> None:
    w = Workload(s=s, o=o)
    params = ModelParams(M=10**7, chunk=chunk, block=block)
    eg, er = brute(w, params)
    assert expected_g(w, params) == pytest.approx(eg, rel=1e-11)
    assert expected_reserve_area(w, params) == pytest.approx(er, rel=1e-11)


def test_moments_of_a_joint_law_are_row_means() -> None:
    w = Workload.joint([3, 700, 1025], [5, 1, 9])
    m = workload_moments(w, 512)
    assert m.Es == pytest.approx(576) and m.En == pytest.approx((1 + 2 + 3) / 3) and m.Eso == pytest.approx(9940 / 3)


def test_peak_is_tokens_held() -> None:
    totals = np.arange(1, 200)
    assert list(peak_tokens(totals, 16)) == [tokens_held(int(t), 16) for t in totals]


laws = st.one_of(
    st.builds(lambda a, w: Uniform(a, a + w), st.integers(1, 90), st.integers(0, 90)),
    st.builds(Geometric, st.sampled_from([1.0, 0.5, 0.05, 0.001]), st.integers(1, 150)),
    st.builds(Fixed, st.integers(1, 200)),
)


@settings(max_examples=60, deadline=None)
@given(laws, laws, st.integers(1, 70), st.integers(1, 300))
def test_block_sums_equal_enumeration_for_every_law(s: LengthDist, o: LengthDist, chunk: int, block: int) -> None:
    # blocks that divide ŝ, that do not, larger than ŝ and larger than every request
    w = Workload(s=s, o=o)
    params = ModelParams(M=10**6, chunk=chunk, block=block)
    eg, er = brute(w, params)
    assert expected_g(w, params) == pytest.approx(eg, rel=1e-11)
    assert expected_reserve_area(w, params) == pytest.approx(er, rel=1e-11)


def test_per_request_g_with_a_block_period_beyond_the_limit() -> None:
    # B/gcd(B, ŝ) > MAX_PERIOD: the rows' own chunk counts bound the table instead
    from kvstab.theory.area import g_blocks

    s, o, chunk, B = np.array([1, 700, 5000, 3]), np.array([3, 1, 9, 2]), 512, (1 << 21) + 1

    def g(si: int, oi: int) -> int:
        n = -(-si // chunk)
        prefill = sum(tokens_held(min(c * chunk, si), B) for c in range(1, n + 1))
        return int(prefill + sum(tokens_held(si + j, B) for j in range(1, oi + 1)))

    assert list(g_blocks(s, o, chunk, B)) == [g(int(a), int(b)) for a, b in zip(s, o)]
