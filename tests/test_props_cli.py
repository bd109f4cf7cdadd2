"""``kvstab props`` runs the installed suite from any directory and exits with its verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def props(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KVSTAB_PROFILE", "HYPOTHESIS_PROFILE")}
    env["PYTHONPATH"] = str(TESTS)  # for the mutants
    return subprocess.run([sys.executable, "-m", "kvstab.cli.props", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_sound_scheduler_passes_and_a_mutant_fails(tmp_path: Path) -> None:
    ok = props(["--scheduler", "reserve", "--profile", "dev", "--", "-q", "-p", "no:cacheprovider", "-k", "p1"], tmp_path)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert "passed" in ok.stdout and "failed" not in ok.stdout
    bad = props(["--scheduler", "mutants.reserve_peak_off_by_one:SCHEDULER", "--profile", "ci", "--", "-q", "-x",
                 "-p", "no:cacheprovider", "-k", "p1-memory"], tmp_path)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-2000:]
    assert "property 1 (memory invariant) violated" in bad.stdout
    assert "kvstab check --scheduler mutants.reserve_peak_off_by_one:SCHEDULER" in bad.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = props(["--profile", "nightly"], tmp_path)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "not a kvstab profile" in run.stderr
    run = props(["--scheduler", "no-such-rule", "--", "-p", "no:cacheprovider"], tmp_path)
    assert run.returncode == 2 and "--scheduler no-such-rule" in run.stderr and "Traceback" not in run.stderr


def test_pytest_pyargs_says_a_bad_scheduler_in_one_line_with_pytests_usage_status(tmp_path: Path) -> None:
    """Under plain ``pytest --pyargs kvstab.props`` a bad ``--scheduler`` is pytest's usage error (status 4,
    as docs/props.md says), one ``ERROR:`` line before collection, no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("KVSTAB_PROFILE", "HYPOTHESIS_PROFILE")}
    run = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "kvstab.props", "-p", "no:cacheprovider",
                          "--scheduler", "not_here_xyz:SCHEDULER"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    err = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 4 and len(err) == 1 and err[0].startswith("ERROR: --scheduler not_here_xyz"), run.stderr
    assert "Traceback" not in run.stdout + run.stderr
