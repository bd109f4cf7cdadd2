"""sglang (a stateful rule with a real-valued ratio and retraction): its memory invariant is proved
for any number of requests (the fold theorem, case by case, with the retraction lemma), is inductive
as it is at bounded size, and the retraction it keeps for safety is reachable even though it knows
every output length.  Each premise of the unbounded proof has a mutant that is not proved and that
a run refutes."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import z3

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import ActiveEntry, View, retract_until_fits
from kvstab.errors import InvalidScheduler, InvariantViolation
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE
from kvstab.proofs.encoding import OPS, Setting
from kvstab.proofs.loops import retraction_lemma
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
from kvstab.proofs.unbounded import prove_unbounded
from kvstab.proofs.verdicts import Proved, Unknown, passed
from kvstab.registry import load_scheduler
from kvstab.simulator import Engine, simulate
from kvstab.symbolic import Sym, unwrap

HERE = Path(__file__).resolve().parent

#: the workload of the seeded search in docs/proofs.md on which sglang retracts
RETRACTS = [(2, 9, 47), (5, 1, 20), (10, 5, 26)]


@pytest.fixture()
def folds(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("fold_plugins", None)
    import fold_plugins

    return fold_plugins


def test_sglang_is_proved_for_any_number_of_requests(budget: Budget) -> None:
    """A running cap (B = 16 too: docs/proofs.md): the verdict names no K or Q, the slot is split into
    the prefill step (the chunk walk hosts the grants) and the decode step with or without a
    retraction, and the retraction lemma and its premises are obligations of the proof."""
    r = prove_unbounded(load_scheduler("sglang"), Setting(max_num_seqs=4), budget)
    assert isinstance(r.verdict, Proved), r.verdict
    text = " ".join(r.verdict.assumptions)
    assert "K =" not in text and "Q =" not in text and "no K, no Q" in text
    assert "retraction 0" in text and "where 0 < in_batch@fold" in text
    assert all(passed(o.verdict) for o in r.obligations)
    conjuncts = {o.conjunct for o in r.obligations}
    assert {"the pop order is a strict total order", "the kept requests cost ≤ cap",
            "every request's cost ∈ [0, cap]", "cap ≥ 0"} <= conjuncts
    # the prefill step is not a retracting one, and the three other cases are proved
    assert any(c.endswith("retraction 0 runs: cannot occur") for c in conjuncts)
    for case in ("0 < in_batch@fold7, retraction 0 cannot run", "¬(0 < in_batch@fold7), retraction 0 runs",
                 "¬(0 < in_batch@fold7), retraction 0 cannot run"):
        assert f"memory charged in the slot ≤ M; {case}" in conjuncts
        assert f"running ≤ max_num_seqs; {case}" in conjuncts
        assert f"state new_token_ratio′ ∈ [0.0, 1.0]; {case}" in conjuncts
    # the walks' loop invariants the argument names (docs/proofs.md)
    chunk = next(i for i in r.invariants if "continue_chunk" in i and "with the charge" in i)
    for atom in ("Σgrowth ≤ used", "used ≤ free", "Σcharge = Σheld + Σgrowth"):
        assert atom in chunk, chunk
    queue = next(i for i in r.invariants if "admit_one" in i and "with the charge" in i)
    for atom in ("Σgrowth ≤ used", "in_batch ≤ in_batch₀ ⇒ used ≤ used₀", "Σcharge − Σgrowth ≤ Σcharge₀ − Σgrowth₀",
                 "#running − in_batch ≤ #running₀ − in_batch₀"):
        assert atom in queue, queue
    decode = next(i for i in r.invariants if "decode_one" in i and "retraction 0 runs" in i)
    assert "Σcharge = Σkept0" in decode, decode


def test_sglang_memory_invariant_is_inductive_without_strengthening(tmp_path: Path) -> None:
    """The bounded proof (``--bounded``): the base invariant is 1-inductive as it is."""
    rep = prove("sglang", K=2, Q=1, budget=Budget(smt2_dir=tmp_path, total_s=120.0), unbounded=False)
    assert isinstance(rep.verdict, Proved), rep.verdict
    assert rep.strengthening == () and rep.verdict.method == "1-induction"
    # the ratio's declared bounds are part of the invariant, and preserved
    assert any(o.conjunct == "state new_token_ratio ∈ [0.0, 1.0]′" and o.branch == "preempts" for o in rep.obligations)


def test_sglang_retracts_although_it_knows_every_output_length() -> None:
    # found by a seeded random search (docs/proofs.md): the reservation counts the running requests'
    # remaining outputs at new_token_ratio (0.7, decaying), not in full, so decode can run out of memory
    plan = fixed_arrivals(RETRACTS)
    # check=True: the engine checks memory ≤ M in every slot, so the run also shows the invariant kept
    res = simulate(load_scheduler("sglang"), ModelParams(M=81, chunk=8, block=1), plan, drain=True, check=True)
    assert int(res.preemptions.sum()) >= 1


def _state_run(sched, M: int, active, waiting=(), state=None):  # type: ignore[no-untyped-def]
    """One slot of the reference engine from a given state (as a counterexample to induction replays)."""
    e = Engine(sched, ModelParams(M=M, chunk=8, block=1), check=True)
    e.load_state(active=list(active), waiting=list(waiting), sched_state=state)
    return e.step()


@pytest.mark.parametrize(
    ("mutant", "fails", "breaks"),
    [
        # the chunk walk: a continuation takes its whole chunk when the adder's budget is spent
        ("SGLANG_UNCLAMPED_CHUNK", "memory charged in the slot ≤ M; 0 < ", "state"),
        # the retraction: its cost forgets the decode token's new page
        ("SGLANG_RETRACT_FORGETS_PAGE", "memory charged in the slot ≤ M; ¬(0 < ", "run"),
        # the state: the estimate after a retraction is not clipped to 1
        ("SGLANG_RATIO_UNCLIPPED", "new_token_ratio′ ∈ [0.0, 1.0]", "run"),
        # the case split: a batch of one request is taken for a decode step
        ("SGLANG_PREFILL_OFF_BY_ONE", "memory charged in the slot ≤ M; ¬(1 < ", "state"),
    ],
)
def test_each_premise_of_the_sglang_proof_has_a_mutant_that_is_not_proved_and_breaks(
    folds, mutant: str, fails: str, breaks: str, budget: Budget  # type: ignore[no-untyped-def]
) -> None:
    sched = getattr(folds, mutant)
    r = prove_unbounded(sched, Setting(), budget)
    assert r.check.member and isinstance(r.verdict, Unknown), r.verdict
    assert fails in r.verdict.reason, r.verdict.reason
    if breaks == "run":  # from the empty system: the run on which sglang itself retracts
        with pytest.raises((InvariantViolation, InvalidScheduler)):
            simulate(sched, ModelParams(M=66, chunk=8, block=1), fixed_arrivals([(0, 18, 27), (3, 1, 24), (8, 6, 44)]),
                     drain=True, check=True)
        simulate(load_scheduler("sglang"), ModelParams(M=66, chunk=8, block=1),
                 fixed_arrivals([(0, 18, 27), (3, 1, 24), (8, 6, 44)]), drain=True, check=True)
        return
    # from a state, as a counterexample to induction is replayed (sglang keeps memory on it)
    if mutant == "SGLANG_UNCLAMPED_CHUNK":
        # a chunk in flight while the running request's reservation exceeds free memory
        case = dict(M=20, active=[(16, 4, 8), (2, 17, 5)])
    else:
        # five requests with one output left at the decayed ratio, and a head that fits the reservation
        case = dict(M=17, active=[(1, 2, 2)] * 5, waiting=[(3, 1)], state=(0.098, 0))
    assert _state_run(load_scheduler("sglang"), **case).memory <= case["M"]  # type: ignore[operator]
    with pytest.raises(InvariantViolation, match="tokens of KV memory"):
        _state_run(sched, **case)  # type: ignore[arg-type]


def _pop_one_by_one(costs: list[int], keys: list[tuple[int, ...]], cap: int) -> list[bool]:
    """retract_until_fits as SGLang runs it: sort by descending key (stable), pop from the end while
    the rest does not fit, keep one."""
    order = sorted(range(len(costs)), key=lambda i: keys[i], reverse=True)  # stable: ties keep list order
    popped = [False] * len(costs)
    rest = list(order)
    while len(rest) > 1 and sum(costs[i] for i in rest) > cap:
        popped[rest.pop()] = True
    return popped


def test_retract_until_fits_is_popping_one_by_one_concretely_and_symbolically() -> None:
    """The combinator's pairwise flags (what z3 and the tape unroll) are the sequential loop, and
    the requests kept cost at most cap whenever each costs at most cap (the retraction lemma)."""
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 6)
        costs = [rng.randint(0, 9) for _ in range(n)]
        keys = [(rng.randint(0, 2), rng.randint(0, 2)) for _ in range(n)]
        cap = rng.randint(0, 20)
        # an entry carries its cost as s and its key as (o, progress)
        view = View(tuple(ActiveEntry(i, costs[i], keys[i][0], keys[i][1]) for i in range(n)), (), 100, 8)
        flags = retract_until_fits(view, CONCRETE, lambda a: a.s, lambda a: (a.o, a.progress), cap)
        assert list(flags) == _pop_one_by_one(costs, keys, cap)
        if all(c <= cap for c in costs):
            assert sum(c for c, f in zip(costs, flags) if not f) <= cap
        if n:
            assert not all(flags)  # never the last one
    # symbolically (z3, as the bounded encoding and the tape see it): the same flags
    n, cap = 4, 10
    costs = [z3.Int(f"c{i}") for i in range(n)]
    keys = [(z3.Int(f"k{i}"),) for i in range(n)]
    view = View(tuple(ActiveEntry(i, 1, 1, 1) for i in range(n)), (), 100, 8)
    sym = retract_until_fits(view, OPS, lambda a: Sym(costs[a.rid]), lambda a: (Sym(keys[a.rid][0]),), cap)
    for _ in range(40):
        cv = [rng.randint(0, 6) for _ in range(n)]
        kv = [(rng.randint(0, 1),) for _ in range(n)]
        sub = [(costs[i], z3.IntVal(cv[i])) for i in range(n)] + [(keys[i][0], z3.IntVal(kv[i][0])) for i in range(n)]
        got = [z3.is_true(z3.simplify(z3.substitute(unwrap(f), *sub))) for f in sym]
        assert got == _pop_one_by_one(cv, kv, cap)


def test_an_order_that_is_not_total_breaks_the_retraction_lemma(monkeypatch: pytest.MonkeyPatch, budget: Budget) -> None:
    """The bound needs only that the pop order is total; without its tie-break two requests with
    equal keys are each 'last', neither is popped, and together they overflow."""
    import kvstab.contract as contract
    import kvstab.contract.preemption as preemption

    assert all(passed(o.verdict) for o in retraction_lemma(2, budget))

    def no_tie_break(ops, kj, ki, j_later):  # type: ignore[no-untyped-def]
        return contract_pops_before(ops, kj, ki, False)

    contract_pops_before = contract.pops_before
    monkeypatch.setattr(contract, "pops_before", no_tie_break)  # what retraction_lemma imports
    monkeypatch.setattr(preemption, "pops_before", no_tie_break)  # what retract_until_fits calls
    obs = retraction_lemma(2, budget)
    assert any(o.conjunct == "the pop order is a strict total order" and not passed(o.verdict) for o in obs)
    view = View((ActiveEntry(0, 1, 1, 1), ActiveEntry(1, 1, 1, 1)), (), 10, 8)
    flags = retract_until_fits(view, CONCRETE, lambda a: 6, lambda a: (0,), 10)
    assert flags == (False, False)  # both kept: 12 > cap
