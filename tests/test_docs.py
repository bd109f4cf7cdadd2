"""The worked example in docs/scheduler-contract.md runs as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "scheduler-contract.md"


def test_worked_example_runs(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "the contract doc lost its worked example"
    mod = types.ModuleType("doc_example")  # dataclasses look their module up in sys.modules
    monkeypatch.setitem(sys.modules, "doc_example", mod)
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), mod.__dict__)
    out = capsys.readouterr().out
    assert "s1" in out and "M" in out  # the symbolic decision mentions the symbols
