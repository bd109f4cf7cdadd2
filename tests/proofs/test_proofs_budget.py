"""The total budget of a run: it ends with an honest ``Unknown``, never a hang, and says what ran."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvstab.cli import main
from kvstab.errors import InvalidArgument
from kvstab.proofs.encoding import Setting
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget, Status, progress_after, solve
from kvstab.proofs.verdicts import Proved, Unknown


def test_a_spent_budget_asks_no_query(tmp_path: Path) -> None:
    import z3

    b = Budget(total_s=1e-6, smt2_dir=tmp_path).started()
    time.sleep(0.01)
    ans = solve([z3.Int("x") > 0], b, "trivial")
    # sat if it had been asked: an unasked query is undecided, and says why
    assert ans.status is Status.UNKNOWN and "total budget of 1e-06 s spent" in ans.reason
    assert not list(tmp_path.iterdir())  # nothing was tried, so nothing is kept


def test_a_run_out_of_budget_is_unknown_and_says_what_to_change(tmp_path: Path) -> None:
    t0 = time.monotonic()
    rep = prove("lookahead", K=6, Q=4, budget=Budget(total_s=2.0, smt2_dir=tmp_path), setting=Setting())
    secs = time.monotonic() - t0
    assert isinstance(rep.verdict, Unknown), rep.verdict
    assert "not proved within the total budget of 2 s" in rep.verdict.reason
    assert "--total-timeout" in rep.verdict.reason and "--K 3" in rep.verdict.reason
    # the encoding of a phase is not interruptible, so the bound is the budget plus one phase's set-up
    assert secs < 30, secs


def test_the_budget_is_shared_and_a_quick_proof_is_unaffected(tmp_path: Path) -> None:
    groups: list[str] = []
    b = Budget(total_s=600.0, smt2_dir=tmp_path, progress=groups.append)
    rep = prove("current-fit", K=2, Q=2, budget=b, unbounded=False)
    assert isinstance(rep.verdict, Proved)
    branches = [f"1-induction: step [{n}], 2 goals" for n in ("holds", "preempts", "admits")]
    assert groups == ["1-induction at K = 2, Q = 2", *branches]
    # a started clock is not restarted by a later phase: every phase shares one deadline
    s1 = b.started()
    assert s1.deadline is not None and s1.started() is s1 and Budget().started().deadline is None


def test_progress_is_quiet_for_a_quick_run() -> None:
    lines: list[str] = []
    tell = progress_after(lines.append, after_s=60.0)
    tell("first")
    assert lines == []
    tell = progress_after(lines.append, after_s=0.0)
    tell("second")
    assert len(lines) == 1 and lines[0].endswith("second …") and lines[0].startswith("[")


def test_bad_total_budgets_are_refused() -> None:
    for bad in (0, -1.0, True, "10"):
        with pytest.raises(InvalidArgument, match="total_s"):
            Budget(total_s=bad)  # type: ignore[arg-type]


def test_cli_states_its_budget_and_refuses_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["prove", "--scheduler", "current-fit", "--total-timeout", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--total-timeout must be" in err and "Traceback" not in err
    assert main(["prove", "--scheduler", "current-fit", "--total-timeout", "30"]) == 0
    assert "budget 30 s in all" in capsys.readouterr().out


def test_the_earliest_finish_split_covers_and_a_split_that_does_not_is_not_a_pass(tmp_path: Path) -> None:
    import z3

    from kvstab.proofs.induction import _cover
    from kvstab.proofs.invariants import CaseSplit, earliest_first

    runs = [z3.Bool(f"r{k}") for k in range(4)]
    fs = [z3.Int(f"f{k}") for k in range(4)]
    good = CaseSplit(earliest_first(runs, fs), [z3.Not(z3.Or(*[c for _, c in earliest_first(runs, fs)]))])
    (ob,) = _cover(("split", good), Budget(smt2_dir=tmp_path))
    assert isinstance(ob.verdict, Proved)
    # drop one case: the states where request 2 finishes first are no longer covered
    cases = [c for c in earliest_first(runs, fs) if not c[0].endswith("slot 2")]
    bad = CaseSplit(cases, [z3.Not(z3.Or(*[c for _, c in cases]))])
    (ob,) = _cover(("split", bad), Budget(smt2_dir=tmp_path))
    assert not isinstance(ob.verdict, Proved)


def test_lookahead_is_proved_through_the_case_split(tmp_path: Path) -> None:
    rep = prove("lookahead", K=2, Q=2, budget=Budget(smt2_dir=tmp_path), unbounded=False)
    assert isinstance(rep.verdict, Proved), rep.verdict
    labels = [o.label() for o in rep.obligations]
    assert "cases projected memory fits: its cases" in labels
