"""docs/tutorial.md runs as written: every ``$ kvstab …`` line exits as the page says."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvstab.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"
ROOT = DOC.parents[1]


def commands() -> list[tuple[str, int]]:
    """``($ command, expected exit status)`` from the page's console blocks."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                cmd, _, comment = line[2:].partition("#")
                m = re.search(r"exit (\d+)", comment)
                out.append((cmd.strip(), int(m.group(1)) if m else 0))
    return out


def test_the_page_has_its_commands() -> None:
    cmds = [c for c, _ in commands()]
    assert any(c.startswith("kvstab prove") for c in cmds) and any(c.startswith("pytest props/") for c in cmds)


@pytest.mark.parametrize("cmd,status", commands(), ids=[c.split(" --")[0] for c, _ in commands()])
def test_tutorial_command(cmd: str, status: int, capsys: pytest.CaptureFixture[str]) -> None:
    argv = shlex.split(cmd)
    if argv[0] == "kvstab":
        rc = main(argv[1:])
        out = capsys.readouterr().out
    else:  # pytest props/ … in a subprocess, from the project root
        assert argv[0] == "pytest"
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv[1:], "-k", "p1 or p3 or p6"],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        rc, out = run.returncode, run.stdout
    assert rc == status, out[-3000:]
    if argv[:2] == ["kvstab", "simulate"]:
        # what the page says of this run, checked on the run itself
        main([*argv[1:], "--json"])
        d = json.loads(capsys.readouterr().out)
        lo, hi = d["queue_growth_per_slot_ci95"]
        tlo, thi = d["throughput_per_s_ci95"]
        assert lo > 0 and tlo <= d["mu_formula_per_s"] <= thi and d["memory_utilisation"] > 0.98
        assert d["policy_certified_rate_per_s"] is None
    if argv[:2] == ["kvstab", "mu"]:
        # the numbers the page quotes (closed forms, not a seeded run)
        assert "3.26217 req/s" in out and "3.18248 req/s" in out and "0.0244275" in out
    if "prove" in argv and status == 0:
        assert "verdict: Proved" in out
    if "prove" in argv and status == 1:
        assert "verdict: Refuted (reachable)" in out and "simulator: reproduced" in out
