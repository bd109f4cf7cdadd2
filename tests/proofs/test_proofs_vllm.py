"""The ``vllm-v1`` rule is audited by z3 like the other built-ins.

This check found a real bug: the rule once summed the post-step memory of
*every* active entry, empty slots included.  On the simulator's views (every
entry present) that is harmless, so no simulation could see it; on the z3
encoding an empty slot carries arbitrary values and the rule admitted into
memory it did not have.  The regression test keeps that rule shape out.
"""

from __future__ import annotations

import dataclasses

from kvstab.proofs.encoding import Setting
from kvstab.proofs.prove import prove
from kvstab.proofs.solver import Budget
from kvstab.proofs.verdicts import Proved


def test_vllm_v1_is_proved(setting: Setting, budget: Budget) -> None:
    rep = prove("vllm-v1", K=3, Q=2, bmc_depth=2, setting=setting, budget=budget)
    assert isinstance(rep.verdict, Proved), rep.verdict


def test_vllm_v1_is_proved_under_a_token_budget(setting: Setting, budget: Budget) -> None:
    budgeted = dataclasses.replace(setting, token_budget=512)
    rep = prove("vllm-v1", K=3, Q=2, bmc_depth=2, setting=budgeted, budget=budget)
    assert isinstance(rep.verdict, Proved), rep.verdict
    assert any("token budget" in a for a in rep.verdict.assumptions)


def test_vllm_v1_is_proved_with_a_running_cap(setting: Setting, budget: Budget) -> None:
    """With ``max_num_seqs`` the base invariant carries the cap on active requests
    (else a state with more active requests than the cap is a spurious CTI)."""
    capped = dataclasses.replace(setting, token_budget=512, max_num_seqs=2)
    rep = prove("vllm-v1", K=3, Q=2, bmc_depth=2, setting=capped, budget=budget)
    assert isinstance(rep.verdict, Proved), rep.verdict
    assert any("max_num_seqs = 2" in a for a in rep.verdict.assumptions)
