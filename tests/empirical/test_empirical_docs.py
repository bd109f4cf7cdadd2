"""The worked example of docs/empirical.md runs as written and prints what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "empirical.md"


def test_replay_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "docs/empirical.md lost its worked example"
    exec(compile(blocks[0], str(DOC), "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()
    promised = [line.removeprefix("# ") for line in blocks[0].strip().splitlines()[-2:]]
    assert printed == promised
