"""The projection theorem: lookahead's memory invariant for any number of requests.

A rule whose admission is :func:`kvstab.contract.fcfs_admit_projected` (and
that never preempts and runs every request one full unit) keeps the state
invariant

    **INV**: for every future slot ``τ ≥ 1``, ``F(τ) = Σ_active P_a(τ) ≤ M``,

where ``P_a(τ)`` is the rule's own projection of request ``a`` (its memory
``τ`` slots from now).  The argument (``docs/proofs.md``) needs only facts
about *one* request at a time, each a solver obligation here:

* **PJ1** ``P(τ) ≥ 0`` for ``τ ≥ 1``, and ``P(τ) = 0`` for ``τ > f`` (``f``
  the projected finish slot);
* **PJ2** (a peak at a finish slot) for ``1 ≤ τ ≤ φ`` with ``f ≥ τ ⇒ f ≥ φ``:
  ``P(τ) ≤ P(φ)`` — summed over the requests with ``φ`` the earliest finish
  slot at or after ``τ``, it gives ``F(τ) ≤ F(φ)``: a sum of projections
  peaks at one of their finish slots, which is where the combinator checks it;
* **PJ3** (the charge) the engine's charge of the request this slot is
  ``P(1)``;
* **PJ4** (the shift) after the slot, a request that stays is projected
  ``P′(τ) = P(τ + 1)``, and one that finishes has ``P(τ + 1) = 0`` (``τ ≥ 1``).

Each is over a request at any progress a well-formed state allows, a fresh
one (progress 0) included, and symbolic ``τ``, ``φ`` — no ``K``, no ``Q``.
"""

from __future__ import annotations

import z3

from kvstab.contract import Projected
from kvstab.model import progress_after
from kvstab.proofs.encoding import OPS, Setting, held
from kvstab.proofs.folds import ProjectedAdmission
from kvstab.proofs.loops import obligation
from kvstab.proofs.solver import Budget
from kvstab.proofs.verdicts import Obligation
from kvstab.symbolic import Sym, unwrap

__all__ = ["projection_obligations", "INVARIANT"]

#: the state invariant the theorem keeps
INVARIANT = "for every future slot τ ≥ 1: Σ_active P_a(τ) ≤ M (P the rule's own projection)"


def _project(adm: ProjectedAdmission, s: z3.ArithRef, o: z3.ArithRef, p: z3.ArithRef) -> Projected:
    return adm.project(Sym(s), Sym(o), Sym(p), True)


def _at(adm: ProjectedAdmission, proj: Projected, tau: z3.ArithRef) -> z3.ArithRef:
    out = unwrap(proj.held_at(adm.view, Sym(tau), OPS))
    return out if isinstance(out, z3.ArithRef) else z3.IntVal(out)


def projection_obligations(adm: ProjectedAdmission, setting: Setting, budget: Budget) -> list[Obligation]:
    """PJ1–PJ4 for one request of the rule's projection (see the module docstring)."""
    M = setting.M_term
    s, o, p = z3.Int("x.s"), z3.Int("x.o"), z3.Int("x.p")
    tau, phi = z3.Int("tau"), z3.Int("phi")
    # any progress a well-formed state allows, 0 (a request about to be admitted) included
    wf = [
        M >= max(1, setting.block),
        s >= 1,
        o >= 1,
        held(s + o, setting) <= M,
        p >= 0,
        p < s + o,
    ]
    if not setting.prefix_caching:  # with caching a prefill starts at a cached prefix, not chunk-aligned
        wf.append(z3.Implies(p < s, p % setting.chunk == 0))
    pr = _project(adm, s, o, p)
    f = unwrap(pr.f)
    P = lambda t: _at(adm, pr, t)  # noqa: E731  (a term of τ, read as the projection)
    obs = obligation("projection", wf + [tau >= 1], P(tau) >= 0, budget, "PJ1: P(τ) ≥ 0")
    obs += obligation("projection", wf + [tau >= 1, tau > f], P(tau) == 0, budget, "PJ1: P(τ) = 0 after its finish slot f")
    obs += obligation(
        "projection",
        wf + [tau >= 1, phi >= tau, z3.Implies(f >= tau, f >= phi)],
        P(tau) <= P(phi),
        budget,
        "PJ2: P(τ) ≤ P(φ) for τ ≤ φ ≤ f (or f < τ): peaks at a finish slot",
    )
    after = unwrap(progress_after(Sym(s), Sym(p), setting.chunk, None, OPS))
    obs += obligation("projection", wf, P(z3.IntVal(1)) == held(after, setting), budget, "PJ3: the slot charges P(1)")
    moved = _project(adm, s, o, after)
    obs += obligation(
        "projection",
        wf + [tau >= 1, after < s + o],
        _at(adm, moved, tau) == P(tau + 1),
        budget,
        "PJ4: a request that stays is projected P′(τ) = P(τ + 1)",
    )
    obs += obligation(
        "projection", wf + [tau >= 1, after == s + o], P(tau + 1) == 0, budget, "PJ4: a request that finishes has P(τ + 1) = 0"
    )
    return obs
