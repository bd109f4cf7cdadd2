"""Shared settings of the proof tests: small bounds, a fixed ŝ, budgets that fit CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstab.proofs.encoding import Setting
from kvstab.proofs.solver import Budget


@pytest.fixture()
def budget(tmp_path: Path) -> Budget:
    """The default budget, with undecided queries kept under the test's tmp dir."""
    return Budget(smt2_dir=tmp_path / "smt2")


@pytest.fixture()
def setting() -> Setting:
    """Symbolic M, the paper's ŝ = 512, B = 1."""
    return Setting(M=None, chunk=512, block=1)
