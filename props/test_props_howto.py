"""The how-to "audit a new scheduler" in docs/props.md runs as written.

The test takes the scheduler module and the command from the page (between
their ``<!-- howto:… -->`` markers), writes the module to a fresh directory
and runs the command there against this checkout's ``props/`` with the
derandomised ``ci`` profile: the documented scheduler must pass the whole suite.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

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
    assert command.startswith("$ PYTHONPATH=. pytest props/ ")
    args = shlex.split(command.removeprefix("$ PYTHONPATH=. pytest "))
    # the page's "props/" is this checkout's; the module lies in tmp_path (the "." of PYTHONPATH)
    args = [str(ROOT / "props") if a == "props/" else a for a in args]
    # the derandomised ci profile: the run is reproducible, so its vacuity guards are too
    env = dict(os.environ, PYTHONPATH=str(tmp_path), HYPOTHESIS_PROFILE="ci")
    # the suite minus this very file, which would otherwise run itself for ever
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-v", "-p", "no:cacheprovider", f"--ignore={Path(__file__)}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # it audited the new scheduler, and only it
    assert "my_scheduler:SCHEDULER" in run.stdout
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
    env = dict(os.environ, PYTHONPATH=str(tmp_path), HYPOTHESIS_PROFILE="ci")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "props" / "test_props_slots.py"), "-q", "-x",
         "-p", "no:cacheprovider", "-k", "p8", "--scheduler", "naive_watermark:SCHEDULER"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-2000:]
    assert "property 8 (liveness after arrivals stop) violated" in run.stdout
