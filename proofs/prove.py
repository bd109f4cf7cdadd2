"""``prove``: the memory invariant of one scheduler, proved or refuted.

1. 1-induction of the base invariant (well-formed ∧ memory ≤ ``M``) with the
   user's extra conjuncts;
2. if that fails and Houdini is on, the menu's candidates are pruned to an
   inductive set and the strengthened invariant is proved again, in full;
   (when the first attempt's counterexample to induction breaks the memory
   goal itself, a short bounded search for a reachable run comes first);
3. if the invariant is still not proved, bounded model checking from the
   empty system separates a **reachable** violation (``Refuted``, replayed in
   the simulator) from a counterexample to induction only (``Unknown``: the
   invariant may hold but this method cannot show it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument
from kvstab.proofs.bmc import bmc
from kvstab.proofs.encoding import Setting, check_bounds
from kvstab.proofs.induction import check_inductive, houdini
from kvstab.proofs.invariants import Conjunct, menu
from kvstab.proofs.replaying import SEARCH_TRIES, search_shared
from kvstab.proofs.solver import Budget
from kvstab.proofs.unbounded import prove_unbounded
from kvstab.proofs.verdicts import Obligation, Proved, Refuted, Unknown, Verdict
from kvstab.registry import load_scheduler, registry

__all__ = ["ProofReport", "prove", "resolve"]

#: slots of the quick reachability search run before Houdini
QUICK_BMC = 2


@dataclass(frozen=True, slots=True)
class ProofReport:
    """Everything ``prove`` did: the verdict, every obligation, the strengthening."""

    scheduler: str
    spec: str | None
    K: int
    Q: int
    setting: Setting
    verdict: Verdict
    obligations: tuple[Obligation, ...]
    strengthening: tuple[str, ...] = ()
    houdini_log: tuple[str, ...] = ()
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    #: the verdict holds for every number of active and queued requests
    unbounded: bool = False
    #: what the unbounded proof rests on: each fold's loop invariant, or the state invariant it keeps
    invariants: tuple[str, ...] = field(default=())


def resolve(scheduler: str | Scheduler) -> tuple[Scheduler, str | None]:
    """The scheduler object and the spec a replay command can load it by."""
    if isinstance(scheduler, str):
        return load_scheduler(scheduler), scheduler
    name = getattr(scheduler, "name", None)
    reg = registry()
    if isinstance(name, str) and name in reg and reg.get(name) is scheduler:
        return scheduler, name
    return scheduler, None


def prove(
    scheduler: str | Scheduler,
    *,
    K: int = 8,
    Q: int = 4,
    bmc_depth: int = 12,
    setting: Setting | None = None,
    strengthen: Sequence[Conjunct] = (),
    use_houdini: bool = True,
    arrivals_per_slot: int = 2,
    budget: Budget | None = None,
    unbounded: bool = False,
) -> ProofReport:
    """Prove or refute that ``scheduler`` keeps every slot's memory within ``M``.

    With ``unbounded``, the prefix-fold theorem (:mod:`kvstab.proofs.unbounded`)
    is tried first: for a rule in its class (a rule that reads the view's
    sequences only through ``kvstab.contract``'s folds) it proves the invariant
    for every number of requests.  A rule outside the class (or whose
    obligations are not all proved) gets the bounded flow, and the report's
    ``notes`` say so.
    """
    check_bounds(K, Q)
    setting = setting or Setting()
    # a total budget's clock starts here unless the caller started it (its other phases share it)
    budget = (budget or Budget()).started()
    sched, spec = resolve(scheduler)
    t0 = time.perf_counter()
    obs: list[Obligation] = []
    hlog: list[str] = []
    notes: list[str] = []
    if setting.prefix_caching:
        return _with_caching(sched, spec, K, Q, setting, strengthen, budget, unbounded, t0)
    if unbounded:
        budget.group("unbounded: class premises and per-request obligations")
        ub = prove_unbounded(sched, setting, budget)
        obs += ub.obligations
        if isinstance(ub.verdict, Proved) and not strengthen:
            rep = _report(sched, spec, K, Q, setting, ub.verdict, obs, [], hlog, t0, notes, unbounded=True)
            return dataclasses.replace(rep, invariants=ub.invariants)
        why = ub.verdict.reason if isinstance(ub.verdict, Unknown) else str(ub.verdict)
        if strengthen:
            why = "user strengthenings are proved by the bounded flow"
        notes.append(f"not proved for every number of requests ({why}); the verdict below is bounded by K and Q")
    rep = _bounded(sched, spec, K, Q, bmc_depth, setting, strengthen, use_houdini, arrivals_per_slot, budget, obs, hlog, t0)
    return dataclasses.replace(rep, notes=tuple(notes) + rep.notes)


def _with_caching(
    sched: Scheduler,
    spec: str | None,
    K: int,
    Q: int,
    setting: Setting,
    strengthen: Sequence[Conjunct],
    budget: Budget,
    unbounded: bool,
    t0: float,
) -> ProofReport:
    """Prefix caching: the prefix-fold theorem over views with shared blocks, else a
    search for a shared-prefix run that breaks the pool's invariant (the bounded
    encoding has no block pool, so its verdict would be about another model)."""
    from kvstab.schedulers import Sglang

    if isinstance(sched, Sglang):
        # sglang with caching is SGLang's radix cache (kvstab.lifecycles.sglang_radix): its tree, lock
        # counts and LRU eviction are not the block pool the shared-block views encode, so a verdict
        # here would be about another engine
        raise InvalidArgument(
            "--prefix-caching on: the scheduler is sglang, whose cache is SGLang's radix cache, and kvstab prove "
            "encodes vLLM's block pool only; prove sglang with --prefix-caching off"
        )
    if not unbounded or strengthen:
        raise InvalidArgument(
            "with prefix caching kvstab prove proves for any number of requests only (the bounded encoding has no "
            "block pool): drop --bounded and --strengthen, or prove with --prefix-caching off"
        )
    budget.group("unbounded with prefix caching: class premises and per-request obligations")
    ub = prove_unbounded(sched, setting, budget)
    obs = list(ub.obligations)
    if isinstance(ub.verdict, Proved):
        rep = _report(sched, spec, K, Q, setting, ub.verdict, obs, [], [], t0, (), unbounded=True)
        return dataclasses.replace(rep, invariants=ub.invariants)
    why = ub.verdict.reason if isinstance(ub.verdict, Unknown) else str(ub.verdict)
    budget.group("prefix caching: a search over shared-prefix workloads on the reference engine")
    left = budget.left()
    trace = search_shared(sched, spec, setting, seed=budget.seed, seconds=left)
    notes = (f"not proved for every number of requests ({why})",)
    if trace is None:
        verdict: Verdict = Unknown(
            f"not proved with prefix caching ({why}), and {SEARCH_TRIES} shared-prefix workloads found no counterexample"
        )
    else:
        verdict = Refuted(trace)
        obs.append(Obligation("prefix caching", verdict, 0.0, conjunct="memory ≤ M on a shared-prefix run"))
    return _report(sched, spec, K, Q, setting, verdict, obs, [], [], t0, notes, unbounded=True)


def _bounded(
    sched: Scheduler,
    spec: str | None,
    K: int,
    Q: int,
    bmc_depth: int,
    setting: Setting,
    strengthen: Sequence[Conjunct],
    use_houdini: bool,
    arrivals_per_slot: int,
    budget: Budget,
    obs: list[Obligation],
    hlog: list[str],
    t0: float,
) -> ProofReport:
    """The bounded flow: 1-induction, quick BMC, Houdini, BMC (each phase only
    while the total budget lasts; a spent budget ends in an ``Unknown`` that says so)."""

    budget.group(f"1-induction at K = {K}, Q = {Q}")
    first = check_inductive(sched, setting, K, Q, strengthen, budget=budget, spec=spec, fail_fast=use_houdini)
    obs += first.obligations
    if isinstance(first.verdict, Proved):
        return _report(sched, spec, K, Q, setting, first.verdict, obs, [c.name for c in strengthen], hlog, t0)

    verdict: Verdict = first.verdict
    names = [c.name for c in strengthen]
    quick = min(bmc_depth, QUICK_BMC)
    if budget.spent():
        return _report(sched, spec, K, Q, setting, _out_of_budget(K, "1-induction", obs, budget), obs, names, hlog, t0)
    if isinstance(first.verdict, Refuted) and first.verdict.trace is not None:
        # the memory goal itself has a counterexample to induction: look for a
        # short reachable run first, before paying for a strengthening search
        # (small bounds: any run it finds is real, and small runs are cheap)
        budget.group(f"reachability: BMC to depth {quick} at K = {min(K, 2)}, Q = {min(Q, 2)}")
        reach, bobs = bmc(
            sched, setting, min(K, 2), min(Q, 2), quick, arrivals_per_slot=arrivals_per_slot, budget=budget, spec=spec
        )
        obs += bobs
        if isinstance(reach, Refuted):
            return _report(sched, spec, K, Q, setting, reach, obs, names, hlog, t0)
    if use_houdini:
        cands = [c for c in menu() if c.name not in names]
        # one candidate at a time first (cheap, and what a policy usually needs),
        # then Houdini over the whole menu
        survivors = None
        for group in [[c] for c in cands] + ([cands] if len(cands) > 1 else []):
            if budget.spent():
                break
            budget.group(f"Houdini: {', '.join(repr(c.name) for c in group)}")
            survivors, log = houdini(sched, setting, K, Q, list(strengthen), group, budget=budget)
            hlog += log
            if survivors is not None:
                break
        if survivors is not None and not budget.spent():
            budget.group(f"1-induction at K = {K}, Q = {Q}, strengthened by {', '.join(c.name for c in survivors)}")
            second = check_inductive(
                sched,
                setting,
                K,
                Q,
                list(strengthen) + survivors,
                budget=budget,
                spec=spec,
                method="1-induction, strengthened by Houdini",
            )
            obs += second.obligations
            names += [c.name for c in survivors]
            if isinstance(second.verdict, Proved):
                return _report(sched, spec, K, Q, setting, second.verdict, obs, names, hlog, t0)
            verdict = second.verdict

    if budget.spent():
        return _report(sched, spec, K, Q, setting, _out_of_budget(K, "the strengthening search", obs, budget), obs, names, hlog, t0)
    budget.group(f"bounded model checking to depth {bmc_depth} at K = {K}, Q = {Q}")
    reach, bobs = bmc(sched, setting, K, Q, bmc_depth, arrivals_per_slot=arrivals_per_slot, budget=budget, spec=spec)
    obs += bobs
    if budget.spent() and not isinstance(reach, Refuted):
        return _report(sched, spec, K, Q, setting, _out_of_budget(K, "bounded model checking", obs, budget), obs, names, hlog, t0)
    if isinstance(reach, Refuted):
        final: Verdict = reach
    elif isinstance(reach, Unknown):
        final = reach
    else:
        why = str(verdict.detail) if isinstance(verdict, Refuted) else str(verdict)
        smt2 = next((str(o.info["smt2"]) for o in obs if "smt2" in o.info), None)
        final = Unknown(
            f"not proved ({why}; no strengthening in the menu) and no violation reachable within "
            f"{bmc_depth} slots from the empty system",
            smt2,
        )
    return _report(sched, spec, K, Q, setting, final, obs, names, hlog, t0)


def _out_of_budget(K: int, phase: str, obs: list[Obligation], budget: Budget) -> Unknown:
    """The verdict of a run whose total budget ran out: an honest ``Unknown``, naming
    the first undecided obligation and what to change."""
    open_ = next((o for o in obs if isinstance(o.verdict, Unknown) and not o.verdict.reason.startswith("total")), None)
    first = next((o for o in obs if not isinstance(o.verdict, Proved)), None)
    which = open_ or first
    what = f"; first undecided: {which.label()} ({which.verdict})" if which is not None else ""
    smt2 = next((o.verdict.smt2 for o in obs if isinstance(o.verdict, Unknown) and o.verdict.smt2), None)
    return Unknown(
        f"not proved within the total budget of {budget.total_s:g} s{budget.kept_note()} (spent during {phase}{what}); "
        f"raise --total-timeout or --rlimit, or prove at smaller bounds (--K {max(1, K // 2)})",
        smt2,
    )


def _report(
    sched: Scheduler,
    spec: str | None,
    K: int,
    Q: int,
    setting: Setting,
    verdict: Verdict,
    obs: list[Obligation],
    names: list[str],
    hlog: list[str],
    t0: float,
    notes: Sequence[str] = (),
    *,
    unbounded: bool = False,
) -> ProofReport:
    return ProofReport(
        scheduler=sched.name,
        spec=spec,
        K=K,
        Q=Q,
        setting=setting,
        verdict=verdict,
        obligations=tuple(obs),
        strengthening=tuple(names),
        houdini_log=tuple(hlog),
        seconds=time.perf_counter() - t0,
        notes=tuple(notes),
        unbounded=unbounded,
    )
