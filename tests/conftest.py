"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstab.data import data_dir as _shipped_data_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data kvstab ships (``kvstab/data``, or ``$KVSTAB_DATA``)."""
    d = _shipped_data_dir()
    assert (d / "traces").is_dir(), f"kvstab's data folder {d} has no traces/"
    return d
