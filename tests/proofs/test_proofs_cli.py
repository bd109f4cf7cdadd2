"""``kvstab prove`` end to end, and every refutation the suite ships replays."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from kvstab.cli import main
from kvstab.proofs.encoding import Setting
from kvstab.proofs.induction import check_inductive
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
from kvstab.proofs.verdicts import Refuted
from kvstab.registry import load_scheduler

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def test_prove_current_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prove", "--scheduler", "current-fit", "--K", "2", "--Q", "2"]) == 0
    out = capsys.readouterr().out
    assert "verdict: Proved (1-induction)" in out
    assert "[admits] memory ≤ M in the slot" in out and "assuming at most K = 2" in out


def test_prove_negative_control_prints_the_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prove", "--scheduler", "current-fit-no-preempt", "--K", "2", "--Q", "2", "--bmc", "3"]) == 1
    out = capsys.readouterr().out
    assert "verdict: Refuted (reachable)" in out and "simulator: reproduced" in out
    cmd = next(line.split("replay: ", 1)[1] for line in out.splitlines() if line.strip().startswith("replay: kvstab"))
    # the printed command reproduces the violation through the CLI
    assert main(shlex.split(cmd)[1:]) == 1
    assert "VIOLATION reproduced" in capsys.readouterr().out


def test_prove_json_with_margin(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "prove",
            "--scheduler",
            "current-fit",
            "--K",
            "3",
            "--Q",
            "2",
            "--M",
            "64",
            "--chunk",
            "8",
            "--margin",
            "--max-s",
            "16",
            "--max-o",
            "8",
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["verdict"] == "Proved"
    assert data["margin"]["delta"] == data["margin"]["declared"] == 23
    assert all("check" in o and "seconds" not in o for o in data["obligations"])
    # every wall-clock figure sits in the one timings field
    assert len(data["timings"]["obligations_s"]) == len(data["obligations"])


def test_bad_inputs_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["prove", "--scheduler", "no_such_module:thing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import scheduler module 'no_such_module'" in err
    monkeypatch.syspath_prepend(str(PLUGINS))
    sys.modules.pop("sample_plugins", None)
    assert main(["prove", "--scheduler", "sample_plugins:BRANCHES", "--K", "2", "--Q", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "if w.s < 10" in err and "ite" in err
    assert main(["prove", "--scheduler", "current-fit", "--margin"]) == 2
    assert "--margin needs a fixed --M" in capsys.readouterr().err
    assert main(["prove", "--scheduler", "current-fit", "--strengthen", "no such conjunct"]) == 2


def test_every_shipped_refutation_replays(tmp_path: Path) -> None:
    """The refutations the suite reports for the built-ins — the negative
    control's reachable run and the counterexamples to induction of the
    unstrengthened invariants — all reproduce in the simulator."""
    se, b = Setting(), Budget(smt2_dir=tmp_path)
    traces = []
    rep = prove("current-fit-no-preempt", K=2, Q=2, bmc_depth=4, setting=se, budget=b)
    assert isinstance(rep.verdict, Refuted)
    traces.append(rep.verdict.trace)
    for name in ("current-fit-no-preempt", "reserve", "lookahead"):
        r = check_inductive(load_scheduler(name), se, 2, 1, budget=b, spec=name, fail_fast=True)
        assert isinstance(r.verdict, Refuted)
        traces.append(r.verdict.trace)
    for tr in traces:
        assert tr is not None and tr.replayed, tr.replay_message
        assert tr.violation_memory > tr.M
        assert tr.replay_command.startswith("kvstab replay --scheduler ")
        # and the printed command reproduces it through the CLI
        assert main(shlex.split(tr.replay_command)[1:]) == 1


def _admitted_peaks_fit(state, setting):  # type: ignore[no-untyped-def]
    """The issue's example strengthening for reserve: Σ(s + o) ≤ M over admitted requests."""
    import z3

    return z3.Sum([z3.If(e.present, e.s + e.o, 0) for e in state.active] + [z3.IntVal(0)]) <= setting.M_term


ADMITTED_PEAKS = _admitted_peaks_fit


def test_user_supplied_strengthening_by_module_attr(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "prove",
            "--scheduler",
            "reserve",
            "--K",
            "2",
            "--Q",
            "2",
            "--no-houdini",
            "--strengthen",
            f"{__name__}:ADMITTED_PEAKS",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"strengthened by: {__name__}:ADMITTED_PEAKS" in out
    # without it (and without Houdini) the base invariant is not inductive
    assert main(["prove", "--scheduler", "reserve", "--K", "2", "--Q", "2", "--no-houdini", "--bmc", "2"]) == 3
