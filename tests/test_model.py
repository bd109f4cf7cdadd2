"""Value types and the one memory-accounting function."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, Request, is_prefilling, prefill_slots, progress_after, tokens_held, unit_tokens


@pytest.mark.parametrize("s,o", [(0, 1), (1, 0), (-3, 5), (1.5, 2), ("x", 4), (True, 2), (2**41, 1)])
def test_request_rejects_invalid_lengths(s: object, o: object) -> None:
    with pytest.raises(InvalidArgument, match="integer|at most"):
        Request(s, o)  # type: ignore[arg-type]


def test_request_accepts_integral_values() -> None:
    r = Request(3, 4.0)  # type: ignore[arg-type]
    assert (r.s, r.o, r.total) == (3, 4, 7)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"M": 0}, "M"),
        ({"M": -5}, "M"),
        ({"chunk": 0}, "chunk"),
        ({"block": 0}, "block"),
        ({"block": 200, "M": 100}, "exceeds M"),
        ({"g": "fuzzy"}, "convention"),
        ({"token_budget": 0}, "budget"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
    ],
)
def test_params_validate(kw: dict[str, object], msg: str) -> None:
    with pytest.raises(InvalidArgument, match=msg):
        ModelParams(**kw)  # type: ignore[arg-type]


def test_params_fit_uses_block_rounding() -> None:
    p = ModelParams(M=32, chunk=8, block=16)
    assert p.fits(Request(16, 16))
    assert not p.fits(Request(16, 17))  # 33 tokens → 3 blocks = 48 > 32


@given(progress=st.integers(0, 10_000), block=st.integers(1, 64))
def test_tokens_held_is_block_ceiling(progress: int, block: int) -> None:
    held = tokens_held(progress, block)
    assert held % block == 0
    assert progress <= held < progress + block or (progress == 0 and held == 0)


@given(s=st.integers(1, 3000), o=st.integers(1, 300), chunk=st.integers(1, 1024))
def test_unit_advance_walks_the_lifecycle(s: int, o: int, chunk: int) -> None:
    """Unit steps visit min(c·ŝ, s) for c = 1..n(s), then s + j for j = 1..o."""
    p = 0
    seen = []
    while p < s + o:
        p = progress_after(s, p, chunk)
        seen.append(p)
    n = -(-s // chunk)
    assert seen == [min(c * chunk, s) for c in range(1, n + 1)] + [s + j for j in range(1, o + 1)]


@given(s=st.integers(1, 500), p=st.integers(0, 600), chunk=st.integers(1, 64), grant=st.integers(-3, 100))
def test_grants_are_clamped_to_one_unit(s: int, p: int, chunk: int, grant: int) -> None:
    unit = unit_tokens(s, p, chunk)
    nxt = progress_after(s, p, chunk, grant)
    assert p <= nxt <= p + unit
    assert nxt - p == max(0, min(grant, unit))


@given(s=st.integers(1, 5000), chunk=st.integers(1, 1024))
def test_prefill_slots_counts_the_slots_prefill_takes(s: int, chunk: int) -> None:
    """``n(s)`` is the number of unit steps spent in prefill, for ints and numpy arrays alike."""
    p, slots = 0, 0
    while is_prefilling(s, p):
        p = progress_after(s, p, chunk)
        slots += 1
    assert prefill_slots(s, chunk) == slots
    arr = np.array([s, s + 1], dtype=np.int64)
    assert prefill_slots(arr, chunk).tolist() == [slots, prefill_slots(s + 1, chunk)]


def test_prefill_slots_is_symbolic_under_z3() -> None:
    import z3

    from kvstab.symbolic import Z3Ops, unwrap, wrap

    x = z3.Int("s")
    n = unwrap(prefill_slots(wrap(x), 7, Z3Ops()))
    solver = z3.Solver()
    solver.add(x >= 1, n * 7 < x)  # ⌈s/7⌉·7 ≥ s for every s: no model
    assert solver.check() == z3.unsat


def test_n_of_s_is_computed_by_the_one_helper() -> None:
    """No module of the audit, fleet and live wings re-derives ``⌈s/ŝ⌉`` inline."""
    root = Path(__file__).resolve().parents[1]
    inline = re.compile(r"-\(-[^()]*//\s*[\w.]*chunk\)|chunk\s*-\s*1\)\s*//")
    found = [
        f"{path.relative_to(root)}:{i}"
        for folder in ("audit", "fleet", "live")
        for path in sorted((root / folder).glob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if inline.search(line)
    ]
    assert not found, f"n(s) computed inline (use kvstab.model.prefill_slots): {found}"
