"""Inductive proofs of the built-ins, vacuity guards, Houdini and the bad-input paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import z3

from kvstab.errors import InvalidScheduler
from kvstab.proofs.bmc import k_induction
from kvstab.proofs.encoding import Setting
from kvstab.proofs.induction import check_inductive, houdini
from kvstab.proofs.invariants import MENU, Conjunct, menu
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
from kvstab.proofs.verdicts import Proved, Refuted, Unknown, passed
from kvstab.registry import load_scheduler

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def test_current_fit_is_proved_per_branch_and_conjunct(setting: Setting, budget: Budget) -> None:
    r = check_inductive(load_scheduler("current-fit"), setting, 3, 2, budget=budget, spec="current-fit")
    assert isinstance(r.verdict, Proved)
    assert any("K = 3" in a for a in r.verdict.assumptions) and any("ŝ = 512" in a for a in r.verdict.assumptions)
    steps = [o for o in r.obligations if o.name == "step" and o.branch != "every decision"]
    # every branch of current-fit's decision is feasible and checked for every goal
    assert {o.branch for o in steps} == {"preempts", "admits", "holds"}
    goals = {o.conjunct for o in steps}
    assert goals == {"memory ≤ M in the slot", "memory ≤ M′"}
    assert len(steps) == 3 * len(goals)
    # well-formedness is decision-independent: proved once, for every decision
    wf = [o for o in r.obligations if o.branch == "every decision" and o.conjunct == "well-formed′"]
    assert len(wf) == 1 and passed(wf[0].verdict)
    guards = [o for o in r.obligations if "premises satisfiable" in o.name]
    # Init, the free-decision frame, one per branch, the release lemma of "memory ≤ M"
    assert (
        sorted(o.name for o in guards)
        == ["init: premises satisfiable", "lemma: premises satisfiable"] + ["step: premises satisfiable"] * 4
    )
    assert all(passed(o.verdict) for o in guards)


def test_vacuous_premises_fail_instead_of_passing(setting: Setting, budget: Budget) -> None:
    # a conjunct no state satisfies makes every consecution query unsat; the
    # guard must turn that into Unknown, never into a proof
    absurd = Conjunct("M < 0", lambda st, se: se.M_term < 0)
    r = check_inductive(load_scheduler("current-fit"), setting, 2, 1, [absurd], budget=budget)
    assert not passed(r.verdict)
    # the relevance guard is the first to see that no state is covered
    rel = [o for o in r.obligations if o.name == "relevance"]
    assert len(rel) == 1 and isinstance(rel[0].verdict, Unknown) and "vacuous" in rel[0].verdict.reason
    steps = [o for o in r.obligations if o.name.startswith("step") and o.branch != "every decision"]
    assert not any(passed(o.verdict) for o in steps)


def test_negative_control_cti_replays(setting: Setting, budget: Budget) -> None:
    r = check_inductive(
        load_scheduler("current-fit-no-preempt"), setting, 2, 2, budget=budget, spec="current-fit-no-preempt"
    )
    assert isinstance(r.verdict, Refuted)
    tr = r.verdict.trace
    assert tr is not None and tr.kind == "cti"
    assert tr.replayed, tr.replay_message
    assert tr.violation_memory > tr.M


@pytest.mark.parametrize("name", ["reserve", "lookahead"])
def test_base_invariant_is_not_inductive_for_clairvoyant_policies(name: str, setting: Setting, budget: Budget) -> None:
    r = check_inductive(load_scheduler(name), setting, 2, 1, budget=budget, spec=name, fail_fast=True)
    assert isinstance(r.verdict, Refuted)
    assert r.verdict.trace is not None and r.verdict.trace.replayed, r.verdict.trace.replay_message


def test_reserve_with_supplied_strengthening(setting: Setting, budget: Budget) -> None:
    r = check_inductive(
        load_scheduler("reserve"), setting, 3, 2, [MENU["reserved peaks fit"]], budget=budget, spec="reserve"
    )
    assert isinstance(r.verdict, Proved)
    assert "strengthened by: reserved peaks fit" in r.verdict.assumptions
    assert any(o.name == "lemma" and passed(o.verdict) for o in r.obligations)


def test_houdini_finds_the_lookahead_strengthening(setting: Setting, budget: Budget) -> None:
    survivors, log = houdini(load_scheduler("lookahead"), setting, 2, 1, [], menu(), budget=budget)
    assert survivors is not None
    assert [c.name for c in survivors] == ["projected memory fits"]
    assert any("dropped 'reserved peaks fit'" in line for line in log)


def test_houdini_finds_nothing_for_the_negative_control(setting: Setting, budget: Budget) -> None:
    survivors, log = houdini(load_scheduler("current-fit-no-preempt"), setting, 2, 1, [], menu(), budget=budget)
    assert survivors is None
    assert "required" in log[-1]


def test_prove_gives_the_verdicts_of_the_built_ins(setting: Setting, budget: Budget) -> None:
    for name, strengthening in (
        ("current-fit", ()),
        ("reserve", ("reserved peaks fit",)),
        ("lookahead", ("projected memory fits",)),
    ):
        rep = prove(name, K=2, Q=1, bmc_depth=3, setting=setting, budget=budget)
        assert isinstance(rep.verdict, Proved), (name, rep.verdict)
        assert rep.strengthening == strengthening
    rep = prove("current-fit-no-preempt", K=2, Q=2, bmc_depth=4, setting=setting, budget=budget)
    assert isinstance(rep.verdict, Refuted)
    assert rep.verdict.trace is not None and rep.verdict.trace.kind == "reachable" and rep.verdict.trace.replayed


def test_solver_budget_gives_unknown_with_the_saved_query(setting: Setting, tmp_path: Path) -> None:
    tiny = Budget(rlimit=2_000, smt2_dir=tmp_path / "q")
    rep = prove("lookahead", K=2, Q=2, bmc_depth=2, setting=setting, budget=tiny)
    assert isinstance(rep.verdict, Unknown) and not passed(rep.verdict)
    assert rep.verdict.smt2 is not None and Path(rep.verdict.smt2).is_file()
    text = Path(rep.verdict.smt2).read_text(encoding="utf-8")
    assert "(assert" in text


def test_branching_rule_is_rejected_with_its_line(setting: Setting, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    sys.modules.pop("sample_plugins", None)
    with pytest.raises(InvalidScheduler) as exc:
        prove("sample_plugins:BRANCHES", K=2, Q=1, bmc_depth=1, setting=setting)
    msg = str(exc.value)
    assert "sample_plugins.py:" in msg and "if w.s < 10" in msg and "ops.ite" in msg


def test_k_induction(setting: Setting, budget: Budget) -> None:
    v, _ = k_induction(load_scheduler("current-fit"), setting, 2, 1, 1, budget=budget)
    assert isinstance(v, Proved)
    v, _ = k_induction(load_scheduler("current-fit-no-preempt"), setting, 2, 1, 2, budget=budget)
    assert isinstance(v, Refuted)


def test_fixed_small_M_and_chunk(budget: Budget) -> None:
    se = Setting(M=40, chunk=4)
    assert isinstance(check_inductive(load_scheduler("current-fit"), se, 2, 2, budget=budget).verdict, Proved)
    assert z3.is_int_value(se.M_term)
