"""sglang (a stateful rule with a real-valued ratio): its memory invariant is inductive as it is, and the
retraction it keeps for safety is reachable even though it knows every output length."""

from __future__ import annotations

from pathlib import Path

from kvstab.arrivals import fixed_arrivals
from kvstab.model import ModelParams
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
from kvstab.proofs.verdicts import Proved
from kvstab.registry import load_scheduler
from kvstab.simulator import simulate


def test_sglang_memory_invariant_is_proved_without_strengthening(tmp_path: Path) -> None:
    rep = prove("sglang", K=2, Q=1, budget=Budget(smt2_dir=tmp_path, total_s=120.0), unbounded=True)
    assert isinstance(rep.verdict, Proved), rep.verdict
    assert rep.strengthening == () and rep.verdict.method == "1-induction"
    # the ratio's declared bounds are part of the invariant, and preserved
    assert any(o.conjunct == "state new_token_ratio ∈ [0.0, 1.0]′" and o.branch == "preempts" for o in rep.obligations)
    assert any("outside the prefix-fold class" in n for n in rep.notes)


def test_sglang_retracts_although_it_knows_every_output_length() -> None:
    # found by a seeded random search (docs/proofs.md): the reservation counts the running requests'
    # remaining outputs at new_token_ratio (0.7, decaying), not in full, so decode can run out of memory
    plan = fixed_arrivals([(2, 9, 47), (5, 1, 20), (10, 5, 26)])
    # check=True: the engine checks memory ≤ M in every slot, so the run also shows the invariant kept
    res = simulate(load_scheduler("sglang"), ModelParams(M=81, chunk=8, block=1), plan, drain=True, check=True)
    assert int(res.preemptions.sum()) >= 1
