"""``kvstab audit`` end to end: the report, the verdict and exit status, bad input."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from _audit_support import SMALL

from kvstab.audit.audit import SCHEMA_VERSION, AuditConfig, AuditResult, Check
from kvstab.audit.profiles import PROFILES
from kvstab.cli import main
from kvstab.model import ModelParams

REPORT_FILES = ["report.md", "report.html", "report.json", "report.tex",
                "throughput.png", "queue.png", "memory.png", "waste.png"]


def test_audit_writes_every_report_and_fails_an_unmet_gate(small_audit: tuple[int, Path, dict[str, Any]]) -> None:
    code, out, data = small_audit
    for name in REPORT_FILES:
        assert (out / name).stat().st_size > 0, name
    assert data["schema"] == SCHEMA_VERSION
    # λ* is far below the 1000 req/s the gate asks for: FAIL, exit 1
    assert code == 1 and data["verdict"] == "FAIL" and data["exit_status"] == 1
    status = {c["name"]: c["status"] for c in data["checks"]}
    assert status["gate --require-rate"] == "fail"
    assert status["memory invariant"] == "pass"
    assert status["properties"] == "skipped"
    mu = data["theory"]["mu_per_s"]
    for name in ("vllm-v1", "current-fit"):
        st = data["stability"][name]
        lo, hi = st["critical_rate_ci_per_s"]
        assert lo <= st["critical_rate_per_s"] <= hi <= mu * (1 + PROFILES["dev"].tolerance)
        for ev in st["search"] + st["grid"] + [st["overload"]]:
            assert 0 <= ev["memory_utilisation"] <= 1 and 0 <= ev["waste_fraction"] < 1
    # the same numbers in every format
    md = (out / "report.md").read_text()
    assert f"{data['stability']['vllm-v1']['critical_rate_per_s']:.5g}" in md
    # the invariant's scope as the audit found it, in the report's words too
    assert f"memory invariant (any M, {data['proofs']['invariant']['scope']})" in md
    assert "\\section{" in (out / "report.tex").read_text()


def test_html_report_is_self_contained(small_audit: tuple[int, Path, dict[str, Any]]) -> None:
    html = (small_audit[1] / "report.html").read_text()
    assert html.count("src='data:image/png;base64,") == 4
    # nothing fetched from anywhere: no external src/href
    assert not re.search(r"(src|href)=['\"](?!data:)", html)


def _result(checks: list[Check], strict: bool = False, complete: bool = True) -> AuditResult:
    cfg = AuditConfig("current-fit", ModelParams(M=64, chunk=8, bbar=1.0), "s=U(1,8),o=U(1,8)", strict=strict)
    return AuditResult(cfg, checks=checks, complete=complete)


def test_unknown_never_passes() -> None:
    unknown = [Check("memory invariant", "unknown", "Unknown"), Check("properties", "pass", "")]
    assert _result(unknown).verdict == "INCONCLUSIVE" and _result(unknown).exit_status == 0
    assert _result(unknown, strict=True).exit_status == 3
    skipped = [Check("properties", "skipped", ""), Check("memory invariant", "pass", "")]
    assert _result(skipped).verdict == "INCONCLUSIVE" and _result(skipped).exit_status == 0
    assert _result(skipped, strict=True).exit_status == 3
    assert _result([Check("memory invariant", "pass", ""), Check("theory", "info", "")]).verdict == "PASS"
    assert _result([Check("memory invariant", "fail", "Refuted")]).exit_status == 1
    # the partial report of an audit cut short never says PASS
    assert _result([Check("memory invariant", "pass", "")], complete=False).verdict == "INCOMPLETE"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--scheduler", "no-such-scheduler"], "unknown scheduler"),
        (["--scheduler", "current-fit", "--workload", "s=U(1,"], "does not parse"),
        (["--scheduler", "current-fit", "--baseline", "nope"], "unknown scheduler"),
        (["--scheduler", "current-fit", "--M", "-3"], "M (KV capacity"),
        (["--scheduler", "current-fit", "--profile", "fast"], "invalid choice"),
        (["--scheduler", "current-fit", "--M", "16", "--workload", "s=const(30),o=const(4)"], "raise --M to at least 34"),
        (["--scheduler", "current-fit", "--M", "40", "--workload", "s=U(1,30),o=U(1,30)"], "raise --M to at least 60"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["audit", *args, "--out", str(tmp_path / "r"), "--quiet", "--skip", "proofs",
                     "--skip", "properties"])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "r" / "report.json").exists()


def test_unwritable_out_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code = main(["audit", "--scheduler", "current-fit", *SMALL, "--out", str(blocker / "report")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--out" in err and "writable" in err, err


def test_json_flag_prints_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "--scheduler", "reserve", "--baseline", "none", "--M", "40", "--chunk", "4", "--bbar", "1",
                 "--workload", "s=const(4),o=const(4)", "--profile", "dev", "--skip", "proofs", "--skip", "properties",
                 "--require-rate", "0.9", "--out", str(tmp_path), "--quiet", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads((tmp_path / "report.json").read_text())
    # the exact saturated rate is 1 req/s: the gate at 0.9 holds (skipped sections: not a PASS)
    assert code == 0 and data["verdict"] == "INCONCLUSIVE", data["checks"]
    assert {c["name"]: c["status"] for c in data["checks"]}["gate --require-rate"] == "pass"
    lo, hi = data["stability"]["reserve"]["critical_rate_ci_per_s"]
    assert lo <= 1.0 <= hi


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_scheduler_that_overflows_in_the_audits_simulations_fails_the_audit(
    workers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Breaking the memory invariant in the stability runs is a FAIL (exit 1) with the violation —
    not bad input — also when the violation comes back from a worker process."""
    code = main(["audit", "--scheduler", "current-fit-no-preempt", *SMALL, "--profile", "dev", "--skip", "proofs",
                 "--skip", "properties", "--baseline", "none", "--workers", workers, "--quiet",
                 "--out", str(tmp_path / "out")])
    assert code == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "FAIL"
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed and "InvariantViolation" in failed[0]["detail"] and "M=" in failed[0]["detail"]
    if workers == "1":
        # run in process, the violation comes with the line that replays it: the same slot breaks again
        line = failed[0]["replay_command"]
        assert line.startswith("kvstab replay --scheduler current-fit-no-preempt "), line
        capsys.readouterr()
        assert main(shlex.split(line)[1:]) == 1
        slot = re.search(r"slot (\d+)", failed[0]["detail"])
        assert slot is not None and f"VIOLATION reproduced: slot {slot.group(1)}:" in capsys.readouterr().out
