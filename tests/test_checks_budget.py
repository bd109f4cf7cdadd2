"""The audit under a token budget: partial grants make the exact-g properties inequalities.

vLLM's scheduler shares one token budget per step, so a prefill chunk can be
shorter than ``ŝ`` and a request can sit a step without work: its area is then
path-dependent, above or below ``g``.  The audit checks it against the area no
path avoids, keeps the Lyapunov identity with the difference term, and bounds
liveness by ``Σ (s + o)``; without partial grants it still demands ``= g``
exactly (the mutation test relies on that).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.arrivals import fixed_arrivals
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.testing.checks import audit_plan


@st.composite
def budgeted(draw: st.DrawFn) -> tuple[ModelParams, list[tuple[int, int, int]]]:
    M = draw(st.integers(64, 400))
    block = draw(st.sampled_from([1, 4, 8]))
    chunk = draw(st.integers(4, 64))
    budget = draw(st.integers(1, chunk))  # vLLM: ŝ is the budget, or larger
    rows = draw(
        st.lists(
            st.tuples(st.integers(0, 12), st.integers(1, M // 3), st.integers(1, M // 3)), min_size=1, max_size=8
        )
    )
    return ModelParams(M=M, chunk=chunk, block=block, token_budget=budget), rows


@given(case=budgeted())
@settings(max_examples=60, deadline=None)
def test_vllm_v1_with_a_token_budget_passes_the_audit(case: tuple[ModelParams, list[tuple[int, int, int]]]) -> None:
    params, rows = case
    aud = audit_plan(load_scheduler("vllm-v1"), params, fixed_arrivals(rows))
    assert all(r.finish >= 0 for r in aud.engine.requests)


def test_partial_grants_can_serve_less_or_more_than_g() -> None:
    """s = 5, ŝ = 4: maximal batching holds 4, 5, 6 (g = 15); with a budget of 3
    the prompt goes 3, 5 and the area is 14 < g.  Stalls make it larger than g."""
    lone = audit_plan(load_scheduler("vllm-v1"), ModelParams(M=64, chunk=4, token_budget=3), fixed_arrivals([(0, 5, 1)]))
    assert lone.partial[0] and lone.total_area[0] == 14 < lone.g[0] == 15
    params = ModelParams(M=200, chunk=64, block=8, token_budget=64)
    rows = [(0, 100, 30), (0, 80, 40), (1, 50, 50), (2, 120, 20), (3, 10, 10)]
    aud = audit_plan(load_scheduler("vllm-v1"), params, fixed_arrivals(rows))
    diff = [aud.total_area[r.rid] - aud.wasted[r.rid] - aud.g[r.rid] for r in aud.engine.requests]
    assert any(d > 0 for d in diff) and any(aud.partial)
