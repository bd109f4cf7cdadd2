"""The how-to "audit a new scheduler" in docs/props.md runs as written.

The test takes the scheduler module and the command from the page (between
their ``<!-- howto:… -->`` markers), writes the module to a fresh directory
and runs the command there, as written — the suite comes from the installed
package (``--pyargs kvstab.props``) — with the derandomised ``ci`` profile:
the documented scheduler must pass the whole audit, and the suite's own
self-tests must be deselected with their reason.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

#: a self-test of the suite: deselected when auditing one scheduler (``--scheduler``)
pytestmark = pytest.mark.kvstab_selftest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "props.md"


def block_after(marker: str, text: str) -> str:
    """The fenced code block that follows ``<!-- howto:marker -->``."""
    m = re.search(rf"<!-- howto:{re.escape(marker)} -->\s*```\w*\n(.*?)```", text, re.S)
    assert m, f"docs/props.md has no code block after <!-- howto:{marker} -->"
    return m.group(1)


def test_howto_audit_a_new_scheduler(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    (tmp_path / "my_scheduler.py").write_text(block_after("my_scheduler.py", text), encoding="utf-8")
    command = block_after("command", text).strip()
    assert command.startswith("$ PYTHONPATH=. pytest --pyargs kvstab.props "), command
    args = shlex.split(command.removeprefix("$ PYTHONPATH=. pytest "))
    # the derandomised ci profile: the run is reproducible, so its vacuity guards are too
    env = dict(os.environ, PYTHONPATH=str(tmp_path), KVSTAB_PROFILE="ci")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # it audited the new scheduler, and only it
    assert "my_scheduler:SCHEDULER" in run.stdout
    ran = [line for line in run.stdout.splitlines() if "::" in line and (" PASSED" in line or " FAILED" in line)]
    assert ran and all("my_scheduler:SCHEDULER" in line for line in ran), ran
    assert "kvstab: deselected" in run.stdout and "--scheduler given" in run.stdout
    summary = run.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary


def test_howto_bug_it_warns_about_is_caught(tmp_path: Path) -> None:
    """The page says property 8 catches the watermark without its empty-server
    exception: drop the exception and the audit must fail with property 8."""
    text = DOC.read_text(encoding="utf-8")
    fixed = "limit = ops.ite(ops.eq(acc, 0), view.M, high_water)"
    source = block_after("my_scheduler.py", text)
    assert fixed in source
    (tmp_path / "naive_watermark.py").write_text(source.replace(fixed, "limit = high_water"), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), KVSTAB_PROFILE="ci")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "kvstab.props.test_props_slots", "-q", "-x",
         "-p", "no:cacheprovider", "-k", "p8", "--scheduler", "naive_watermark:SCHEDULER"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    assert "property 8 (liveness after arrivals stop) violated" in run.stdout
