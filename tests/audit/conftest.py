"""Shared pieces of the audit tests: one small end-to-end audit, run once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _audit_support import SMALL

from kvstab.cli import main


@pytest.fixture(scope="session")
def small_audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict[str, Any]]:
    """``kvstab audit`` of vllm-v1 against current-fit on :data:`SMALL` (dev
    profile, properties skipped: they have their own test), with a gate that
    cannot be met: (exit status, report folder, report.json)."""
    out = tmp_path_factory.mktemp("audit")
    code = main(["audit", "--scheduler", "vllm-v1", "--baseline", "current-fit", *SMALL, "--profile", "dev",
                 "--skip", "properties", "--require-rate", "1000", "--max-waste", "0.5", "--out", str(out), "--quiet"])
    return code, out, json.loads((out / "report.json").read_text())
