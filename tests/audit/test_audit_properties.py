"""The property section runs the Hypothesis suite in process, for the scheduler
under audit, and a failing property fails the section."""

from __future__ import annotations

from kvstab.audit.properties import props_dir, run_properties


def test_suite_is_found_and_runs_for_the_named_scheduler() -> None:
    assert props_dir() is not None
    res = run_properties("current-fit", "dev", select="audited_scheduler_is_what_its_spec_names")
    assert res["status"] == "passed" and res["passed"] == 1, res


def test_a_broken_scheduler_fails_the_section() -> None:
    # releases memory a slot early: the per-slot properties catch it at once
    res = run_properties("mutants.release_early:SCHEDULER", "dev", select="p1-memory")
    assert res["status"] == "failed" and res["failed"], res


def test_a_scheduler_no_spec_loads_is_not_a_pass() -> None:
    assert run_properties(None, "dev")["status"] == "unavailable"
