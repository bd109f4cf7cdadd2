"""How much one audit may spend: the ``dev``, ``ci`` and ``thorough`` profiles.

One switch sets the cost of the whole audit, as ``HYPOTHESIS_PROFILE`` does for
the property suite (the audit runs that suite at the profile of the same name):
the stability search's resolution and replications, the proofs' bounds and
budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstab.errors import InvalidArgument

__all__ = ["AuditProfile", "PROFILES", "get_profile"]


@dataclass(frozen=True, slots=True)
class AuditProfile:
    """The cost knobs of one audit profile."""

    name: str = field(metadata={"help": "profile name (also the Hypothesis profile of the property suite)"})
    tolerance: float = field(metadata={"help": "target half-width of the λ* interval, as a fraction of μ"})
    seeds: int = field(metadata={"help": "independent replications per evaluated rate"})
    max_seeds: int = field(metadata={"help": "replications an undecided rate may grow to"})
    completions: int = field(metadata={"help": "completions one replication aims for at λ ≈ μ (sets the horizon)"})
    min_lifetimes: int = field(metadata={"help": "least horizon, in mean request lifetimes"})
    max_evaluations: int = field(metadata={"help": "most rates the search evaluates per scheduler"})
    grid: tuple[float, ...] = field(metadata={"help": "extra loads λ/λ* measured for the curves"})
    proof_K: int = field(metadata={"help": "active-request slots of the proofs"})
    proof_Q: int = field(metadata={"help": "queued-request slots of the proofs"})
    proof_rlimit: int = field(metadata={"help": "z3 resource limit per query"})
    margin_M: int = field(metadata={"help": "M of the margin search (small: the search is per token)"})
    margin_max_s: int = field(metadata={"help": "prompt-length bound of the margin search"})
    margin_max_o: int = field(metadata={"help": "output-length bound of the margin search"})


PROFILES: dict[str, AuditProfile] = {
    "dev": AuditProfile("dev", tolerance=0.04, seeds=3, max_seeds=6, completions=1_500, min_lifetimes=40,
                        max_evaluations=10, grid=(0.6, 0.9, 1.15), proof_K=4, proof_Q=2,
                        proof_rlimit=20_000_000, margin_M=32, margin_max_s=8, margin_max_o=4),
    "ci": AuditProfile("ci", tolerance=0.01, seeds=4, max_seeds=16, completions=2_500, min_lifetimes=40,
                       max_evaluations=14, grid=(0.5, 0.9, 1.1), proof_K=8, proof_Q=4,
                       proof_rlimit=200_000_000, margin_M=64, margin_max_s=16, margin_max_o=8),
    "thorough": AuditProfile("thorough", tolerance=0.005, seeds=8, max_seeds=32, completions=8_000,
                             min_lifetimes=80, max_evaluations=20, grid=(0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.25),
                             proof_K=8, proof_Q=4, proof_rlimit=500_000_000, margin_M=64, margin_max_s=16,
                             margin_max_o=8),
}


def get_profile(name: str) -> AuditProfile:
    """The profile called ``name``; raise :class:`InvalidArgument` naming the valid ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise InvalidArgument(f"audit profile {name!r} is unknown; valid: {', '.join(PROFILES)}") from None
