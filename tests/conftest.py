"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

#: ``shared/`` lies beside the checkout (as in CI: a copy of shared/ beside the clone)
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data``; a missing folder is an error, not a skip."""
    d = SHARED / "data"
    assert d.is_dir(), f"shared data folder not found at {d}; CI lays shared/ beside the clone"
    return d
