"""The suite must catch a real bug: the negative control ``current-fit-no-preempt``.

It is excluded from the default audit and exercised here instead: the audit
must fail on it, Hypothesis must shrink the failure to a few requests, and
both printed one-line commands must reproduce the violation.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings

from kvstab.cli import main as cli_main
from kvstab.contract import traits_of
from kvstab.registry import builtin_names, load_scheduler
from kvstab.replay import parse_requests, replay
from kvstab.testing.checks import PropertyViolation, audit_plan
from kvstab.testing.pytest_plugin import Budget, audit_targets
from kvstab.testing.strategies import scenarios

#: a self-test of the suite: deselected when auditing one scheduler (``--scheduler``)
pytestmark = pytest.mark.kvstab_selftest

NEGATIVE = "current-fit-no-preempt"


def test_negative_control_is_excluded_from_the_default_audit() -> None:
    sched = load_scheduler(NEGATIVE)
    assert traits_of(sched).negative_control is True
    default = [t.spec for t in audit_targets([])]
    assert NEGATIVE not in default
    assert sorted(default) == sorted(builtin_names(include_negative=False))
    assert {"current-fit", "reserve", "lookahead"} <= set(default)


def shrunk_failure(props_budget: Budget) -> PropertyViolation:
    """Run the full audit on the negative control and return the shrunk failure."""
    sched = load_scheduler(NEGATIVE)

    @settings(max_examples=max(100, props_budget.max_examples), report_multiple_bugs=False)
    @given(scenario=scenarios(max_M=props_budget.max_M, max_size=props_budget.max_requests))
    def audit(scenario: tuple) -> None:
        params, plan = scenario
        audit_plan(sched, params, plan, spec=NEGATIVE)

    with pytest.raises(PropertyViolation) as info:
        audit()
    return info.value


def test_negative_control_fails_small_and_replayable(props_budget: Budget, capsys: pytest.CaptureFixture[str]) -> None:
    exc = shrunk_failure(props_budget)
    # the bug is an overflow of M, and shrinking leaves only a few requests
    assert exc.prop == 1, str(exc)
    assert 1 <= len(exc.requests) <= 3, f"not shrunk to a few requests: {exc.requests}"
    assert exc.replay in str(exc) and exc.audit in str(exc)

    # the replay command, run as the CLI runs it, reproduces the overflow
    argv = shlex.split(exc.replay)
    assert argv[:2] == ["kvstab", "replay"]
    capsys.readouterr()
    assert cli_main(argv[1:]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION reproduced" in out and f"M={exc.params.M}" in out

    # ... in the same slot the audit reported
    plan = parse_requests(",".join(f"{a}:{b}:{c}" for a, b, c in exc.requests))
    outcome = replay(NEGATIVE, exc.params, plan)
    assert outcome.violation is not None and outcome.violation.slot == exc.slot

    # the check command names the same property
    argv = shlex.split(exc.audit)
    assert argv[:2] == ["kvstab", "check"]
    assert cli_main(argv[1:]) == 1
    assert "property 1 (memory invariant) violated" in capsys.readouterr().out
