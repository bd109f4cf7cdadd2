"""``kvstab audit`` end to end, and ``kvstab sweep``.

One command audits a scheduler variant: theory (``μ``, ``δ``, the certified
rate), proofs (the memory invariant and the margin ``Δ``), the property
suite, and the stability region (``λ*`` with an interval) beside baselines,
with a verdict and a report.  Start reading at :mod:`kvstab.audit.audit`;
every simulation goes through :func:`kvstab.audit.runs.run_point`.
"""

from kvstab.audit.profiles import PROFILES, AuditProfile, get_profile
from kvstab.audit.runs import Point, PointResult, derive_seed, run_point
from kvstab.audit.stability import StabilityRegion, find_critical_rate

__all__ = [
    "AuditProfile",
    "PROFILES",
    "get_profile",
    "Point",
    "PointResult",
    "derive_seed",
    "run_point",
    "StabilityRegion",
    "find_critical_rate",
]
