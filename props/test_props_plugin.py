"""The plugin's one switch: the profile in force sets Hypothesis and the budgets."""

from __future__ import annotations

from hypothesis import settings

from kvstab.pytest_plugin import BUDGETS, AuditTarget, budget
from kvstab.registry import load_scheduler


def test_profile_sets_examples_and_horizons() -> None:
    b = budget()
    assert b is BUDGETS[b.profile]
    # the Hypothesis profile in force is the one the budget belongs to
    current = settings()  # a settings object takes the loaded profile's defaults
    assert current.max_examples == settings.get_profile(b.profile).max_examples == b.max_examples
    assert current.deadline is None
    # profiles grow in cost together: dev ≤ ci ≤ thorough in every dimension
    order = [BUDGETS["dev"], BUDGETS["ci"], BUDGETS["thorough"]]
    for field in ("max_examples", "max_requests", "max_M", "stateful_examples", "stateful_steps", "stat_slots"):
        values = [getattr(x, field) for x in order]
        assert values == sorted(values), field


def test_audited_scheduler_is_what_its_spec_names(audited_scheduler: AuditTarget) -> None:
    # replay commands name the scheduler by spec: it must load the same rule
    assert load_scheduler(audited_scheduler.spec).name == audited_scheduler.scheduler.name
