"""The declared claims for any number of requests (``proofs/claims_folds.py``), and the
bounded check that stays for rules outside the class and for claims whose one-step facts fail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvstab.proofs.claims import prove_claims
from kvstab.proofs.claims_folds import SCOPE
from kvstab.proofs.encoding import Setting
from kvstab.proofs.solver import Budget
from kvstab.proofs.unbounded import classify
from kvstab.proofs.verdicts import Proved, Refuted
from kvstab.registry import load_scheduler

HERE = Path(__file__).resolve().parent


@pytest.fixture()
def plugins(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("claims_plugins", None)
    import claims_plugins

    return claims_plugins


@pytest.mark.parametrize(
    ("name", "setting", "count"),
    [
        ("current-fit", Setting(), 5),
        ("reserve", Setting(block=16), 4),
        ("lookahead", Setting(), 4),
        ("vllm-v1", Setting(block=16, token_budget=2048, max_num_seqs=256), 5),
        ("current-fit-no-preempt", Setting(), 2),
    ],
)
def test_built_ins_claims_hold_for_any_number_of_requests(name: str, setting: Setting, count: int, budget: Budget) -> None:
    r = prove_claims(load_scheduler(name), setting, budget=budget)
    assert len(r.claims) == count and isinstance(r.verdict, Proved)
    for c in r.claims:
        assert isinstance(c.verdict, Proved) and c.scope == SCOPE and c.facts, (c.name, str(c.verdict), c.note)
        text = " ".join(c.verdict.assumptions)
        assert "no K, no Q" in text and "K =" not in text and "Q =" not in text and "K ≤" not in text
        # every claim rests on named one-step obligations, each behind a vacuity guard
        assert c.obligations or c.name == "FCFS admissions" and "one term" in c.facts[0]
        assert all(isinstance(o.verdict, Proved) for o in c.obligations)
        assert sum("[guard]" in o.label() for o in c.obligations) * 2 == len(c.obligations)


@pytest.mark.parametrize(
    "rule", ["FIRST_FIT_FOLDS", "OLDEST_VICTIM_FOLDS", "PREEMPTS_ALL_FOLDS", "BUSY_ONLY_FOLDS", "PEAK_CHECK_FOLDS"]
)
def test_fold_ports_of_the_claim_mutants_are_caught_by_the_claim_they_break(plugins, rule: str, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    """In the class, a broken claim's one-step fact fails: the claim is not proved for any number of
    requests, and the bounded check finds the concrete state; the claims it keeps stay K-free."""
    sched = getattr(plugins, rule)
    assert classify(sched, Setting()).member
    r = prove_claims(sched, Setting(), K=2, Q=2, budget=budget)
    broken = plugins.BREAKS[rule]
    for c in r.claims:
        if c.name in broken:
            assert isinstance(c.verdict, Refuted) and c.witness, (c.name, str(c.verdict))
            assert c.scope == "K ≤ 2, Q ≤ 2" and c.note.startswith("not proved for any number of requests (")
        else:
            assert isinstance(c.verdict, Proved) and c.scope == SCOPE, (c.name, str(c.verdict), c.note)
    assert broken and set(broken) <= {c.name for c in r.claims}


def test_reading_o_in_a_fold_is_refuted_with_a_replayable_pair(plugins, budget: Budget) -> None:  # type: ignore[no-untyped-def]
    r = prove_claims(plugins.PEAK_CHECK_FOLDS, Setting(), K=2, Q=2, budget=budget, only=["non-clairvoyant"])
    (claim,) = r.claims
    assert "two copies" in claim.note and "every step on entries differing only in o" in claim.note
    pair = claim.pair
    assert isinstance(claim.verdict, Refuted) and pair is not None
    (a1, w1), (a2, w2) = pair.first, pair.second
    assert [(s, p) for s, _, p in a1] == [(s, p) for s, _, p in a2] and [s for s, _ in w1] == [s for s, _ in w2]
    assert pair.replayed and pair.decisions[0] != pair.decisions[1]
    assert all(c.startswith("kvstab replay --scheduler ") and c.endswith("--slots 1") for c in pair.commands)


@pytest.mark.parametrize(
    ("mutant", "claims"),
    [
        ("skips_blocked_head", ("FCFS admissions",)),
        ("wrong_victim", ("oldest running request progresses", "no livelock (ranking function)")),
        ("preempts_all", ("oldest running request progresses", "no livelock (ranking function)")),
    ],
)
def test_the_mutants_are_caught_by_the_claim_they_break(mutant: str, claims: tuple[str, ...], budget: Budget) -> None:
    """``tests/mutants`` read the view in plain Python: outside the class, so the default path checks
    their claims at bounds and says why; each is refuted by the claim it breaks, with a state."""
    sys.path.insert(0, str(HERE.parent))
    r = prove_claims(load_scheduler(f"mutants.{mutant}:SCHEDULER"), Setting(), K=2, Q=2, budget=budget)
    by_name = {c.name: c for c in r.claims}
    for name in claims:
        c = by_name[name]
        assert isinstance(c.verdict, Refuted) and c.witness and c.scope == "K ≤ 2, Q ≤ 2"
        assert c.note.startswith("outside the prefix-fold class: tests/mutants/")
    assert all(isinstance(c.verdict, Proved) for c in r.claims if c.name not in claims)


def test_the_bounded_check_can_be_asked_for(budget: Budget) -> None:
    r = prove_claims(load_scheduler("current-fit"), Setting(), K=2, Q=1, budget=budget, unbounded=False)
    assert isinstance(r.verdict, Proved)
    assert all(c.scope == "K ≤ 2, Q ≤ 1" and c.note == "the bounded check was asked for" for c in r.claims)


def test_a_rule_that_may_stall_running_requests_is_not_asked_that_the_oldest_advances(budget: Budget) -> None:
    """``stalls_running`` (SGLang's prefill-only steps, its retraction of the fewest-output request)
    disclaims the oldest request's progress and the ranking built on it; the lone head is still asked."""
    import dataclasses

    sched = load_scheduler("current-fit")
    stalls = dataclasses.replace(sched, traits=dataclasses.replace(sched.traits, stalls_running=True))
    r = prove_claims(stalls, Setting(), budget=budget, only=["progress"])
    assert [c.name for c in r.claims] == ["lone head admitted"]
    assert [c.name for c in prove_claims(sched, Setting(), budget=budget, only=["progress"]).claims] == [
        "oldest running request progresses", "lone head admitted", "no livelock (ranking function)"
    ]


def test_a_bounded_counterexample_counts_only_if_the_rule_re_run_on_it_breaks_the_claim(
    monkeypatch: pytest.MonkeyPatch, budget: Budget
) -> None:
    """``reserve-growing-cost`` sums an unmasked term over the active list, so in the bounded encoding an
    *empty* slot's free fields block the head; the real engine's empty server admits it (as the claim for
    any number of requests proves). The bounded model is not a counterexample, and says so."""
    monkeypatch.syspath_prepend(str(HERE))
    import fold_plugins

    rule = fold_plugins.RESERVE_GROWING_COST
    free = {c.name: c for c in prove_claims(rule, Setting(), K=2, Q=2, budget=budget, only=["progress"]).claims}
    assert isinstance(free["lone head admitted"].verdict, Proved) and free["lone head admitted"].scope == SCOPE
    bounded = prove_claims(rule, Setting(), K=2, Q=2, budget=budget, only=["progress"], unbounded=False)
    c = {c.name: c for c in bounded.claims}["lone head admitted"]
    assert not isinstance(c.verdict, Refuted) and "does not reproduce" in str(c.verdict)
    assert c.witness.endswith("(not reproduced on the concrete rule)")
