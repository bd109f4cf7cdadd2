"""The Hypothesis property suite, run in process for one scheduler.

The same checks as ``pytest --pyargs kvstab.props --scheduler SPEC`` (or
``kvstab props``) at the profile asked for: :func:`run_properties` is the one
place the audit runs the suite, which is installed with kvstab as the package
``kvstab.props``.  If it cannot be imported the result is ``unavailable``,
which never passes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstab.jsonform import JsonRecord, record_json

__all__ = [
    "run_properties", "props_dir", "finding", "findings_of", "violation_replay", "short_name", "Finding",
    "PropertiesSection",
]


@dataclass(frozen=True, slots=True)
class Finding(JsonRecord):
    """What one failed property test found, and the lines that show it again (empty where its report has none)."""

    test: str = field(metadata={"help": "the test's pytest node id"})
    error: str = field(default="", metadata={"help": "the exception's class name"})
    message: str = field(default="", metadata={"help": "the exception's one-line message"})
    workload: str = field(default="", metadata={"help": "the workload that breaks the property"})
    replay: str = field(default="", metadata={"help": "the kvstab replay line that reproduces it"})
    audit: str = field(default="", metadata={"help": "the kvstab check line that reproduces it"})

    @property
    def replay_command(self) -> str | None:
        """The one line the audit prints for this failure: the ``kvstab check`` line, else the
        ``kvstab replay`` line (``None`` where the report has neither)."""
        return self.audit or self.replay or None

    def to_json(self) -> dict[str, Any]:
        """The record's fields, then ``replay_command`` (as every failure in ``report.json`` has it)."""
        return {**record_json(self), "replay_command": self.replay_command}


@dataclass(frozen=True, slots=True)
class PropertiesSection(JsonRecord):
    """The properties section: the suite's outcome for one scheduler.  A suite that could not
    run (``unavailable``) has no findings, counts, exit code nor profile; its JSON leaves them out."""

    status: str = field(metadata={"help": "passed, failed, error or unavailable (only passed passes)"})
    summary: str = field(metadata={"help": "one line for the verdict table"})
    passed: int = field(default=0, metadata={"help": "property tests passed"})
    failed: tuple[str, ...] = field(default=(), metadata={"help": "node ids of the failed tests"})
    findings: tuple[Finding, ...] | None = field(default=None, metadata={"json": "optional", "help": "one per failure"})
    skipped: int | None = field(default=None, metadata={"json": "optional", "help": "tests skipped"})
    details: tuple[str, ...] | None = field(
        default=None, metadata={"json": "optional", "help": "the first failures' reports (their last 2000 characters)"}
    )
    exit_code: int | None = field(default=None, metadata={"json": "optional", "help": "pytest's exit status"})
    seconds: float = field(default=0.0, metadata={"help": "wall-clock seconds"})
    profile: str | None = field(default=None, metadata={"json": "optional", "help": "the profile it ran at"})


def props_dir() -> Path | None:
    """The installed property suite's folder (``kvstab.props``), or ``None`` if this install has none."""
    spec = importlib.util.find_spec("kvstab.props")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations)))
    return d if (d / "conftest.py").is_file() else None


#: a failure's own lines that say what broke and how to see it again (kvstab.testing.checks.PropertyViolation's
#: message, then its ``workload:``, ``replay:`` and ``audit:`` lines)
_VIOLATION = re.compile(r"^E\s+(?:[\w.]+\.)?(PropertyViolation|InvariantViolation|InvalidScheduler|\w+Error): (.*)$")
_CONTEXT = re.compile(r"^E\s+(workload|replay|audit):\s+(.*)$")


def finding(nodeid: str, longrepr: str) -> Finding:
    """What one failed property test found, from its report: the test, the
    exception's one-line message, and the workload and the ``kvstab replay`` /
    ``kvstab check`` lines that reproduce it (empty where the report has none)."""
    out = {"test": nodeid, "error": "", "message": "", "workload": "", "replay": "", "audit": ""}
    for line in longrepr.splitlines():
        if not out["message"] and (m := _VIOLATION.match(line)):
            out["error"], out["message"] = m.group(1), m.group(2).strip()
        elif out["message"] and (c := _CONTEXT.match(line)) and not out[c.group(1)]:
            out[c.group(1)] = c.group(2).strip()
    if not out["message"]:  # not one of kvstab's findings: the last 'E' line says what went wrong
        errs = [ln[1:].strip() for ln in longrepr.splitlines() if ln.startswith("E ") and ln[1:].strip()]
        out["message"] = errs[-1] if errs else "(no message)"
    return Finding(**out)


_LINE = re.compile(r"^\s*(workload|replay|audit):\s+(.*)$")
#: a report's own lines: the error lines (``E …``) and the ``path:line: Error`` locations, never the source around them
_KEPT = re.compile(r"^(E\s|\S+:\d+: \w)")


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside a group (Hypothesis raises one when it finds several distinct failures), flattened."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def findings_of(nodeid: str, longrepr: str, exc: BaseException | None, spec: str | None) -> list[Finding]:
    """What one failed test found: one :class:`Finding` per failure it raised (each member of a
    group keeps its own message and lines), read from the exception itself where kvstab raised it —
    a :class:`~kvstab.testing.checks.PropertyViolation` carries its lines, an
    :class:`~kvstab.errors.InvariantViolation` of a simulation gets a ``kvstab replay`` line
    (:func:`violation_replay`) — else from the report's text (:func:`finding`)."""
    from kvstab.errors import InvariantViolation
    from kvstab.testing.checks import PropertyViolation

    out: list[Finding] = []
    leaves = [] if exc is None else _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, PropertyViolation):
            head, *rest = str(leaf).splitlines()
            lines = {m.group(1): m.group(2).strip() for ln in rest if (m := _LINE.match(ln))}
            out.append(Finding(nodeid, "PropertyViolation", head.strip(), lines.get("workload", ""),
                               leaf.replay, leaf.audit))
        elif isinstance(leaf, InvariantViolation):
            replay, workload = violation_replay(leaf, spec)
            out.append(Finding(nodeid, type(leaf).__name__, str(leaf).splitlines()[0].strip(), workload, replay))
        elif len(leaves) > 1:
            text = str(leaf).strip().splitlines()
            out.append(Finding(nodeid, type(leaf).__name__, text[0] if text else "(no message)"))
    return out or [finding(nodeid, longrepr)]


def violation_replay(exc: BaseException, spec: str | None) -> tuple[str, str]:
    """The ``kvstab replay`` line (and the workload, in words) that shows an
    :class:`~kvstab.errors.InvariantViolation` raised inside a simulation again.

    The run is read from the frame of :func:`kvstab.engine.run` (or
    :func:`kvstab.simulator.simulate`) the violation passed through: its server,
    arrivals and window.  The arrivals after the breaking slot cannot change it and
    are left out, and of the rest the shortest prefix (from the requests that were
    running) whose replay on the reference engine breaks the same slot with the same
    memory is kept.  ``("", "")`` where no such run is found or nothing loads ``spec``."""
    from kvstab.arrivals import ArrivalPlan, fixed_arrivals
    from kvstab.engine import driver
    from kvstab.errors import InvariantViolation
    from kvstab.model import ModelParams
    from kvstab.registry import load_scheduler
    from kvstab.replay import replay, replay_command
    from kvstab.simulator import simulate

    if spec is None or not isinstance(exc, InvariantViolation):
        return "", ""
    runs = (driver.run.__code__, simulate.__code__)
    tb = exc.__traceback__
    found = None
    while tb is not None and found is None:
        loc = tb.tb_frame.f_locals
        if (tb.tb_frame.f_code in runs and isinstance(loc.get("plan"), ArrivalPlan)
                and isinstance(loc.get("params"), ModelParams) and loc.get("lifecycle", "kvstab") == "kvstab"):
            found = (loc["params"], loc["plan"], int(loc.get("window", 8)))
        tb = tb.tb_next
    if found is None:
        return "", ""
    params, plan, window = found
    rows = [(int(t), int(a), int(b)) for t, a, b in zip(plan.slot, plan.s, plan.o) if t <= exc.slot]
    try:
        sched = load_scheduler(spec)
    except Exception:  # the spec no longer loads: no line rather than a wrong one
        return "", ""
    k = min(len(rows), max(exc.requests, default=0) + 1)
    while True:
        got = replay(sched, params, fixed_arrivals(rows[:k]), slots=exc.slot + 1, window=window, spec=spec).violation
        if got is not None and (got.slot, got.memory) == (exc.slot, exc.memory):
            shown = rows[:k]
            return (replay_command(spec, params, shown, window=window),
                    f"{len(shown)} request(s) arriving in slots {shown[0][0]}–{shown[-1][0]}" if shown else "")
        if k >= len(rows):
            return "", ""
        k = min(len(rows), 2 * k)


def short_name(nodeid: str) -> str:
    """A property test's name without its file and scheduler:
    ``props/test_props_slots.py::test_property[x:R-p6-drift-margin]`` → ``p6-drift-margin``."""
    name = nodeid.rsplit("::", 1)[-1]
    base, _, param = name.partition("[")
    param = param.rstrip("]")
    # the scheduler spec comes first in the id and may itself hold '-': the property part starts at "-p<digit>"
    m = re.search(r"-(p\d.*)$", param)
    if m:
        return m.group(1)
    return base.removeprefix("test_").replace("_", " ")


class _Collector:
    """Counts outcomes and keeps every failure's findings (and the first reports' own lines)."""

    def __init__(self, spec: str | None = None) -> None:
        self.spec = spec
        self.passed = 0
        self.failed: list[str] = []
        self.skipped = 0
        self.details: list[str] = []
        self.findings: list[Finding] = []
        self._raised: dict[str, BaseException] = {}

    def pytest_runtest_makereport(self, item: Any, call: Any) -> None:
        # the exception itself (its group members, the run it broke) says more than the report's text
        if call.excinfo is not None:
            self._raised.setdefault(item.nodeid, call.excinfo.value)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed.append(report.nodeid)
            text = str(report.longreprtext)
            self.findings += findings_of(report.nodeid, text, self._raised.pop(report.nodeid, None), self.spec)
            if len(self.details) < 3:
                # the error and where it was raised, not the source around it (kvstab's own, for a plug-in's failure)
                self.details.append("\n".join(ln for ln in text.splitlines() if _KEPT.match(ln))[-2000:])
        elif report.skipped:
            self.skipped += 1


def run_properties(spec: str | None, profile: str, select: str | None = None) -> PropertiesSection:
    """Run the suite for scheduler ``spec`` at Hypothesis profile ``profile``
    (``select``: a pytest ``-k`` expression, for a subset).  Hypothesis is
    seeded (``--hypothesis-seed=0``) so a run is reproducible."""
    import pytest

    t0 = time.perf_counter()
    folder = props_dir()
    if spec is None:
        return PropertiesSection("unavailable", "not run: no spec loads this scheduler (pass module:attr)")
    if folder is None:
        return PropertiesSection("unavailable", "the property suite (kvstab.props) is not installed here")
    args = ["--pyargs", "kvstab.props", "--scheduler", spec, "-q", "-p", "no:cacheprovider",
            "--hypothesis-seed=0"]
    if select:
        args += ["-k", select]
    col = _Collector(spec)
    old = os.environ.get("KVSTAB_PROFILE")
    os.environ["KVSTAB_PROFILE"] = profile
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = pytest.main(args, plugins=[col])
    finally:
        if old is None:
            os.environ.pop("KVSTAB_PROFILE", None)
        else:
            os.environ["KVSTAB_PROFILE"] = old
    secs = time.perf_counter() - t0
    if int(code) == 0 and not col.failed:
        status = "passed"
        summary = f"{col.passed} property tests passed (profile {profile}, {secs:.0f} s)"
    elif col.failed:
        status = "failed"
        names = [short_name(n) for n in col.failed]
        summary = f"{len(col.failed)} failed, {col.passed} passed: {', '.join(names[:6])}{', …' if len(names) > 6 else ''}"
    else:
        status = "error"
        summary = f"the suite did not run cleanly (pytest exit {int(code)}): {out.getvalue().strip().splitlines()[-1:]}"
    return PropertiesSection(status, summary, passed=col.passed, failed=tuple(col.failed), findings=tuple(col.findings),
                             skipped=col.skipped, details=tuple(col.details), exit_code=int(code), seconds=secs,
                             profile=profile)
