"""The lemmas behind the theorems, proved for the encoded transition.

* **Area per unit** (per request, non-linear, split by hand into cases each in
  its own frame): with ``A(s, p)`` the memory area a request has been served
  by the time its progress is ``p`` (full units, ``ŝ`` fixed, ``B = 1``),
  one more unit serves exactly the memory it then holds:
  ``A(s, p′) = A(s, p) + tokens_held(p′)``, and ``A(s, 0) = 0``.  So
  ``A(s, s + o) = g(s, o)``, MODEL.md's exact ``g``.
* **Served area per slot** (behind the instability theorem): for *every*
  decision — the admit and preempt flags are free variables, not a rule —
  the area a slot serves, ``Σ_running A(s, p′) − A(s, p)``, equals the memory
  it charges; so any scheduler that keeps the memory invariant serves at
  most ``M`` token-slots of area per slot.
* **Slot identity of the remaining-area Lyapunov function**: with
  ``V = Σ_queued g + Σ_active (g − A(s, p))``,
  ``V′ = V + Σ_arrivals g − used + wasted`` for every decision, where
  ``wasted = Σ_preempted A(s, p)`` is the area the engine's
  ``attempt_area`` throws away.

The slot-level lemmas treat ``A`` as an uninterpreted function and take, as
premises, instances of the per-request lemma (proved first), which keeps
their queries linear.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import z3

from kvstab.contract import Decision, View
from kvstab.model import progress_after, tokens_held
from kvstab.ops import Ops
from kvstab.proofs.encoding import OPS, Entry, Setting, StepTerms, SymState, encode_step, fresh_state, well_formed
from kvstab.proofs.solver import Budget, Status, solve
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict, passed
from kvstab.symbolic import Sym, unwrap

__all__ = ["FreeDecision", "prove_lemmas"]


#: names the free flags of each call deterministically (``id()`` differs run
#: to run, and z3's models and saved queries depend on variable names)
_TAGS = itertools.count()


@dataclass(frozen=True, slots=True)
class FreeDecision:
    """A 'scheduler' whose every admit/preempt flag is a fresh variable: a
    lemma proved with it holds for every decision any rule can make."""

    name: str = "free-decision"
    description: str = "every admit and preempt flag is a free variable"

    def decide(self, view: View, ops: Ops) -> Decision:
        tag = next(_TAGS)
        return Decision(
            admit=tuple(Sym(z3.Bool(f"admit{j}@{tag}")) for j in range(len(view.waiting))),
            preempt=tuple(Sym(z3.Bool(f"preempt{i}@{tag}")) for i in range(len(view.active))),
        )


def _served2(s: Any, p: Any, c: Any, n: Any, chunk: int) -> z3.ArithRef:
    """Twice the area served up to progress ``p`` (``c = p/ŝ`` in prefill, ``n = ⌈s/ŝ⌉``)."""
    d = p - s
    return z3.If(p < s, chunk * c * (c + 1), chunk * n * (n - 1) + 2 * s + 2 * d * s + d * (d + 1))


def _frame(name: str, prem: list[z3.BoolRef], goal: z3.BoolRef, budget: Budget, conj: str) -> list[Obligation]:
    """A vacuity guard on ``prem``, then ``prem ∧ ¬goal`` unsat — two fresh frames."""
    t0 = time.perf_counter()
    g = solve(prem, budget, f"{name}-premises")
    t1 = time.perf_counter()
    if g.status is not Status.SAT:
        v: Verdict = Unknown("vacuous premises" if g.status is Status.UNSAT else f"solver: {g.reason}", g.smt2)
        return [Obligation(name, v, t1 - t0, conjunct=conj)]
    a = solve(prem + [z3.Not(goal)], budget, name)
    secs = time.perf_counter() - t1
    if a.status is Status.UNSAT:
        v = Proved("unsat")
    elif a.status is Status.SAT:
        v = Refuted(None, f"{conj} is false")
    else:
        v = Unknown(f"solver: {a.reason}", a.smt2)
    return [Obligation(name, v, secs, conjunct=conj)]


def _area_unit(setting: Setting, budget: Budget) -> list[Obligation]:
    ch = setting.chunk
    s, o, p, c, c2, n = z3.Ints("s o p c c2 n")
    pa = unwrap(progress_after(Sym(s), Sym(p), ch, None, OPS))
    wf = [
        s >= 1,
        o >= 1,
        p >= 0,
        p < s + o,
        z3.Implies(p < s, p == ch * c),
        z3.Implies(pa < s, pa == ch * c2),
        (n - 1) * ch < s,
        s <= n * ch,
    ]
    step_ok = _served2(s, pa, c2, n, ch) == _served2(s, p, c, n, ch) + 2 * unwrap(tokens_held(Sym(pa), 1, OPS))
    obs: list[Obligation] = []
    obs += _frame("area/unit", wf + [p < s, pa < s], step_ok, budget, "prefill → prefill")
    # prefill → decode needs the chunk index of the last chunk first (linear)
    obs += _frame("area/unit", wf + [p < s, pa >= s], c == n - 1, budget, "last chunk index c = ⌈s/ŝ⌉ − 1")
    obs += _frame("area/unit", wf + [p < s, pa >= s, c == n - 1], step_ok, budget, "prefill → decode")
    obs += _frame("area/unit", wf + [p >= s], step_ok, budget, "decode → decode")
    obs += _frame(
        "area/unit", [s >= 1, (n - 1) * ch < s, s <= n * ch], _served2(s, 0, 0, n, ch) == 0, budget, "A(s, 0) = 0"
    )
    return obs


def _slot_setup(
    setting: Setting, K: int, Q: int, A: int
) -> tuple[StepTerms, SymState, z3.FuncDeclRef, list[z3.BoolRef]]:
    """A free-decision step from ``K`` active, ``Q`` queued and ``A`` arriving
    requests, the area function ``Area`` and the per-request lemma's instances."""
    before = fresh_state("lem", K, Q + A)
    step = encode_step(FreeDecision(), before, setting, "lem'")
    area = z3.Function("Area", z3.IntSort(), z3.IntSort(), z3.IntSort())
    prem = setting.base_constraints() + [well_formed(before, setting, True)] + step.constraints()
    entries = list(before.active) + list(before.waiting)
    for e, a, r in zip(entries, step.after, step.running):
        # instances of the area-per-unit lemma (proved by _area_unit)
        prem.append(z3.Implies(r, area(e.s, a) == area(e.s, e.p) + held_b1(a)))
    for e in entries + list(step.post.active) + list(step.post.waiting):
        prem.append(area(e.s, 0) == 0)
    return step, before, area, prem


def held_b1(x: Any) -> z3.ArithRef:
    """Tokens held with ``B = 1``."""
    return unwrap(tokens_held(Sym(unwrap(x)), 1, OPS))


def _g(area: z3.FuncDeclRef, e: Entry) -> z3.ArithRef:
    return area(e.s, e.s + e.o)


def _served_per_slot(setting: Setting, budget: Budget, K: int, Q: int) -> list[Obligation]:
    step, before, area, prem = _slot_setup(setting, K, Q, 0)
    entries = list(before.active) + list(before.waiting)
    served = z3.Sum([z3.If(r, area(e.s, a) - area(e.s, e.p), 0) for e, a, r in zip(entries, step.after, step.running)])
    obs = _frame(
        "served/slot", prem, served == step.charged, budget, "area served in a slot = memory charged (any decision)"
    )
    obs += _frame(
        "served/slot",
        prem + [step.charged <= setting.M_term],
        served <= setting.M_term,
        budget,
        "a decision that keeps memory ≤ M serves ≤ M area",
    )
    return obs


def _lyapunov(
    setting: Setting, budget: Budget, K: int, Q: int, A: int, *, wasted_term: bool = True
) -> list[Obligation]:
    step, before, area, prem = _slot_setup(setting, K, Q, A)
    queued, arriving = before.waiting[:Q], before.waiting[Q:]

    def remaining(st_active: Any, st_waiting: Any) -> z3.ArithRef:
        return z3.Sum(
            [z3.If(e.present, _g(area, e), 0) for e in st_waiting]
            + [z3.If(e.present, _g(area, e) - area(e.s, e.p), 0) for e in st_active]
            + [z3.IntVal(0)]
        )

    V = remaining(before.active, queued)
    V_next = remaining(step.post.active, step.post.waiting)
    arrivals_g = z3.Sum([z3.If(e.present, _g(area, e), 0) for e in arriving] + [z3.IntVal(0)])
    wasted = z3.Sum([z3.If(pre_i, area(e.s, e.p), 0) for e, pre_i in zip(before.active, step.preempt)] + [z3.IntVal(0)])
    # a finished request leaves V with g − A(s, s + o) = 0: the post state drops it
    return _frame(
        "lyapunov",
        prem,
        V_next == V + arrivals_g - step.charged + (wasted if wasted_term else 0),
        budget,
        "V′ = V + Σ_arrivals g − used + wasted (any decision)",
    )


def prove_lemmas(
    setting: Setting, *, K: int = 3, Q: int = 2, A: int = 2, budget: Budget | None = None
) -> tuple[Verdict, list[Obligation]]:
    """Prove the three lemmas; ``Proved`` only if every obligation is."""
    budget = budget or Budget()
    if setting.block != 1:
        return Unknown("the area lemmas are stated for B = 1 (MODEL.md's g)"), []
    obs = _area_unit(setting, budget)
    obs += _served_per_slot(setting, budget, K, Q)
    obs += _lyapunov(setting, budget, K, Q, A)
    bad = [o for o in obs if not passed(o.verdict)]
    if bad:
        return bad[0].verdict, obs
    return (
        Proved(
            "case split (per-request, non-linear) + uninterpreted area with lemma instances (per slot)",
            setting.assumptions() + (f"K = {K} active, Q = {Q} queued, {A} arrivals", "full-unit grants"),
        ),
        obs,
    )
