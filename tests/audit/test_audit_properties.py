"""The property section runs the Hypothesis suite in process, for the scheduler
under audit, and a failing property fails the section."""

from __future__ import annotations

import shlex

from kvstab.audit.properties import finding, props_dir, run_properties, short_name
from kvstab.cli import main


def test_suite_is_found_and_runs_for_the_named_scheduler() -> None:
    assert props_dir() is not None
    res = run_properties("current-fit", "dev", select="audited_scheduler_is_what_its_spec_names")
    assert res.status == "passed" and res.passed == 1, res


def test_a_broken_scheduler_fails_the_section_with_a_finding_that_reproduces() -> None:
    # releases memory a slot early: the per-slot properties catch it at once
    res = run_properties("mutants.release_early:SCHEDULER", "dev", select="p1-memory")
    assert res.status == "failed" and res.failed, res
    assert "p1-memory" in res.summary and "::" not in res.summary
    (f,) = res.findings or ()
    assert f.error == "PropertyViolation" and f.message.startswith("property 1 (memory invariant) violated")
    assert f.workload.startswith("1 request") or "(slot, s, o)" in f.workload
    # the finding's own command shows the violation again: `kvstab check` exits 1
    argv = shlex.split(f.audit)
    assert argv[:2] == ["kvstab", "check"] and "--property" in argv
    assert main(argv[1:]) == 1


def test_findings_are_read_from_a_report() -> None:
    report = "\n".join([
        "    def check(scenario) -> None:",
        "E   kvstab.testing.checks.PropertyViolation: property 8 (liveness after arrivals stop) violated by scheduler 'x:R'",
        "E     workload: 1 request(s), (slot, s, o) = [(0, 10, 1)]",
        "E     replay:   kvstab replay --scheduler x:R --M 11 --chunk 11 --requests 0:10:1",
        "E     audit:    kvstab check --scheduler x:R --M 11 --chunk 11 --requests 0:10:1 --property 8",
    ])
    f = finding("props/test_props_slots.py::test_property[x:R-p8-liveness]", report)
    assert f.message.startswith("property 8 (liveness") and f.error == "PropertyViolation"
    assert f.replay.endswith("0:10:1") and f.audit.endswith("--property 8")
    g = finding("t::test_x", "E   AssertionError: boom\nE   assert 1 == 2")
    assert (g.error, g.message, g.replay) == ("AssertionError", "boom", "")
    # anything else: the last error line, never an empty message
    h = finding("t::test_y", "E   where x = 3\nE   assert 1 == 2\n")
    assert h.message == "assert 1 == 2"
    assert short_name("props/test_props_slots.py::test_property[pkg.mod-x:R-p6-drift-margin]") == "p6-drift-margin"
    assert short_name("props/test_props_stateful.py::test_stateful_machine[x:R]") == "stateful machine"


def test_a_scheduler_no_spec_loads_is_not_a_pass() -> None:
    assert run_properties(None, "dev").status == "unavailable"
