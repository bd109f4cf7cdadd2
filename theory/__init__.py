"""``kvstab.theory``: closed forms for ``g``, ``E[g]``, ``μ``, ``δ`` and provisioning.

The numeric face (:func:`expected_g`, :func:`mu`, :func:`stability_report`)
is what the simulator and the CLI call; the symbolic derivations live in the
modules ``g``, ``moments``, ``stability``, ``provisioning``, ``fleet`` and ``wait``, the
LaTeX printer in ``latex`` and the document writer in ``document``.  sympy is
imported only when a symbolic form is first needed.
"""

from kvstab.theory.area import expected_g, g_blocks, g_continuous, g_exact, lifetime_area, mu, mu_per_slot
from kvstab.theory.fleet import (
    FleetReport,
    critical_rate,
    fleet_report,
    guaranteed_rate,
    optimal_split,
    replicas_to_add,
    round_robin_loss,
)
from kvstab.theory.report import StabilityReport, stability_report

__all__ = [
    "g_exact",
    "g_continuous",
    "g_blocks",
    "lifetime_area",
    "expected_g",
    "mu",
    "mu_per_slot",
    "StabilityReport",
    "stability_report",
    "FleetReport",
    "fleet_report",
    "critical_rate",
    "guaranteed_rate",
    "optimal_split",
    "round_robin_loss",
    "replicas_to_add",
]
