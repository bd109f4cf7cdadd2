"""The stability region of a fleet of replicas behind a router, by sympy.

A fleet is ``N`` independent replicas; replica ``i`` has its own ``M_i``,
``b̄_i``, ``ŝ_i``, ``B_i`` and hence its own ``μ_i = M_i/(b̄_i·E_i[g])`` and
``δ_i = S_i/M_i``.  A router sends each arriving request to one replica.
Premise throughout: the router is **size-blind** (it never looks at ``s`` or
``o``), so every replica sees requests drawn from the workload's own law.

What is proved, and under which premise (the numbers in brackets are the
claims of :func:`fleet_claims`):

* **Any size-blind router — necessary.**  If replica ``i`` receives a long-run
  rate ``λ_i`` (``Σ λ_i = λ``), its own instability theorem (a slot serves at
  most ``M_i`` of area; the bound uses only the mean arrival rate) makes it
  unstable when ``λ_i > μ_i``.  So a stable fleet has ``λ_i ≤ μ_i`` for every
  ``i`` and hence ``λ ≤ Σ μ_i``; above ``Σ μ_i`` no router is stable.
* **Static random split ``p_i`` — exact per replica.**  Thinning a Poisson
  stream by independent choices gives replica ``i`` a Poisson stream of rate
  ``λp_i`` with i.i.d. sizes: replica ``i`` *is* the single-server model.  So
  ``λp_i > μ_i`` for some ``i`` ⇒ unstable (necessary: ``λp_i ≤ μ_i``), and
  ``λp_i < μ_i(1 − δ_i)`` for all ``i`` ⇒ stable, for a replica policy that
  meets the stability theorem's premise (never preempts, never leaves a
  fitting head waiting) — sufficient.  The split's critical rates are
  ``min_i μ_i/p_i`` (necessary) and ``min_i μ_i(1 − δ_i)/p_i`` (sufficient).
  Weighted round-robin gives the same long-run rates ``λp_i``, so the
  necessary side holds for it as stated; its sufficient side needs the drift
  argument over one round of the router (a finite-state modulated arrival
  stream), which is taken as a premise here, not proved.
* **The optimal static split** is ``p_i ∝ μ_i``: it makes every ``μ_i/p_i``
  equal to ``Σ μ_j``, and no split does better, because ``Σ p_i·(μ_i/p_i) =
  Σ μ_i`` is a ``p``-weighted mean of the ratios, so their minimum is at most
  ``Σ μ_i``.  For the guarantee the same holds with ``μ_i(1 − δ_i)``.
* **Round-robin** (``p_i = 1/N``) has critical rate ``N·min_i μ_i``; it loses
  the fraction ``1 − N·min μ_i/Σ μ_i`` of the fleet's capacity (zero exactly
  when the replicas are identical).  Two replicas with ``μ₁ = 2μ₂``: ``2μ₂``
  against ``3μ₂``.
* **Provisioning** a heterogeneous fleet at utilisation ``ρ``: with the
  optimal split, ``Σ n_k μ_k ≥ λ/ρ`` replicas-weighted (``n_k`` replicas of
  type ``k``), and ``Σ n_k μ_k(1 − δ_k) > λ`` for the guarantee.

The numeric twins (:func:`critical_rate`, :func:`guaranteed_rate`,
:func:`optimal_split`, :func:`round_robin_loss`, :func:`replicas_to_add`) are
vectorised over the replicas and checked against the sympy forms by the tests.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument

if TYPE_CHECKING:
    import sympy as sp

    from kvstab.theory.claims import Claim

__all__ = [
    "fleet_symbols",
    "ideal_rate_expr",
    "split_rate_expr",
    "split_guarantee_expr",
    "optimal_split_expr",
    "round_robin_rate_expr",
    "round_robin_loss_expr",
    "fleet_provisioning_expr",
    "fleet_claims",
    "critical_rate",
    "guaranteed_rate",
    "optimal_split",
    "round_robin_loss",
    "replicas_to_add",
    "FleetReport",
    "fleet_report",
]

FloatArr = npt.NDArray[np.float64]

#: the number of replicas of the symbolic fleet (the claims hold replica by
#: replica; three replicas make a split that is neither trivial nor symmetric)
_N = 3


@cache
def fleet_symbols(n: int = _N) -> tuple[tuple[sp.Symbol, ...], tuple[sp.Symbol, ...], tuple[sp.Symbol, ...]]:
    """``(μ_1…μ_n, δ_1…δ_n, p_1…p_n)``: positive rates, ``δ_i ∈ (0, 1)`` read as
    ``δ_i = 1 − u_i`` with a positive ``u_i`` where it matters, positive shares."""
    import sympy as sp

    mus = sp.symbols(f"mu_1:{n + 1}", positive=True)
    deltas = sp.symbols(f"delta_1:{n + 1}", positive=True)
    ps = sp.symbols(f"p_1:{n + 1}", positive=True)
    return tuple(mus), tuple(deltas), tuple(ps)


def ideal_rate_expr(n: int = _N) -> sp.Expr:
    """``Σ μ_i``: above it no size-blind router keeps the fleet stable."""
    import sympy as sp

    mus, _, _ = fleet_symbols(n)
    return sp.Add(*mus)


def split_rate_expr(n: int = _N) -> sp.Expr:
    """``min_i μ_i/p_i``: a static split is unstable above it (necessary)."""
    import sympy as sp

    mus, _, ps = fleet_symbols(n)
    return sp.Min(*(m / p for m, p in zip(mus, ps)))


def split_guarantee_expr(n: int = _N) -> sp.Expr:
    """``min_i μ_i(1 − δ_i)/p_i``: a random split is stable below it (sufficient)."""
    import sympy as sp

    mus, deltas, ps = fleet_symbols(n)
    return sp.Min(*(m * (1 - d) / p for m, d, p in zip(mus, deltas, ps)))


def optimal_split_expr(n: int = _N) -> tuple[sp.Expr, ...]:
    """``p_i = μ_i/Σ μ_j``, the split that maximises ``min_i μ_i/p_i``."""
    mus, _, _ = fleet_symbols(n)
    total = ideal_rate_expr(n)
    return tuple(m / total for m in mus)


def round_robin_rate_expr(n: int = _N) -> sp.Expr:
    """``N·min_i μ_i``: round-robin's critical rate (``p_i = 1/N``)."""
    import sympy as sp

    mus, _, _ = fleet_symbols(n)
    return n * sp.Min(*mus)


def round_robin_loss_expr(n: int = _N) -> sp.Expr:
    """``1 − N·min μ_i/Σ μ_i``: the fraction of capacity round-robin leaves unused."""
    return 1 - round_robin_rate_expr(n) / ideal_rate_expr(n)


def fleet_provisioning_expr(n: int = _N) -> sp.Expr:
    """``Σ μ_i ≥ λ/ρ`` written as the capacity margin ``Σ μ_i − λ/ρ`` (≥ 0 when provisioned)."""

    from kvstab.theory.symbols import lam, rho

    return ideal_rate_expr(n) - lam / rho


def _slacks(n: int) -> tuple[sp.Symbol, ...]:
    import sympy as sp

    return tuple(sp.symbols(f"u_1:{n + 1}", nonnegative=True))


def fleet_claims() -> list[Claim]:
    """The fleet's claims, for sympy to check (see the module docstring)."""
    import sympy as sp

    from kvstab.theory.claims import Claim
    from kvstab.theory.symbols import lam, rho

    n = _N
    mus, deltas, ps = fleet_symbols(n)
    u = _slacks(n)
    total = ideal_rate_expr(n)
    # the rates a stable fleet can receive: λ_i = μ_i − u_i with u_i ≥ 0
    lam_i = [m - ui for m, ui in zip(mus, u)]
    opt = optimal_split_expr(n)
    (m1, m2), _, _ = fleet_symbols(2)
    # the guarantee of a split at the proportional split p_i ∝ μ_i(1 − δ_i), δ_i = 1 − v_i
    v = sp.symbols(f"v_1:{n + 1}", positive=True)
    cap = [m * vi for m, vi in zip(mus, v)]
    cap_total = sp.Add(*cap)
    # provisioning: the new replicas' rate and the ceiling's fractional part
    mu_new = sp.Symbol("mu_new", positive=True)
    frac = sp.Symbol("f", nonnegative=True)
    # round-robin: the slowest replica's rate m and the others' excess w_i ≥ 0
    m_min = sp.Symbol("m", positive=True)
    excess = _slacks(n)
    return [
        Claim(
            "any size-blind router: every λ_i ≤ μ_i gives λ = Σ λ_i ≤ Σ μ_i",
            total,
            sp.Add(*lam_i),
            ">=",
            premise="λ_i = μ_i − u_i, u_i ≥ 0 (each replica's instability theorem)",
        ),
        Claim(
            "a split's ratios μ_i/p_i have p-weighted mean Σ μ_i, so min_i μ_i/p_i ≤ Σ μ_i",
            sp.Add(*(p * sp.UnevaluatedExpr(m / p) for m, p in zip(mus, ps))),
            total,
        ),
        *[
            Claim(f"p_i ∝ μ_i makes μ_{i + 1}/p_{i + 1} = Σ μ_j", m / sp.UnevaluatedExpr(p), total)
            for i, (m, p) in enumerate(zip(mus, opt))
        ],
        Claim("the proportional split sums to 1", sp.Add(*opt), sp.Integer(1)),
        *[
            Claim(
                f"p_i ∝ μ_i(1 − δ_i) makes μ_{i + 1}(1 − δ_{i + 1})/p_{i + 1} = Σ μ_j(1 − δ_j)",
                c / sp.UnevaluatedExpr(c / cap_total),
                cap_total,
                premise="δ_i = 1 − v_i, v_i > 0",
            )
            for i, c in enumerate(cap)
        ],
        Claim(
            "round-robin's critical rate N·min μ_i is at most Σ μ_i",
            total.subs({mu: m_min + w for mu, w in zip(mus, excess)}),
            round_robin_rate_expr(n)
            .subs({mu: m_min + w for mu, w in zip(mus, excess)})
            .subs(sp.Min(*(m_min + w for w in excess)), m_min),
            ">=",
            premise="μ_i = m + w_i, w_i ≥ 0, m = min μ_i",
        ),
        Claim(
            "two replicas, μ_1 = 2μ_2: round-robin is critical at 2μ_2",
            round_robin_rate_expr(2).subs(m1, sp.UnevaluatedExpr(2 * m2)),
            2 * m2,
        ),
        Claim(
            "two replicas, μ_1 = 2μ_2: the optimal split is critical at 3μ_2",
            ideal_rate_expr(2).subs(m1, sp.UnevaluatedExpr(2 * m2)),
            3 * m2,
        ),
        Claim(
            "identical replicas: round-robin loses nothing",
            round_robin_loss_expr(n).subs({m: mus[0] for m in mus[1:]}),
            sp.Integer(0),
            premise="μ_1 = μ_2 = μ_3",
        ),
        Claim(
            "adding ⌈(λ/ρ − Σ μ_i)/μ_new⌉ replicas of rate μ_new provisions the fleet: Σ μ ≥ λ/ρ",
            total + mu_new * ((lam / rho - total) / mu_new + frac),
            lam / rho,
            ">=",
            premise="⌈y⌉ = y + f with f ≥ 0, y = (λ/ρ − Σ μ_i)/μ_new",
        ),
        Claim(
            "a random split's guarantee is below its critical rate, replica by replica",
            mus[0] / ps[0],
            mus[0] * (1 - deltas[0]) / ps[0],
            ">=",
        ),
    ]


def _rates(name: str, values: npt.ArrayLike) -> FloatArr:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise InvalidArgument(f"{name}: a fleet needs at least one replica")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise InvalidArgument(f"{name} must be finite and > 0 for every replica, got {values!r}")
    return arr


def _split(split: npt.ArrayLike | None, n: int) -> FloatArr:
    if split is None:
        return np.full(n, 1.0 / n)
    p = np.asarray(split, dtype=np.float64).ravel()
    if p.size != n:
        raise InvalidArgument(f"the split has {p.size} shares for {n} replicas")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or abs(float(p.sum()) - 1) > 1e-9:
        raise InvalidArgument(f"a split's shares must be >= 0 and sum to 1, got {split!r}")
    return p


def _deltas(deltas: npt.ArrayLike | float, n: int) -> FloatArr:
    d = np.broadcast_to(np.asarray(deltas, dtype=np.float64), (n,)).astype(np.float64)
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise InvalidArgument(f"δ_i must be finite and >= 0, got {deltas!r}")
    return d


def critical_rate(mus: npt.ArrayLike, split: npt.ArrayLike | None = None) -> float:
    """``min_i μ_i/p_i`` (round-robin ``p_i = 1/N`` when ``split`` is ``None``); a
    replica with ``p_i = 0`` takes nothing and sets no limit."""
    m = _rates("μ_i", mus)
    p = _split(split, m.size)
    used = p > 0
    return float(np.min(m[used] / p[used]))


def guaranteed_rate(
    mus: npt.ArrayLike, deltas: npt.ArrayLike | float, split: npt.ArrayLike | None = None
) -> float | None:
    """``min_i μ_i(1 − δ_i)/p_i`` for a random split; ``None`` when a used replica
    has ``δ_i ≥ 1`` (its guarantee is empty)."""
    m = _rates("μ_i", mus)
    p = _split(split, m.size)
    d = _deltas(deltas, m.size)
    used = p > 0
    if np.any(d[used] >= 1):
        return None
    return float(np.min(m[used] * (1 - d[used]) / p[used]))


def optimal_split(mus: npt.ArrayLike, deltas: npt.ArrayLike | float | None = None) -> FloatArr:
    """``p_i ∝ μ_i`` (or ``∝ μ_i(1 − δ_i)`` for the guarantee when ``deltas`` is given)."""
    m = _rates("μ_i", mus)
    if deltas is not None:
        d = _deltas(deltas, m.size)
        if np.all(d >= 1):
            raise InvalidArgument("every replica has δ_i ≥ 1: no split has a stability guarantee")
        m = m * np.clip(1 - d, 0.0, None)
    return m / m.sum()


def round_robin_loss(mus: npt.ArrayLike) -> float:
    """``1 − N·min μ_i/Σ μ_i``: the capacity round-robin leaves unused."""
    m = _rates("μ_i", mus)
    return float(1 - m.size * m.min() / m.sum())


def replicas_to_add(lam_: float, mus: npt.ArrayLike, mu_new: float, rho_: float = 1.0) -> int:
    """Replicas of rate ``mu_new`` to add to the fleet ``mus`` (split optimally)
    so that ``Σ μ_i ≥ λ/ρ``: ``⌈(λ/ρ − Σ μ_i)/μ_new⌉``, at least 0."""
    m = _rates("μ_i", mus) if np.size(mus) else np.zeros(0)
    _rates("μ of the new replicas", [mu_new])
    if not (math.isfinite(lam_) and lam_ > 0) or not 0 < rho_ <= 1:
        raise InvalidArgument(f"need λ > 0 and ρ in (0, 1], got λ = {lam_!r}, ρ = {rho_!r}")
    short = lam_ / rho_ - float(m.sum())
    return max(0, math.ceil(short / mu_new - 1e-12))


@dataclass(frozen=True, slots=True)
class FleetReport:
    """The stability region of one fleet."""

    mus: tuple[float, ...] = field(metadata={"help": "μ_i of each replica, req/s"})
    deltas: tuple[float, ...] = field(metadata={"help": "δ_i of the workload on each replica"})
    ideal_rate: float = field(metadata={"help": "Σ μ_i: no size-blind router is stable above it"})
    optimal_split: tuple[float, ...] = field(metadata={"help": "p_i ∝ μ_i: critical at Σ μ_i"})
    guarantee_split: tuple[float, ...] | None = field(
        metadata={"help": "p_i ∝ μ_i(1 − δ_i) over replicas with δ_i < 1; None if every δ_i ≥ 1"}
    )
    optimal_guarantee: float | None = field(
        metadata={"help": "Σ μ_i(1 − δ_i) over δ_i < 1: stable below it (random split guarantee_split)"}
    )
    round_robin_rate: float = field(metadata={"help": "N·min μ_i: round-robin is unstable above it"})
    round_robin_guarantee: float | None = field(metadata={"help": "N·min μ_i(1 − δ_i); None if some δ_i ≥ 1"})
    round_robin_loss: float = field(metadata={"help": "1 − N·min μ_i/Σ μ_i"})
    lam_per_s: float | None = field(default=None, metadata={"help": "the load λ, if given"})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def lines(self) -> list[str]:
        """The report as text lines (for ``kvstab mu``)."""

        def rate(x: float | None) -> str:
            return "none (δ ≥ 1)" if x is None else f"{x:.6g} req/s"

        def vec(xs: tuple[float, ...]) -> str:
            return ", ".join(f"{x:.4g}" for x in xs)

        same = len(set(self.deltas)) == 1
        deltas = f"δ = {self.deltas[0]:.4g} on each" if same else f"δ_i = {vec(self.deltas)}"
        guard = (
            "none (every δ_i ≥ 1)"
            if self.guarantee_split is None
            else f"p_i ∝ μ_i(1−δ_i) = ({vec(self.guarantee_split)})"
        )
        out = [
            f"fleet of {len(self.mus)} replicas, μ_i = {vec(self.mus)} req/s ({deltas}; a size-blind router)",
            f"  any router      : unstable above Σ μ_i = {rate(self.ideal_rate)}",
            f"  optimal split   : p_i ∝ μ_i = ({vec(self.optimal_split)}), critical at Σ μ_i",
            f"  guarantee split : {guard}, stable below Σ μ_i(1−δ_i) = {rate(self.optimal_guarantee)} "
            "if every replica's policy never preempts and is work-conserving (the premise; not certified otherwise)",
            f"  round-robin     : critical at N·min μ_i = {rate(self.round_robin_rate)}; stable below "
            f"{rate(self.round_robin_guarantee)} taken as a premise, not proved (see kvstab.theory.fleet); "
            f"loses {100 * self.round_robin_loss:.3g}% of Σ μ_i",
        ]
        if self.lam_per_s is not None:
            ok_opt = self.lam_per_s < self.ideal_rate
            ok_rr = self.lam_per_s < self.round_robin_rate
            out.append(
                f"  at λ = {self.lam_per_s:g} req/s: optimal split {'below' if ok_opt else 'AT OR ABOVE'} its critical "
                f"rate, round-robin {'below' if ok_rr else 'AT OR ABOVE'} its critical rate"
            )
        return out


def fleet_report(mus: npt.ArrayLike, deltas: npt.ArrayLike | float, lam: float | None = None) -> FleetReport:
    """The stability region of a fleet with rates ``mus`` and ``δ_i`` ``deltas``
    (one number: the same on every replica)."""
    m = _rates("μ_i", mus)
    n = m.size
    d = _deltas(deltas, n)
    guard: FloatArr | None = None if np.all(d >= 1) else optimal_split(m, d)
    return FleetReport(
        mus=tuple(float(x) for x in m),
        deltas=tuple(float(x) for x in d),
        ideal_rate=float(m.sum()),
        optimal_split=tuple(float(x) for x in optimal_split(m)),
        guarantee_split=None if guard is None else tuple(float(x) for x in guard),
        optimal_guarantee=None if guard is None else guaranteed_rate(m, d, guard),
        round_robin_rate=critical_rate(m),
        round_robin_guarantee=guaranteed_rate(m, d, np.full(n, 1.0 / n)),
        round_robin_loss=round_robin_loss(m),
        lam_per_s=None if lam is None else float(lam),
    )
