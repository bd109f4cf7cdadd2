"""The audit suite's shared pieces.

The ``--scheduler`` option, the ``audited_scheduler`` parametrisation and the
Hypothesis profiles come from kvstab's pytest plugin (``kvstab.pytest_plugin``,
entry point ``pytest11``), so that ``pytest props/ --scheduler mod:attr``
works from any directory; the property checks themselves live in
``kvstab.checks`` and the input strategies in ``kvstab.strategies``.
"""

from __future__ import annotations

import pytest

from kvstab.pytest_plugin import Budget, budget


@pytest.fixture(scope="session")
def props_budget() -> Budget:
    """The budget of the Hypothesis profile in force (``HYPOTHESIS_PROFILE``)."""
    return budget()
