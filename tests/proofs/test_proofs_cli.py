"""``kvstab prove`` end to end, and every refutation the suite ships replays."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
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
    assert main(["prove", "--scheduler", "current-fit", "--K", "2", "--Q", "2", "--bounded"]) == 0
    out = capsys.readouterr().out
    assert "verdict: Proved (1-induction)" in out
    assert "[admits] memory ≤ M in the slot" in out and "assuming at most K = 2" in out


def test_prove_is_unbounded_by_default_where_the_rule_allows(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["prove", "--scheduler", "current-fit"]) == 0
    out = capsys.readouterr().out
    assert "any number of requests" in out and "verdict: Proved (prefix-fold theorem" in out
    assert "assuming any number of active and queued requests (no K, no Q)" in out and "K = " not in out
    assert "loop invariant of fold 0: preempt_newest" in out
    # vllm-v1 with its block size, token budget and running cap, and lookahead (the projection form)
    args = ["prove", "--scheduler", "vllm-v1", "--block", "16", "--token-budget", "2048", "--max-num-seqs", "8", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unbounded"] is True and doc["verdict"] == "Proved" and doc["invariants"]
    assert "token budget = 2048" in doc["assumptions"] and not any("K = " in a for a in doc["assumptions"])
    assert main(["prove", "--scheduler", "lookahead"]) == 0
    assert "verdict: Proved (prefix-fold theorem, projection form" in capsys.readouterr().out
    # a rule outside the class says that its verdict is bounded
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    sys.modules.pop("proof_plugins", None)
    assert main(["prove", "--scheduler", "proof_plugins:RATIO_RESERVE", "--K", "2", "--Q", "1", "--bmc", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: not proved for every number of requests" in out and "assuming at most K = 2" in out


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
    assert main(["prove", "--scheduler", "reserve", "--K", "2", "--Q", "2", "--no-houdini", "--bmc", "2", "--bounded"]) == 3


def test_rlimit_that_z3_would_wrap_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["prove", "--scheduler", "current-fit", "--rlimit", str(2**32)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--rlimit must be at most 4294967295" in err and "Traceback" not in err


def test_smt2_dir_is_checked_before_solving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("x", encoding="utf-8")
    for bad in (afile / "under", "/proc/kvstab-cannot-create-here"):
        assert main(["prove", "--scheduler", "current-fit", "--smt2-dir", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--smt2-dir" in err and "folder" in err


def test_smt2_dir_keeps_every_obligation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["prove", "--scheduler", "current-fit", "--K", "2", "--Q", "1", "--bounded", "--smt2-dir", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    files = list(tmp_path.glob("*.smt2"))
    # one file per distinct query (a query asked twice is one certificate), each with z3's answer
    assert len(files) >= 15
    texts = [f.read_text(encoding="utf-8") for f in files]
    assert all(t.isascii() and re.search(r"^; z3: (sat|unsat)$", t, re.M) for t in texts)
    assert "verdict: Proved" in out


def test_declared_margin_below_the_proved_one_fails(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    sys.modules.pop("proof_plugins", None)
    args = ["prove", "--scheduler", "proof_plugins:MODEST_MARGIN", "--K", "3", "--Q", "2", "--M", "64", "--chunk", "8"]
    code = main(args + ["--margin", "--max-s", "16", "--max-o", "8"])
    out = capsys.readouterr().out
    assert code == 4, out
    assert "FAILED: the declared margin 5 is smaller than the proved Δ = 23" in out


def _prove_json(*extra: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "kvstab.cli", "prove", *extra, "--json"], capture_output=True, text=True, check=False
    )
    doc = json.loads(out.stdout)
    doc.pop("timings")
    return doc


def test_the_same_prove_gives_the_same_json_every_run() -> None:
    args = ("--scheduler", "current-fit-no-preempt", "--K", "3", "--Q", "2", "--bmc", "3", "--claims")
    runs = [_prove_json(*args) for _ in range(3)]
    assert runs[0]["verdict"] == "Refuted"
    assert runs[0] == runs[1] == runs[2]


def _wait_for_cpu(pid: int, cpu_s: float, wall_s: float) -> None:
    """Until process ``pid`` has used ``cpu_s`` CPU seconds (``/proc``), or ``wall_s`` have passed."""
    stat = Path(f"/proc/{pid}/stat")
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    end = time.monotonic() + wall_s
    while time.monotonic() < end:
        if not stat.exists():  # no /proc: a fixed wait
            time.sleep(min(10.0, wall_s))
            return
        fields = stat.read_text().rsplit(")", 1)[1].split()
        if (int(fields[11]) + int(fields[12])) / tick >= cpu_s:
            return
        time.sleep(0.2)


def test_ctrl_c_stops_the_solver_with_one_line() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstab.cli", "prove", "--scheduler", "lookahead", "--bounded", "--K", "12", "--Q", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # into the solving (the K = 12 bounded queries take minutes; unbounded, lookahead takes 0.2 s): past
    # the imports, which on a loaded machine can take longer than any fixed sleep
    _wait_for_cpu(proc.pid, 3.0, wall_s=60.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    # progress lines (a run past 3 s names each obligation group) are not the error
    lines = [ln for ln in err.splitlines() if not ln.startswith("kvstab prove: [")]
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err


def test_cvc5_confirms_the_built_ins_obligations(tmp_path: Path) -> None:
    """Every obligation z3 decided for the built-ins (unbounded and bounded
    induction, the claims for any number of requests and the bounded ones) is
    re-checked from its SMT-LIB file by cvc5."""
    import cvc5

    from kvstab.proofs.claims import prove_claims
    from kvstab.proofs.unbounded import prove_unbounded

    b = Budget(smt2_dir=tmp_path, keep_all=True)
    # the unbounded theorems' obligations with blocks, a token budget and a running cap too
    prove_unbounded(load_scheduler("vllm-v1"), Setting(block=16, token_budget=2048, max_num_seqs=8), b)
    for name in ("current-fit", "reserve", "lookahead", "vllm-v1", "current-fit-no-preempt"):
        sched = load_scheduler(name)
        prove_unbounded(sched, Setting(), b)
        check_inductive(sched, Setting(), 2, 1, budget=b, spec=name)
        claims = prove_claims(sched, Setting(), budget=b)
        assert all(c.scope == "any number of requests" for c in claims.claims), name
    # the claims for any number of requests with grants, a budget and a cap, and the bounded claims
    prove_claims(load_scheduler("vllm-v1"), Setting(block=16, token_budget=2048, max_num_seqs=8), budget=b)
    prove_claims(load_scheduler("current-fit"), Setting(), K=2, Q=2, budget=b, unbounded=False)
    files = sorted(tmp_path.glob("*.smt2"))
    # the claims' obligations for any number of requests, and the bounded ones, are among them
    for kind in ("unbounded-claim_fcfs", "unbounded-claim_two_copies", "unbounded-claim_oldest", "claim-admissions"):
        assert any(f.name.startswith(kind) for f in files), kind
    checked = 0
    for f in files:
        text = f.read_text(encoding="utf-8")
        want = re.search(r"^; z3: (sat|unsat)$", text, re.M)
        if want is None:
            continue
        tm = cvc5.TermManager()
        solver = cvc5.Solver(tm)
        # a query cvc5 cannot decide fails the test by its name, in seconds, instead of hanging it
        solver.setOption("tlimit-per", "30000")
        parser = cvc5.InputParser(solver)
        parser.setStringInput(cvc5.InputLanguage.SMT_LIB_2_6, text, f.name)
        answers = []
        while not (cmd := parser.nextCommand()).isNull():
            if said := cmd.invoke(solver, parser.getSymbolManager()).strip():
                answers.append(said)
        assert answers == [want.group(1)], f.name
        checked += 1
    assert checked > 50


def test_ctrl_c_inside_the_guard_only_sets_a_flag_that_the_next_query_honours() -> None:
    """Within ``ctrl_c_stops_solving`` a SIGINT raises nothing where it lands (inside z3's
    Python API it could corrupt z3's bookkeeping); the next query stops the run instead."""
    import os

    import z3

    from kvstab.proofs.solver import Budget, Interrupted, ctrl_c_stops_solving, solve

    x = z3.Int("x")
    with ctrl_c_stops_solving():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs at the next bytecode: no KeyboardInterrupt here
        with pytest.raises(Interrupted, match="interrupted .Ctrl-C. before solving 'q'"):
            solve([x > 0], Budget(), "q")
    assert solve([x > 0], Budget(), "q").status.value == "sat"  # the flag does not outlive the block


def test_with_claims_the_invariant_leaves_the_claims_their_share_of_the_budget() -> None:
    """A long bounded flow used to spend the whole total budget and leave every claim Unknown."""
    from kvstab.cli.prove import CLAIMS_RESERVE_S

    whole = Budget(total_s=100.0).started()
    first = whole.keeping(CLAIMS_RESERVE_S)
    left_whole, left_first = whole.left(), first.left()
    assert left_whole is not None and left_first is not None
    assert abs((left_whole - left_first) - CLAIMS_RESERVE_S) < 0.5 and first.deadline == whole.deadline
    assert "less 20 s kept for the declared claims" in first.spent_reason() and "kept" not in whole.spent_reason()


def test_claims_say_their_scope(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["prove", "--scheduler", "current-fit", "--claims", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["bounds"] for c in doc["claims"]] == ["any number of requests"] * 5
    assert all(c["verdict"] == "Proved" and c["facts"] and c["obligations"] for c in doc["claims"])
    assert not any("K =" in a or "K ≤" in a for c in doc["claims"] for a in c["assumptions"])
    # outside the class: every claim bounded, the reason said once, and a refutation with its pair
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    sys.modules.pop("proof_plugins", None)
    args = ["prove", "--scheduler", "proof_plugins:SHORTEST_TOTAL_FIRST", "--K", "2", "--Q", "2", "--bmc", "2", "--claims"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "declared claims: 0 for any number of requests, 4 bounded (K ≤ 2, Q ≤ 2)" in out
    assert out.count("bounded because: outside the prefix-fold class: tests/proofs/proof_plugins.py:") == 1
    assert "claim non-clairvoyant: Refuted" in out and "[K ≤ 2, Q ≤ 2]" in out and "replay 2: kvstab replay" in out
