"""Closed forms of g against the defining sum, run through the model's own
memory accounting (kvstab.model.tokens_held / progress_after)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st

from kvstab.model import progress_after, tokens_held
from kvstab.theory import g as G
from kvstab.theory.area import g_blocks, g_continuous, g_exact
from kvstab.theory.claims import Claim, is_closed
from kvstab.theory.symbols import B, L, n, o, q, r, s, shat

lengths = st.integers(min_value=1, max_value=300)
chunks = st.integers(min_value=1, max_value=64)
blocks = st.integers(min_value=1, max_value=24)


# the sympy forms, compiled once so that Hypothesis can call them cheaply
EXACT = sp.lambdify((s, o, shat, n), G.g_exact_expr())
GAP = sp.lambdify((s, r, shat), G.continuous_gap())
GAP_BOUND = sp.lambdify((s, shat), G.continuous_gap_bound())
PREFIX = sp.lambdify((q, L, B), G.block_prefix())
WAIT = sp.lambdify((s, o), G.g_wait_expr())
LO, HI = (sp.lambdify((s, o, shat, n, B, L), e) for e in G.g_blocks_bounds())


def area_by_slots(s_: int, o_: int, chunk: int, block: int = 1) -> int:
    """The defining sum, slot by slot, through the model's accounting."""
    progress, total = 0, 0
    while progress < s_ + o_:
        progress = progress_after(s_, progress, chunk)
        total += int(tokens_held(progress, block))
    return total


@pytest.mark.parametrize("claim", G.g_claims(), ids=lambda c: c.name)
def test_every_g_claim_is_proved(claim: Claim) -> None:
    assert claim.holds(), f"{claim.name}: lhs - rhs = {claim.difference()}"


def test_a_false_claim_is_not_proved() -> None:
    # guards against a checker that passes everything
    assert not Claim("wrong", G.g_exact_expr(), G.g_continuous_expr()).holds()
    assert not Claim("wrong sign", -s, sp.Integer(0), ">=").holds()


def test_built_in_forms_are_closed() -> None:
    exprs = [
        G.decode_area(),
        G.prefill_area_exact(),
        G.g_exact_expr(),
        G.g_continuous_expr(),
        G.g_wait_expr(),
        G.continuous_gap(),
        G.block_prefix(),
        G.block_waste_period(),
        *G.block_tail_sums(),
        *G.g_blocks_bounds(),
    ]
    assert all(is_closed(e) for e in exprs)
    assert not is_closed(G.defining_sum())  # the reference stays a sum


@given(lengths, lengths, chunks)
def test_exact_form_equals_sum(s_: int, o_: int, chunk: int) -> None:
    n_ = -(-s_ // chunk)
    sym = EXACT(s_, o_, chunk, n_)
    assert sym == area_by_slots(s_, o_, chunk)
    assert g_exact([s_], [o_], chunk)[0] == sym


@given(st.integers(1, 20), lengths, chunks)
def test_continuous_form_equals_sum_when_chunk_divides(k: int, o_: int, chunk: int) -> None:
    s_ = k * chunk
    assert g_continuous([s_], [o_], chunk)[0] == area_by_slots(s_, o_, chunk)


@given(lengths, lengths, chunks)
def test_gap_formula_and_bound(s_: int, o_: int, chunk: int) -> None:
    n_ = -(-s_ // chunk)
    r_ = s_ - (n_ - 1) * chunk
    gap = area_by_slots(s_, o_, chunk) - g_continuous([s_], [o_], chunk)[0]
    assert gap == pytest.approx(GAP(s_, r_, chunk), abs=1e-9)
    assert 0 <= gap <= GAP_BOUND(s_, chunk) + 1e-9
    assert (gap == 0) == (s_ % chunk == 0)


@given(lengths, lengths, chunks, blocks)
def test_block_form_equals_sum(s_: int, o_: int, chunk: int, block: int) -> None:
    assert g_blocks([s_], [o_], chunk, block)[0] == area_by_slots(s_, o_, chunk, block)


@given(st.integers(0, 2000), blocks)
def test_block_prefix_equals_sum(N_: int, block: int) -> None:
    brute = sum(int(tokens_held(x, block)) for x in range(1, N_ + 1))
    assert PREFIX(N_ // block, N_ % block, block) == brute


@given(lengths, lengths, st.integers(1, 8), st.sampled_from([1, 2, 4, 8, 16]))
def test_block_bounds_hold(s_: int, o_: int, k: int, block: int) -> None:
    chunk = k * block  # the bounds are stated for B | ŝ
    vals = (s_, o_, chunk, -(-s_ // chunk), block, (o_ + 1) % block)
    exact = area_by_slots(s_, o_, chunk, block)
    assert LO(*vals) <= exact <= HI(*vals)


@pytest.mark.parametrize("block", [2, 5, 16])
@pytest.mark.parametrize("o_", [1, 7, 16, 33])
def test_block_bounds_are_attained(block: int, o_: int) -> None:
    # tight: over one period of prompt residues both bounds are reached
    chunk = 4 * block
    reached_lo = reached_hi = False
    for s_ in range(5 * chunk, 5 * chunk + block):
        vals = (s_, o_, chunk, -(-s_ // chunk), block, (o_ + 1) % block)
        exact = area_by_slots(s_, o_, chunk, block)
        reached_lo |= exact == LO(*vals)
        reached_hi |= exact == HI(*vals)
    assert reached_lo and reached_hi


@given(lengths, lengths)
def test_wait_form_is_g_without_chunking(s_: int, o_: int) -> None:
    assert WAIT(s_, o_) == area_by_slots(s_, o_, s_)


def test_vectorised_forms_match_scalar_sum() -> None:
    rng = np.random.default_rng(7)
    s_ = rng.integers(1, 3000, size=400)
    o_ = rng.integers(1, 800, size=400)
    got = g_blocks(s_, o_, 512, 16)
    want = [area_by_slots(int(a), int(b), 512, 16) for a, b in zip(s_[:40], o_[:40])]
    assert got[:40].tolist() == want
    assert np.all(got >= g_exact(s_, o_, 512))


def test_numeric_forms_validate_lengths() -> None:
    from kvstab.errors import InvalidArgument

    assert g_exact(np.array([3.0]), np.array([2.0]), 2)[0] == g_exact([3], [2], 2)[0]
    assert float(g_blocks(5, 3, 2, 4)) == area_by_slots(5, 3, 2, 4)  # scalars work too
    with pytest.raises(InvalidArgument, match="o must hold integer lengths >= 1"):
        g_exact([3], [0], 2)
    with pytest.raises(InvalidArgument, match="s must hold integer lengths"):
        g_blocks([2.5], [1], 2, 4)


@given(lengths, lengths, chunks, blocks)
def test_block_bounds_without_divisibility(s_: int, o_: int, chunk: int, block: int) -> None:
    # without B | ŝ the full chunks may waste up to B − gcd(ŝ, B) each (docstring of g_blocks_bounds)
    from math import gcd

    n_ = -(-s_ // chunk)
    vals = (s_, o_, chunk, n_, block, (o_ + 1) % block)
    exact = area_by_slots(s_, o_, chunk, block)
    assert LO(*vals) <= exact <= HI(*vals) + (n_ - 1) * (block - gcd(chunk, block))
