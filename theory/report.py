"""The numbers of the theory for one workload and one server, in one value.

:func:`stability_report` is what ``kvstab mu`` prints and what ``kvstab derive``
instantiates: ``E[g]``, ``μ``, ``δ``, ``μ(1 − δ)``, the reserve limit and the
replicas for a load.  ``δ ≥ 1`` is not an error — it is the answer "the
stability guarantee is empty" — so the guaranteed rate is ``None`` then, never
a negative number.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.theory.area import (
    Moments,
    check_computable,
    expected_g,
    expected_reserve_area,
    peak_tokens,
    workload_moments,
)
from kvstab.workload import Workload

__all__ = ["StabilityReport", "stability_report", "Instance", "EMPTY_GUARANTEE"]

#: the plain statement printed when δ ≥ 1
EMPTY_GUARANTEE = (
    "the stability guarantee is empty: a single request can need all of M or more (δ = ess sup(s + o)/M ≥ 1; "
    "a request with s + o > M is never served), so no arrival rate is guaranteed stable"
)


@dataclass(frozen=True, slots=True)
class StabilityReport:
    """``μ`` and what follows from it, for one workload and server."""

    workload: str = field(metadata={"help": "the workload's spec"})
    M: int = field(metadata={"help": "KV capacity in tokens"})
    chunk: int = field(metadata={"help": "prefill chunk ŝ"})
    block: int = field(metadata={"help": "KV block size B"})
    g_convention: str = field(metadata={"help": "'exact' or 'continuous'"})
    bbar_s: float = field(metadata={"help": "batch time b̄ in seconds"})
    moments: Moments = field(metadata={"help": "E[s], E[s²], E[o], E[o²], E[s·o], E[n], E[n²], E[s·n]"})
    E_g: float = field(metadata={"help": "E[g] in token-slots"})
    mu_per_slot: float = field(metadata={"help": "μ·b̄ = M/E[g], requests per slot"})
    mu_per_s: float = field(metadata={"help": "μ = M/(b̄E[g]), requests per second"})
    ess_sup_total: int = field(metadata={"help": "S = ess sup(s + o), rounded up to blocks"})
    delta: float = field(metadata={"help": "δ = S/M"})
    guarantee_per_s: float | None = field(metadata={"help": "μ(1 − δ); None when δ ≥ 1 (no guarantee)"})
    reserve_area: float = field(metadata={"help": "E[peak·(n(s) + o)]"})
    reserve_limit_per_s: float = field(metadata={"help": "M/(b̄·E[peak·(n + o)])"})
    lam_per_s: float | None = field(default=None, metadata={"help": "arrival rate λ, if given"})
    rho: float = field(default=1.0, metadata={"help": "target utilisation ρ"})
    replicas: int | None = field(default=None, metadata={"help": "⌈λ/(ρμ)⌉"})
    guarantee_replicas: int | None = field(default=None, metadata={"help": "⌈λ/(μ(1 − δ))⌉; None if δ ≥ 1"})

    @property
    def guarantee_empty(self) -> bool:
        """Whether ``δ ≥ 1``, i.e. the stability theorem guarantees nothing."""
        return self.delta >= 1

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (moments flattened under ``moments``, plus the
        plain statement ``guarantee_note`` when the guarantee is empty)."""
        d = asdict(self)
        d["moments"] = {**asdict(self.moments), "cov": self.moments.cov, "corr": self.moments.corr()}
        d["guarantee_empty"] = self.guarantee_empty
        d["guarantee_note"] = EMPTY_GUARANTEE if self.guarantee_empty else None
        return d


def stability_report(
    workload: Workload,
    params: ModelParams,
    lam: float | None = None,
    rho: float = 1.0,
) -> StabilityReport:
    """Compute :class:`StabilityReport` for the server ``params`` (its ``b̄``
    included); raises :class:`InvalidArgument` for ``ρ ∉ (0, 1]`` or ``λ ≤ 0``."""
    bbar = params.bbar
    if not (isinstance(rho, (int, float)) and 0 < rho <= 1):
        raise InvalidArgument(f"target utilisation ρ must be in (0, 1], got {rho!r}")
    if lam is not None and not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
        raise InvalidArgument(f"arrival rate λ must be a finite number > 0 requests/s, got {lam!r}")
    check_computable(workload, params)
    eg = expected_g(workload, params)
    mu_slot = params.M / eg
    mu_s = mu_slot / bbar
    peak = int(peak_tokens(workload.max_total, params.block))
    delta = peak / params.M
    er = expected_reserve_area(workload, params)
    n_rep: int | None = None
    n_guar: int | None = None
    if lam is not None:
        # provisioning also holds the symbolic forms: import it (and sympy) only when needed
        from kvstab.theory.provisioning import guarantee_replicas, replicas

        n_rep, n_guar = replicas(lam, mu_s, rho), guarantee_replicas(lam, mu_s, delta)
    return StabilityReport(
        workload=workload.describe(),
        M=params.M,
        chunk=params.chunk,
        block=params.block,
        g_convention=params.g,
        bbar_s=float(bbar),
        moments=workload_moments(workload, params.chunk),
        E_g=eg,
        mu_per_slot=mu_slot,
        mu_per_s=mu_s,
        ess_sup_total=peak,
        delta=delta,
        guarantee_per_s=mu_s * (1 - delta) if delta < 1 else None,
        reserve_area=er,
        reserve_limit_per_s=params.M / (bbar * er),
        lam_per_s=None if lam is None else float(lam),
        rho=float(rho),
        replicas=n_rep,
        guarantee_replicas=n_guar,
    )


@dataclass(frozen=True)
class Instance:
    """A workload and a server to instantiate the derivation document with."""

    workload: Workload
    params: ModelParams
    lam: float | None = None
    rho: float = 1.0
