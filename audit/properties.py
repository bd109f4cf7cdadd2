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
import time
from pathlib import Path
from typing import Any

__all__ = ["run_properties", "props_dir"]


def props_dir() -> Path | None:
    """The installed property suite's folder (``kvstab.props``), or ``None`` if this install has none."""
    spec = importlib.util.find_spec("kvstab.props")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations)))
    return d if (d / "conftest.py").is_file() else None


class _Collector:
    """Counts outcomes and keeps the first failures' reports."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []
        self.skipped = 0
        self.details: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed.append(report.nodeid)
            if len(self.details) < 3:
                self.details.append(str(report.longreprtext)[-2000:])
        elif report.skipped:
            self.skipped += 1


def run_properties(spec: str | None, profile: str, select: str | None = None) -> dict[str, Any]:
    """Run the suite for scheduler ``spec`` at Hypothesis profile ``profile``
    (``select``: a pytest ``-k`` expression, for a subset).  Hypothesis is
    seeded (``--hypothesis-seed=0``) so a run is reproducible."""
    import pytest

    t0 = time.perf_counter()
    folder = props_dir()
    if spec is None:
        return {"status": "unavailable", "summary": "not run: no spec loads this scheduler (pass module:attr)",
                "passed": 0, "failed": [], "seconds": 0.0}
    if folder is None:
        return {"status": "unavailable", "summary": "the property suite (kvstab.props) is not installed here",
                "passed": 0, "failed": [], "seconds": 0.0}
    args = ["--pyargs", "kvstab.props", "--scheduler", spec, "-q", "-p", "no:cacheprovider",
            "--hypothesis-seed=0"]
    if select:
        args += ["-k", select]
    col = _Collector()
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
        summary = f"{len(col.failed)} failed, {col.passed} passed: {', '.join(col.failed[:3])}"
    else:
        status = "error"
        summary = f"the suite did not run cleanly (pytest exit {int(code)}): {out.getvalue().strip().splitlines()[-1:]}"
    return {"status": status, "summary": summary, "passed": col.passed, "failed": col.failed,
            "skipped": col.skipped, "details": col.details, "exit_code": int(code), "seconds": secs,
            "profile": profile}
