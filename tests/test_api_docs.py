"""docs/api.md is what scripts/gen_api.py makes of the current docstrings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "scripts" / "gen_api.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_api_reference_is_current() -> None:
    gen = generator()
    text = gen.render()
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert committed == text, "docs/api.md is stale: run python scripts/gen_api.py"


def test_the_reference_covers_what_a_rule_author_uses() -> None:
    text = generator().render()
    for name in ("View", "Decision", "Traits", "traits_of", "fcfs_admit", "preempt_newest", "held_first",
                 "used_next", "SimResult", "Engine", "ModelParams", "packed_arrivals", "audit_plan"):
        assert f"### `{name}`" in text, name
    assert " at 0x" not in text  # no object addresses: the page is the same run to run
    assert "*(no docstring)*" not in text, "a public name in docs/api.md has no docstring"
