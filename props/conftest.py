"""The audit suite's shared pieces.

The ``--scheduler`` option, the ``audited_scheduler`` parametrisation and the
Hypothesis profiles come from kvstab's pytest plugin (``kvstab.testing.pytest_plugin``,
entry point ``pytest11``), so that ``pytest --pyargs kvstab.props --scheduler
mod:attr`` works from any directory; the property checks themselves live in
``kvstab.testing.checks`` and the input strategies in ``kvstab.testing.strategies``.  Collecting
this folder is what turns the plugin on when no kvstab option was given.
"""

from __future__ import annotations

import pytest

from kvstab.testing.pytest_plugin import Budget, activate, budget


def pytest_configure(config: pytest.Config) -> None:
    """kvstab's suite is collected: load its profile before any test module is imported."""
    activate(config, "kvstab.props collected")


@pytest.fixture(scope="session")
def props_budget() -> Budget:
    """The budget of the profile in force (``KVSTAB_PROFILE`` / ``HYPOTHESIS_PROFILE``)."""
    return budget()
