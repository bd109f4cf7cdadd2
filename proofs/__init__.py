"""``kvstab.proofs``: z3 proves or refutes the per-slot memory invariant of a
scheduler's own rule, and every refutation is replayed in the simulator.

Start with :func:`prove`; verdicts are values (:class:`Proved`,
:class:`Refuted`, :class:`Unknown`), and only ``Proved`` is a pass.
"""

from kvstab.proofs.margins import work_conservation_margin
from kvstab.proofs.prove import ProofReport, prove
from kvstab.proofs.verdicts import Proved, Refuted, Unknown, Verdict, passed

__all__ = ["prove", "ProofReport", "Proved", "Refuted", "Unknown", "Verdict", "passed", "work_conservation_margin"]
