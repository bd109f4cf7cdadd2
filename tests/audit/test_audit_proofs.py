"""The audit's proofs section: the unbounded theorem where the rule is in its class, else the bounded proof,
and the scope of each said in the report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvstab.audit.audit import _check_proofs, proofs_section
from kvstab.audit.profiles import get_profile
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler

PARAMS = ModelParams(M=4096, chunk=512, block=1)


def test_a_rule_in_the_class_is_proved_for_any_number_of_requests(tmp_path: Path) -> None:
    lines: list[str] = []
    sec = proofs_section(load_scheduler("current-fit"), "current-fit", PARAMS, get_profile("dev"), tmp_path, lines.append)
    inv = sec["invariant"]
    assert inv["verdict"] == "Proved" and inv["unbounded"] is True
    assert inv["scope"] == "any number of requests" and inv["total_budget_s"] == 60.0
    assert not any("K = " in a for a in inv["assumptions"])
    check = _check_proofs(sec)[0]
    assert check.status == "pass" and check.detail == "Proved for any number of requests"


def test_a_rule_outside_it_falls_back_to_the_bounded_proof_with_its_scope(tmp_path: Path) -> None:
    tiny = dataclasses.replace(get_profile("dev"), proof_K=2, proof_Q=1)
    sec = proofs_section(load_scheduler("vllm-v1"), "vllm-v1", PARAMS, tiny, tmp_path)
    inv = sec["invariant"]
    assert inv["verdict"] == "Proved" and inv["unbounded"] is False
    assert inv["scope"] == "at most 2 active and 1 queued requests"
    assert any("not proved for every number of requests" in n for n in inv["notes"])
    assert _check_proofs(sec)[0].detail == "Proved for at most 2 active and 1 queued requests"
