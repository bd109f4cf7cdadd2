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


@pytest.mark.parametrize("name", ["current-fit", "reserve"])
@pytest.mark.parametrize("block", [1, 16])
def test_prefix_fold_rules_are_proved_for_any_number_of_requests(name: str, block: int, budget: Budget) -> None:
    r = prove_unbounded(load_scheduler(name), Setting(block=block), budget)
    assert isinstance(r.verdict, Proved), (r.verdict, r.check.reason)
    text = " ".join(r.verdict.assumptions)
    assert "K =" not in text and "Q =" not in text and "no K, no Q" in text
    # every obligation is about one request: none mentions an active or queued slot
    assert r.obligations and all(passed(o.verdict) for o in r.obligations)


@pytest.mark.parametrize("name", ["lookahead", "vllm-v1"])
def test_rules_outside_the_class_get_the_bounded_proof_and_a_note(name: str, setting: Setting, budget: Budget) -> None:
    check = classify(load_scheduler(name), setting)
    assert not check.member and check.reason
    rep = prove(name, K=2, Q=1, bmc_depth=2, setting=setting, budget=budget, unbounded=True)
    assert isinstance(rep.verdict, Proved) and not rep.unbounded
    assert any("K = 2" in a for a in rep.verdict.assumptions)
    assert rep.notes and "not proved for every number of requests" in rep.notes[0]


def test_negative_control_is_still_refuted_with_a_replayable_trace(setting: Setting, budget: Budget) -> None:
    assert not passed(prove_unbounded(load_scheduler("current-fit-no-preempt"), setting, budget).verdict)
    rep = prove("current-fit-no-preempt", K=2, Q=2, bmc_depth=3, setting=setting, budget=budget, unbounded=True)
    assert isinstance(rep.verdict, Refuted) and rep.verdict.trace is not None and rep.verdict.trace.replayed
    # minimised: the fewest arrivals, then the least M, then the shortest requests
    assert rep.verdict.trace.arrivals == ((0, 1, 1), (0, 1, 1)) and rep.verdict.trace.M == 2


def test_a_rule_that_breaks_the_class_premises_is_not_proved_unbounded(plugins, setting: Setting) -> None:  # type: ignore[no-untyped-def]
    # admission starts from memory held *before* the slot's growth: outside the class
    check = classify(plugins.ADMITS_ON_HELD_NOW, setting)
    assert not check.member and "kept" in check.reason
    # a mutant in the class whose admission test undercounts the first chunk fails O1
    sys.path.insert(0, str(HERE.parent))
    from mutants.chunk_off_by_one import SCHEDULER as off_by_one

    r = prove_unbounded(off_by_one, setting)
    assert isinstance(r.verdict, Unknown) and "fits(w, acc)" in r.verdict.reason


def test_a_structure_that_changes_with_the_number_of_requests_is_outside_the_class(plugins, setting: Setting) -> None:  # type: ignore[no-untyped-def]
    check = classify(plugins.SIZE_DEPENDENT, setting)
    assert not check.member and "P0 (static)" in check.reason and "SizeDependent (line" in check.reason
    assert "calls len()" in check.reason


def test_a_size_threshold_beyond_the_observed_sizes_is_outside_the_class(plugins, setting: Setting) -> None:  # type: ignore[no-untyped-def]
    """A rule that changes only from 5 running requests on looks the same at every size the
    symbolic runs observe (K ≤ 4); the static check of its source still puts it outside."""
    check = classify(plugins.THRESHOLD_BEYOND_SIZES, setting)
    assert not check.member and "P0 (static)" in check.reason and "calls len()" in check.reason


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


@pytest.mark.parametrize("name", ["current-fit", "reserve", "lookahead", "vllm-v1"])
def test_built_ins_keep_what_they_declare(name: str, budget: Budget) -> None:
    r = prove_claims(load_scheduler(name), Setting(), K=2, Q=2, budget=budget)
    assert isinstance(r.verdict, Proved), [(c.name, str(c.verdict)) for c in r.claims]
    assert {c.name for c in r.claims} >= {"FCFS admissions", "oldest running request progresses", "lone head admitted"}
    # the ranking function is checked for rules that run every request one full unit
    assert ("no livelock (ranking function)" in {c.name for c in r.claims}) == (name != "vllm-v1")


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
