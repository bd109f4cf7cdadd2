"""Proofs for any number of requests, the relevance guard, and the declared claims."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import z3

from kvstab.proofs.claims import prove_claims
from kvstab.proofs.encoding import Setting
from kvstab.proofs.induction import check_inductive
from kvstab.proofs.invariants import Conjunct
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
from kvstab.proofs.unbounded import classify, prove_unbounded
from kvstab.proofs.verdicts import Proved, Refuted, Unknown, passed
from kvstab.registry import load_scheduler

HERE = Path(__file__).resolve().parent


@pytest.fixture()
def plugins(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("proof_plugins", None)
    import proof_plugins

    return proof_plugins


@pytest.fixture()
def folds(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("fold_plugins", None)
    import fold_plugins

    return fold_plugins


def _no_bounds(v: Proved) -> None:
    text = " ".join(v.assumptions)
    assert "K =" not in text and "Q =" not in text and "no K, no Q" in text


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("current-fit", Setting()),
        ("current-fit", Setting(block=16)),
        ("reserve", Setting()),
        ("reserve", Setting(block=16)),
        ("lookahead", Setting()),
        ("lookahead", Setting(block=16, max_num_seqs=4)),
        ("vllm-v1", Setting()),
        ("vllm-v1", Setting(block=16, token_budget=2048, max_num_seqs=8)),
    ],
)
def test_built_ins_are_proved_for_any_number_of_requests(name: str, setting: Setting, budget: Budget) -> None:
    r = prove_unbounded(load_scheduler(name), setting, budget)
    assert isinstance(r.verdict, Proved), (r.verdict, r.check.reason)
    _no_bounds(r.verdict)
    # every obligation is about one entry: none mentions an active or a queued slot
    assert r.obligations and all(passed(o.verdict) for o in r.obligations)
    assert r.invariants and any("P0 (structural)" in a for a in r.verdict.assumptions)
    text = " ".join(r.verdict.assumptions)
    assert ("token budget = " in text) == (setting.token_budget is not None)
    assert ("max_num_seqs = " in text) == (setting.max_num_seqs is not None)


@pytest.mark.parametrize(
    ("block", "token_budget", "max_num_seqs", "chunk"),
    [(2, 1, 1, 8), (16, 7, 3, 512), (3, None, 2, 6), (1, 512, None, 1)],
)
def test_vllm_v1_is_proved_for_any_number_of_requests_in_odd_configurations(
    block: int, token_budget: int | None, max_num_seqs: int | None, chunk: int, budget: Budget
) -> None:
    """A budget of one token, a cap of one request, blocks that do not divide the chunk: the
    verdict is for the configuration it names (B, ŝ, budget and cap are fixed; M is any)."""
    se = Setting(chunk=chunk, block=block, token_budget=token_budget, max_num_seqs=max_num_seqs)
    r = prove_unbounded(load_scheduler("vllm-v1"), se, budget)
    assert isinstance(r.verdict, Proved), r.verdict
    _no_bounds(r.verdict)


def test_the_proofs_rest_on_the_loop_invariants_the_docs_state(budget: Budget) -> None:
    """current-fit: the host of the active list keeps Σcharge = kept ≤ prefix and kept ≤ M
    (docs/proofs.md); vllm-v1 under a budget also Σtokens + budget ≤ token_budget, budget ≥ 0."""
    r = prove_unbounded(load_scheduler("current-fit"), Setting(), budget)
    host = next(i for i in r.invariants if "preempt_newest" in i and "with the charge" in i)
    for atom in ("Σcharge = kept", "kept ≤ prefix", "kept ≤ M"):
        assert atom in host, host
    r = prove_unbounded(load_scheduler("vllm-v1"), Setting(token_budget=512), budget)
    host = next(i for i in r.invariants if "schedule" in i and "with the charge" in i)
    for atom in ("Σcharge = kept", "budget ≥ 0", "Σtokens + budget ≤ token_budget"):
        assert atom in host, host
    assert any("state invariant" in i for i in prove_unbounded(load_scheduler("lookahead"), Setting(), budget).invariants)


def test_reserve_is_proved_with_its_cost_invariant(budget: Budget) -> None:
    r = prove_unbounded(load_scheduler("reserve"), Setting(), budget)
    assert isinstance(r.verdict, Proved)
    assert any("Σ_active c(a) ≤ M" in a for a in r.verdict.assumptions)
    assert {o.conjunct for o in r.obligations} >= {"c(a) ≥ 0", "c does not grow while a stays"}


def test_rules_outside_the_class_get_the_bounded_proof_and_a_note(plugins, setting: Setting, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    # the ratio-reserve plug-in folds with `ops.or_(*preempt)`: it iterates the preempt flags itself
    check = classify(plugins.RATIO_RESERVE, setting)
    assert not check.member and "ops.or_(*preempt)" in check.reason and "iterates view.active" in check.reason
    rep = prove(plugins.RATIO_RESERVE, K=2, Q=1, bmc_depth=2, setting=setting, budget=budget, unbounded=True)
    assert isinstance(rep.verdict, Proved) and not rep.unbounded
    assert any("K = 2" in a for a in rep.verdict.assumptions)
    assert rep.notes and "not proved for every number of requests (outside the prefix-fold class" in rep.notes[0]


def test_a_stateful_rule_made_of_folds_is_proved_with_its_state_bounds(folds, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    """A real-valued ratio (SGLang's shape: it scales a reservation, decays, and jumps after a
    preemption): the pre state is assumed within its declared bounds, the next state is proved
    within them, and memory holds whatever the ratio is."""
    r = prove_unbounded(folds.RATIO_RESERVE_FOLDS, Setting(), budget)
    assert isinstance(r.verdict, Proved), r.verdict
    assert any(o.conjunct == "state ratio′ ∈ [0.1, 1.0]" and passed(o.verdict) for o in r.obligations)
    assert any("the rule's state within its declared bounds" in a for a in r.verdict.assumptions)


def test_sglang_is_in_the_class_with_its_retraction_and_its_prefill_decode_choice(setting: Setting) -> None:
    """sglang reads the lists through the folds, a retraction and a selection between the prefill
    step's grants and the decode step's: the form names each case's sources (the proof is in
    tests/proofs/test_proofs_sglang.py)."""
    check = classify(load_scheduler("sglang"), setting)
    assert check.member and check.sides is not None and len(check.sides.active) == 2, check.reason
    form = check.premises[0]
    assert "retraction 0 (kvstab/schedulers/sglang.py:" in form and "retract_until_fits" in form
    assert "continue_chunk" in form and "decode_one" in form and " where ¬(0 < in_batch@fold" in form


def test_negative_control_is_still_refuted_with_a_replayable_trace(setting: Setting, budget: Budget) -> None:
    # it is made of folds, so the theorem is tried, and fails at the slot's charge (or its cost)
    r = prove_unbounded(load_scheduler("current-fit-no-preempt"), setting, budget)
    assert r.check.member and not passed(r.verdict)
    rep = prove("current-fit-no-preempt", K=2, Q=2, bmc_depth=3, setting=setting, budget=budget, unbounded=True)
    assert isinstance(rep.verdict, Refuted) and rep.verdict.trace is not None and rep.verdict.trace.replayed
    # minimised: the fewest arrivals, then the least M, then the shortest requests
    assert rep.verdict.trace.arrivals == ((0, 1, 1), (0, 1, 1)) and rep.verdict.trace.M == 2


@pytest.mark.parametrize(
    ("rule", "setting", "fails", "bounds"),
    [
        # the slot's charge: a first chunk counted one token short
        ("CURRENT_FIT_SHORT_CHUNK", Setting(), "end memory charged in the slot ≤ M", (2, 1, 2)),
        # the cost across slots: a reservation that grows while the request stays
        ("RESERVE_GROWING_COST", Setting(), "cost c does not grow while a stays", (2, 1, 2)),
        # the projection: one that ends a slot early misses each request's last slot
        ("LOOKAHEAD_SKIPS_LAST_SLOT", Setting(), "projection PJ3: the slot charges P(1)", (1, 1, 2)),
    ],
)
def test_a_premise_that_fails_is_named_and_the_bounded_flow_refutes_the_rule(
    folds, rule: str, setting: Setting, fails: str, bounds: tuple[int, int, int], budget: Budget  # type: ignore[no-untyped-def]
) -> None:
    sched = getattr(folds, rule)
    r = prove_unbounded(sched, setting, budget)
    assert r.check.member and isinstance(r.verdict, Unknown), r.verdict
    assert fails in r.verdict.reason, r.verdict.reason
    K, Q, depth = bounds
    rep = prove(sched, K=K, Q=Q, bmc_depth=depth, setting=setting, budget=budget, unbounded=True)
    assert isinstance(rep.verdict, Refuted) and rep.verdict.trace is not None and rep.verdict.trace.replayed
    assert rep.notes and fails in rep.notes[0]


def test_a_budget_overrun_that_needs_two_admissions_in_a_slot_is_caught(folds, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    """vllm-v1 not debiting admitted requests' first chunks: only two admissions in one slot can
    process more tokens than the budget, which a bounded proof with one queued request cannot see
    (it proves the rule at K = 2, Q = 1); the theorem names the budget, and the run its bounded
    flow finds at Q = 2 breaks it in the engine."""
    from kvstab.arrivals import fixed_arrivals
    from kvstab.errors import InvariantViolation
    from kvstab.model import ModelParams
    from kvstab.simulator import simulate

    se = Setting(token_budget=64)
    r = prove_unbounded(folds.VLLM_FREE_FIRST_CHUNK, se, budget)
    assert isinstance(r.verdict, Unknown) and "end tokens in the slot ≤ token budget" in r.verdict.reason
    assert isinstance(check_inductive(folds.VLLM_FREE_FIRST_CHUNK, se, 2, 1, budget=budget).verdict, Proved)
    # kvstab prove --scheduler …:VLLM_FREE_FIRST_CHUNK --token-budget 64 --K 2 --Q 2 finds this run
    plan = fixed_arrivals([(0, 32, 1), (0, 33, 1)])
    with pytest.raises(InvariantViolation, match="token budget"):
        simulate(folds.VLLM_FREE_FIRST_CHUNK, ModelParams(M=65, chunk=512, token_budget=64), plan, drain=True, check=True)


def test_a_negative_grant_is_caught_by_the_theorem_as_the_engine_rejects_it(folds, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    """vllm-v1 debiting the budget by the ask: the budget goes negative and so does a later grant,
    which the engine rejects (check_decision_values); the theorem's per-entry goal names it, and the
    bounded flow's counterexample, replayed, meets the engine's own rejection."""
    from kvstab.errors import InvalidScheduler

    se = Setting(token_budget=64)
    r = prove_unbounded(folds.VLLM_DEBITS_ASK, se, budget)
    assert isinstance(r.verdict, Unknown) and "every grant is ≥ 0" in r.verdict.reason
    with pytest.raises(InvalidScheduler, match="negative"):
        prove(folds.VLLM_DEBITS_ASK, K=2, Q=2, bmc_depth=3, setting=se, budget=budget, unbounded=True)


def test_a_grant_above_the_unit_is_clamped_so_over_granting_is_proved(folds, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    """The engine clamps every grant to one unit (``progress_after``): a rule asking for two chunks
    only over-counts what it allocates and spends, and the theorem, which charges what the engine
    charges, proves it — under a token budget too; the bounded proof agrees."""
    for se in (Setting(), Setting(token_budget=64, block=16)):
        r = prove_unbounded(folds.VLLM_OVER_GRANT, se, budget)
        assert isinstance(r.verdict, Proved), r.verdict
    rep = prove(folds.VLLM_OVER_GRANT, K=2, Q=1, bmc_depth=2, setting=Setting(token_budget=64), budget=budget)
    assert isinstance(rep.verdict, Proved)


def test_a_structure_that_changes_with_the_number_of_requests_is_outside_the_class(plugins, setting: Setting) -> None:  # type: ignore[no-untyped-def]
    check = classify(plugins.SIZE_DEPENDENT, setting)
    assert not check.member and "proof_plugins.py:" in check.reason and "if len(view.active) < 4" in check.reason
    assert "measures view.active" in check.reason


def test_a_size_threshold_beyond_any_sampled_size_is_outside_the_class(plugins, setting: Setting) -> None:  # type: ignore[no-untyped-def]
    """A rule that changes only from 5 running requests on: the view it is run on cannot say how
    many entries it has, so its len() is refused, whatever the threshold."""
    check = classify(plugins.THRESHOLD_BEYOND_SIZES, setting)
    assert not check.member and "measures view.active" in check.reason


def test_sglang_without_retraction_overflows_and_is_not_proved(folds, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    from kvstab.arrivals import fixed_arrivals
    from kvstab.errors import InvariantViolation
    from kvstab.model import ModelParams
    from kvstab.simulator import simulate

    assert not classify(folds.SGLANG_NO_RETRACT, Setting()).member
    # the workload on which sglang itself retracts (tests/proofs/test_proofs_sglang.py)
    plan = fixed_arrivals([(2, 9, 47), (5, 1, 20), (10, 5, 26)])
    with pytest.raises(InvariantViolation, match="memory"):
        simulate(folds.SGLANG_NO_RETRACT, ModelParams(M=81, chunk=8, block=1), plan, drain=True, check=True)


def test_relevance_guard_refuses_bounds_that_cannot_fill_M(plugins, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    se = Setting(M=131000)
    small = Conjunct("requests ≤ 100 tokens", lambda st, s: z3.And(*[z3.Implies(e.present, e.s + e.o <= 100) for e in st.active]))
    r = check_inductive(load_scheduler("current-fit"), se, 2, 1, [small], budget=budget)
    assert isinstance(r.verdict, Unknown) and "vacuous bounds" in r.verdict.reason and "raise --K" in r.verdict.reason
    # the example: admission on memory held before growth, M = 131000
    rep = prove(plugins.ADMITS_ON_HELD_NOW, K=2, Q=2, bmc_depth=3, setting=se, budget=budget)
    assert isinstance(rep.verdict, (Unknown, Refuted)) and not passed(rep.verdict)
    assert isinstance(rep.verdict, Refuted) or "vacuous bounds" in rep.verdict.reason
    # with M symbolic it is refuted by a reachable run
    rep = prove(plugins.ADMITS_ON_HELD_NOW, K=2, Q=2, bmc_depth=3, setting=Setting(), budget=budget)
    assert isinstance(rep.verdict, Refuted) and rep.verdict.trace is not None and rep.verdict.trace.replayed


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("current-fit", Setting()),
        ("reserve", Setting()),
        ("lookahead", Setting()),
        ("vllm-v1", Setting()),
        ("vllm-v1", Setting(block=16, token_budget=512, max_num_seqs=2)),
    ],
)
def test_built_ins_keep_what_they_declare(name: str, setting: Setting, budget: Budget) -> None:
    r = prove_claims(load_scheduler(name), setting, K=2, Q=2, budget=budget)
    assert isinstance(r.verdict, Proved), [(c.name, str(c.verdict)) for c in r.claims]
    names = {c.name for c in r.claims}
    assert names >= {"FCFS admissions", "oldest running request progresses", "lone head admitted"}
    # the ranking function covers rules that grant part of a unit (vllm-v1 under a token budget)
    assert "no livelock (ranking function)" in names


def test_the_ranking_catches_a_rule_whose_grants_can_stall_everyone(folds, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    """vllm-v1 keeping one token of the budget back: with a budget of one token no running request
    ever advances again — memory is safe (proved for any number of requests), but it livelocks."""
    se = Setting(token_budget=1)
    assert isinstance(prove_unbounded(folds.VLLM_HOARDS_ONE_TOKEN, se, budget).verdict, Proved)
    r = prove_claims(folds.VLLM_HOARDS_ONE_TOKEN, se, K=2, Q=2, budget=budget)
    by_name = {c.name: c for c in r.claims}
    assert isinstance(by_name["no livelock (ranking function)"].verdict, Refuted)
    assert "the ranking does not fall" in by_name["no livelock (ranking function)"].witness


def test_reading_o_while_declaring_non_clairvoyance_is_refuted_with_a_pair(plugins, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    r = prove_claims(plugins.SHORTEST_TOTAL_FIRST, Setting(), K=2, Q=2, budget=budget, only=["non-clairvoyant"])
    (claim,) = r.claims
    assert isinstance(claim.verdict, Refuted) and claim.pair is not None
    pair = claim.pair
    (a1, w1), (a2, w2) = pair.first, pair.second
    # the same state but for o …
    assert [(s, p) for s, _, p in a1] == [(s, p) for s, _, p in a2] and [s for s, _ in w1] == [s for s, _ in w2]
    # … and the rule, re-run on concrete integers, decides differently
    assert pair.replayed and pair.decisions[0] != pair.decisions[1]
    assert all(c.startswith("kvstab replay --scheduler ") for c in pair.commands)


@pytest.mark.parametrize(
    ("mutant", "claim"),
    [
        ("skips_blocked_head", "FCFS admissions"),
        ("wrong_victim", "oldest running request progresses"),
        ("preempts_all", "oldest running request progresses"),
        ("preempts_all", "no livelock (ranking function)"),
        ("wrong_victim", "no livelock (ranking function)"),
    ],
)
def test_one_step_claims_catch_mutants_that_keep_memory(mutant: str, claim: str, budget: Budget) -> None:
    sys.path.insert(0, str(HERE.parent))
    r = prove_claims(load_scheduler(f"mutants.{mutant}:SCHEDULER"), Setting(), K=3, Q=3, budget=budget)
    by_name = {c.name: c for c in r.claims}
    assert isinstance(by_name[claim].verdict, Refuted) and by_name[claim].witness
