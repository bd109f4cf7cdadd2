"""The plugin: one switch sets Hypothesis and the budgets, and it acts only when asked.

The subprocess tests run pytest in a fresh directory, as a user would: the
suite from the installed package (``--pyargs kvstab.props``), and a project
of someone else's that merely has kvstab installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from kvstab.registry import load_scheduler
from kvstab.testing.pytest_plugin import BUDGETS, SELFTEST_MARK, AuditTarget, budget, hypothesis_profile


@pytest.mark.kvstab_selftest
def test_profile_sets_examples_and_horizons() -> None:
    b = budget()
    assert b is BUDGETS[b.profile]
    # the Hypothesis profile in force is the one the budget belongs to
    current = settings()  # a settings object takes the loaded profile's defaults
    assert current.max_examples == settings.get_profile(hypothesis_profile(b.profile)).max_examples == b.max_examples
    assert current.deadline is None
    # profiles grow in cost together: dev ≤ ci ≤ thorough in every dimension
    order = [BUDGETS["dev"], BUDGETS["ci"], BUDGETS["thorough"]]
    for field in ("max_examples", "max_requests", "max_M", "stateful_examples", "stateful_steps", "stat_slots",
                  "solver_rlimit", "shrink_seconds"):
        values = [getattr(x, field) for x in order]
        assert values == sorted(values), field


def test_audited_scheduler_is_what_its_spec_names(audited_scheduler: AuditTarget) -> None:
    # replay commands name the scheduler by spec: it must load the same rule
    assert load_scheduler(audited_scheduler.spec).name == audited_scheduler.scheduler.name


def _pytest(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("KVSTAB_PROFILE", "HYPOTHESIS_PROFILE", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=300,
    )


FOREIGN_CONFTEST = '''
import os
from hypothesis import settings
settings.register_profile("mine", max_examples=3)
settings.register_profile("ci", max_examples=7)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
'''
FOREIGN_TEST = '''
import os
from hypothesis import given, settings, strategies as st

def test_my_profile_is_in_force():
    want = {"mine": 3, "ci": 7}[os.environ["HYPOTHESIS_PROFILE"]]
    assert settings().max_examples == want
    assert settings.get_current_profile_name() == os.environ["HYPOTHESIS_PROFILE"]
    assert "kvstab-ci" not in settings._profiles  # kvstab registered nothing

@given(st.integers())
def test_runs(x):
    pass
'''


@pytest.mark.kvstab_selftest
@pytest.mark.parametrize("profile", ["mine", "ci"])
def test_another_project_keeps_its_own_profile(tmp_path: Path, profile: str) -> None:
    """A project with kvstab installed, its own profiles and HYPOTHESIS_PROFILE
    naming one of them (even one called ``ci``): kvstab's plugin stays out."""
    (tmp_path / "conftest.py").write_text(FOREIGN_CONFTEST, encoding="utf-8")
    (tmp_path / "test_theirs.py").write_text(FOREIGN_TEST, encoding="utf-8")
    run = _pytest(["-q", str(tmp_path)], tmp_path, HYPOTHESIS_PROFILE=profile)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "kvstab" not in run.stdout, run.stdout[-3000:]
    assert "2 passed" in run.stdout


@pytest.mark.kvstab_selftest
def test_scheduler_option_audits_that_scheduler_only(tmp_path: Path) -> None:
    """From an empty directory: the suite comes from the package, the self-tests
    are deselected with the reason in the report, the audit is of one scheduler."""
    run = _pytest(["--pyargs", "kvstab.props", "--scheduler", "reserve", "--collect-only", "-q"], tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    items = [line for line in run.stdout.splitlines() if "::" in line]
    assert items and all("[reserve" in line for line in items), items
    assert not any("howto" in line or "negative_control" in line or "strategies" in line for line in items)
    assert "kvstab: deselected" in run.stdout and f"({SELFTEST_MARK}): --scheduler given" in run.stdout


@pytest.mark.kvstab_selftest
def test_a_bad_profile_or_scheduler_is_one_line(tmp_path: Path) -> None:
    run = _pytest(["--pyargs", "kvstab.props", "--scheduler", "no-such-rule", "--collect-only", "-q"], tmp_path)
    assert run.returncode != 0 and "--scheduler no-such-rule" in run.stderr and "Traceback" not in run.stderr
    run = _pytest(["--pyargs", "kvstab.props", "--collect-only", "-q"], tmp_path, KVSTAB_PROFILE="nightly")
    assert run.returncode != 0 and "KVSTAB_PROFILE='nightly' is not a kvstab profile" in run.stderr
