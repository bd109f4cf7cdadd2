"""kvstab's property wing, the way ``numpy.testing`` is numpy's: what a test needs.

- :mod:`kvstab.testing.checks` — the per-slot property checks (properties 1–8)
  shared by the property suite, the mutation test and ``kvstab check``;
- :mod:`kvstab.testing.strategies` — public Hypothesis strategies
  (``workloads()``, ``arrivals()``, ``scenarios()``, …);
- :mod:`kvstab.testing.pytest_plugin` — the pytest plugin (entry point
  ``pytest11``): ``--scheduler``, the ``dev``/``ci``/``thorough`` profiles.

The property suite itself is :mod:`kvstab.props` (``pytest --pyargs kvstab.props``).
"""

__all__ = ["checks", "strategies", "pytest_plugin"]
