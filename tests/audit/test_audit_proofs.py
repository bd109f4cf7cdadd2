"""The audit's proofs section: the unbounded theorem where the rule is in its class, else the bounded proof,
and the scope of each said in the report."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from kvstab.audit.audit import _check_proofs, proofs_section
from kvstab.audit.profiles import get_profile
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler

PARAMS = ModelParams(M=4096, chunk=512, block=1)


@pytest.mark.parametrize(
    ("name", "params"),
    [("current-fit", PARAMS), ("vllm-v1", ModelParams(M=4096, chunk=512, block=16, token_budget=2048, max_num_seqs=8))],
)
def test_a_rule_in_the_class_is_proved_for_any_number_of_requests(name: str, params: ModelParams, tmp_path: Path) -> None:
    lines: list[str] = []
    sec = proofs_section(load_scheduler(name), name, params, get_profile("dev"), tmp_path, lines.append)
    inv = sec.invariant
    assert type(inv.verdict).__name__ == "Proved" and inv.unbounded is True
    assert inv.scope == "any number of requests" and inv.total_budget_s == 60.0
    assert not any("K = " in a for a in inv.assumptions)
    check = _check_proofs(sec)[0]
    assert check.status == "pass" and check.detail == "Proved for any number of requests"


def test_a_rule_outside_it_falls_back_to_the_bounded_proof_with_its_scope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a plug-in that iterates its preempt flags itself (ops.or_(*preempt)): outside the prefix-fold class
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "proofs"))
    sys.modules.pop("proof_plugins", None)
    from proof_plugins import RATIO_RESERVE

    tiny = dataclasses.replace(get_profile("dev"), proof_K=2, proof_Q=1)
    sec = proofs_section(RATIO_RESERVE, "proof_plugins:RATIO_RESERVE", PARAMS, tiny, tmp_path)
    inv = sec.invariant
    assert type(inv.verdict).__name__ == "Proved" and inv.unbounded is False
    assert inv.scope == "at most 2 active and 1 queued requests"
    assert any("not proved for every number of requests" in n for n in inv.notes)
    assert _check_proofs(sec)[0].detail == "Proved for at most 2 active and 1 queued requests"


def test_the_audit_checks_what_a_rule_declares_and_fails_a_rule_that_reads_o_while_declaring_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memory-safe (it admits while the peaks s + o fit) but declared non-clairvoyant: the memory
    # invariant is proved, and only the two-copy claim catches the rule reading o
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "proofs"))
    sys.modules.pop("claims_plugins", None)
    from claims_plugins import PEAK_CHECK_FOLDS

    sec = proofs_section(PEAK_CHECK_FOLDS, "claims_plugins:PEAK_CHECK_FOLDS", PARAMS, get_profile("dev"), tmp_path)
    assert type(sec.invariant.verdict).__name__ == "Proved"
    checks = {c.name: c for c in _check_proofs(sec)}
    bad = checks["claim: non-clairvoyant"]
    assert bad.status == "fail" and bad.detail.startswith("Refuted for ")
    assert sec.claims is not None
    claim = next(c for c in sec.claims.claims if c.claim == "non-clairvoyant")
    assert claim.replay_commands and all(cmd.startswith("kvstab replay") for cmd in claim.replay_commands)
    # the sound built-in: every declared claim passes, for any number of requests
    good = proofs_section(load_scheduler("current-fit"), "current-fit", PARAMS, get_profile("dev"), tmp_path)
    claims = [c for c in _check_proofs(good) if c.name.startswith("claim: ")]
    assert {c.name for c in claims} >= {"claim: FCFS admissions", "claim: non-clairvoyant"}
    assert all(c.status == "pass" and c.detail.endswith("any number of requests") for c in claims), claims
