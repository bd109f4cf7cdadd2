"""Prefix caching below saturation (theory/sharing_lru.py, theory/sharing_lru_area.py): the claims,
the saturated limit (today's fixed point, exactly), and Che's approximation against the fast engine's
measured hit within its 95 % interval widened by the model's stated 0.02."""

from __future__ import annotations

import pytest

from kvstab.arrivals import poisson_arrivals
from kvstab.engine import run as engine_run
from kvstab.errors import InvalidArgument
from kvstab.metrics import hit_tokens
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.theory.claims import Claim, is_closed
from kvstab.theory.sharing_area import sharing_report
from kvstab.theory.sharing_lru import chat_hit_expr, chat_overlap_expr, lru_claims
from kvstab.theory.sharing_lru_area import tenant_hits
from kvstab.workload import parse_workload

#: a small server (bench_prefix's shape at a quarter of M): prompts of 32 tenants fill half of M
SMALL = ModelParams(M=16_384, chunk=256, block=16, token_budget=256, max_num_seqs=128, bbar=1.0, prefix_caching=True)
ZIPF = "s=const(320),o=U(10,200),prefix=tenants(32,const(256),0.5)"
UNIFORM = "s=const(320),o=U(10,200),prefix=tenants(128,const(256),0)"
#: what the approximation is asked to meet beside the run's own interval (Che, mean-field N̄)
MODEL_TOL = 0.02


@pytest.mark.parametrize("claim", lru_claims(), ids=lambda c: c.name)
def test_lru_claims(claim: Claim) -> None:
    assert claim.holds(), f"{claim.name}: lhs − rhs = {claim.difference()}"


def test_chat_forms_are_closed() -> None:
    assert is_closed(chat_hit_expr()) and is_closed(chat_overlap_expr())


@pytest.mark.parametrize("spec", [ZIPF, UNIFORM, "s=const(1280),o=U(10,500),prefix=tenants(64,const(1024),0.5)"])
@pytest.mark.parametrize("lifecycle", ["kvstab", "vllm"])
def test_at_saturation_it_is_todays_fixed_point(spec: str, lifecycle: str) -> None:
    """At and above μ_share·b̄ the free memory is zero, T = 0 and the hit is 1 − (1 − π_t)^N̄ with
    the saturated report's own N̄ and H; just below, it is continuous."""
    params = SMALL if "320" in spec else ModelParams(M=65_536, chunk=512, block=16, bbar=1.0, prefix_caching=True)
    w = parse_workload(spec)
    rep = sharing_report(w, params, lifecycle)
    assert rep is not None
    for k in (1.0, 1.5):
        at = tenant_hits(w, params, k * rep.mu_share_per_slot, lifecycle)
        assert at.T == 0.0 and at.free == 0.0
        assert at.mean_running == rep.mean_running
        assert at.referenced == pytest.approx(rep.held_once, rel=1e-12)
        assert at.hit == at.hit_saturated
    below = tenant_hits(w, params, (1 - 1e-9) * rep.mu_share_per_slot, lifecycle)
    assert below.hit == pytest.approx(at.hit, abs=1e-6) and below.T < 1e-3


def test_the_hit_falls_toward_the_referenced_share_as_load_rises() -> None:
    w = parse_workload(ZIPF)
    sat = tenant_hits(w, SMALL, 1.0).saturated_per_slot
    rows = [tenant_hits(w, SMALL, k * sat) for k in (0.2, 0.5, 0.8, 0.99)]
    assert all(a.T > b.T for a, b in zip(rows, rows[1:], strict=False))  # less free memory, shorter T
    assert all(r.hit > r.hit_saturated for r in rows)  # unreferenced prompts still cached add hits


def test_refuses_what_it_has_no_form_for() -> None:
    with pytest.raises(InvalidArgument, match="prefix law"):
        tenant_hits(parse_workload("paper-1:1"), SMALL, 0.1)
    with pytest.raises(InvalidArgument, match="rate"):
        tenant_hits(parse_workload(ZIPF), SMALL, -1.0)


@pytest.mark.parametrize("spec", [ZIPF, UNIFORM])
@pytest.mark.parametrize("load", [0.3, 0.6])
def test_che_against_the_fast_engine(spec: str, load: float) -> None:
    """Below saturation (no preemption, so the measured hit is exact): the predicted hit tokens per
    request lie within the run's 95 % batch-means interval widened by MODEL_TOL of the full hit; the
    variant without the dead own blocks in the free queue lies outside it (the test can fail)."""
    w = parse_workload(spec)
    sat = tenant_hits(w, SMALL, 1.0, "vllm").saturated_per_slot
    th = tenant_hits(w, SMALL, load * sat, "vllm")
    slots = 20_000
    plan = poisson_arrivals(w, load * sat, SMALL, slots, seed=1)
    res = engine_run(load_scheduler("vllm-v1"), SMALL, plan, slots, lifecycle="vllm").result
    assert res is not None
    assert int(res.preemptions.sum()) <= 10  # the estimator's premise: (almost) nothing recomputed
    full = th.hit_tokens / th.hit  # E[P̃]: the hit if every prompt were found
    est = hit_tokens(res, "vllm")
    slack = MODEL_TOL * full
    assert est.low - slack <= th.hit_tokens <= est.high + slack, (est, th.hit_tokens)
    wrong = tenant_hits(w, SMALL, load * sat, "vllm", dead_blocks=False)
    assert not est.low - slack <= wrong.hit_tokens <= est.high + slack


#: conversations on the small server: messages, answers, turns, think time in slots (b̄ = 1)
CHAT = "s=U(10,60),o=U(20,120),prefix=chat(U(1,6),{})"


def test_chat_numeric_twins_are_the_sympy_forms() -> None:
    import numpy as np

    from kvstab.theory import sharing_lru as L
    from kvstab.theory.sharing_lru_area import overlap, running_hit

    rng = np.random.default_rng(0)
    for _ in range(5):
        S, c = float(rng.integers(100, 3000)), float(rng.integers(1, 6))
        h, D, th = float(rng.integers(0, int(S))), c + float(rng.integers(1, 400)), float(rng.uniform(5, 2000))
        at = {L.S_prev: S, L.h0: h, L.c_pre: c, L.D_prev: D, L.theta: th, L.B_round: 16}
        one = [np.array([v]) for v in (S, h, c, D)]
        assert running_hit(*one, th, 16)[0] == pytest.approx(float(L.chat_running_hit_expr().subs(at)), rel=1e-9)
        assert overlap(*one, th)[0] == pytest.approx(float(L.chat_overlap_expr().subs(at)), rel=1e-9)


@pytest.mark.parametrize("think", [20, 300])
def test_chat_hit_against_the_fast_engine(think: int) -> None:
    """The turns' expected hit tokens at 0.4 × the saturated rate within the run's interval widened by
    MODEL_TOL of the mean prompt (no preemption: the measured hit is exact)."""
    from kvstab.theory.sharing_lru_area import chat_hits

    w = parse_workload(CHAT.format(think))
    sat = chat_hits(w, SMALL, None, "vllm")
    rate = 0.4 * SMALL.M / (sat.E_g_net + sat.held)
    th = chat_hits(w, SMALL, rate, "vllm")
    slots = 20_000
    plan = poisson_arrivals(w, rate, SMALL, slots, seed=1)
    res = engine_run(load_scheduler("vllm-v1"), SMALL, plan, slots, lifecycle="vllm").result
    assert res is not None and int(res.preemptions.sum()) <= 10
    est = hit_tokens(res, "vllm")
    slack = MODEL_TOL * th.prompt_tokens
    assert est.low - slack <= th.hit_tokens <= est.high + slack, (est, th.hit_tokens)
    assert th.p_running > 0.05  # the running case is part of what is checked
