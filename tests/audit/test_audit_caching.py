"""The audit and the sweep with prefix caching (issue 25): ``--prefix-caching on|off`` defaulting as the
engine modelled, λ* with and without caching side by side on a workload with prefix structure, and μ
said to be the no-sharing formula with measured/μ beside it, in every output."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from _audit_support import LEAN

from kvstab.audit.audit import AuditConfig, caching_lines, run_audit
from kvstab.audit.runs import poisson_plan, run_model, trace_plan
from kvstab.cli import main
from kvstab.data import trace_path
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.workload import parse_workload

#: a prompt of 40–48 tokens of which 32 are one system prompt shared by every request: with caching
#: the shared blocks count once against M and skip their prefill, so vllm-v1 serves far more than μ
SHARED = "s=U(40,48),o=U(4,8),prefix=shared(32)"
SERVER = ModelParams(M=480, chunk=16, block=4, bbar=0.05)
SMALL = ["--M", "480", "--chunk", "16", "--block", "4", "--bbar", "0.05"]


def _audit(params: ModelParams, workload: str = SHARED) -> dict[str, Any]:
    config = AuditConfig("vllm-v1", params, workload, baselines=(), profile=LEAN, skip=("proofs", "properties"))
    return run_audit(config).to_json()


@pytest.fixture(scope="module")
def cached() -> dict[str, Any]:
    """The audit of vllm-v1 with caching on (as vLLM runs by default) on the shared-prompt workload."""
    return _audit(ModelParams(M=480, chunk=16, block=4, bbar=0.05, prefix_caching=True))


def test_caching_raises_lambda_star_on_a_shared_prompt_and_both_are_reported(cached: dict[str, Any]) -> None:
    pc = cached["prefix_caching"]
    assert pc["enabled"] and cached["server"]["prefix_caching"]
    cmp_ = pc["comparison"]
    on, off = cmp_["with_caching"], cmp_["without_caching"]
    # the two intervals lie apart, with caching well above: 32 of ~44 prompt tokens are shared
    assert on["critical_rate_ci_per_s"][0] > off["critical_rate_ci_per_s"][1], cmp_
    assert cmp_["ratio_with_over_without"] > 1.5, cmp_
    # the run's own search is the caching-on one; the other is kept whole
    assert cached["stability"]["vllm-v1"]["critical_rate_per_s"] == on["critical_rate_per_s"]
    assert cmp_["other_search"]["prefix_caching"] is False
    # measured/μ is shown, and with caching it exceeds 1: μ is the no-sharing formula
    assert pc["measured_over_mu"]["vllm-v1"] == pytest.approx(on["saturated_over_mu"]) and on["saturated_over_mu"] > 1
    assert "no-sharing formula" in pc["mu_formula"]
    (check,) = [c for c in cached["checks"] if c["name"] == "prefix caching"]
    assert check["status"] == "info" and "no-sharing formula" in check["detail"] and "without" in check["detail"]
    lines = caching_lines(cached)
    assert any(ln.startswith("vllm-v1 with prefix caching: λ* = ") and "; without: λ* = " in ln for ln in lines)


def test_mu_with_sharing_is_shown_beside_the_papers_mu_and_lambda_star(cached: dict[str, Any]) -> None:
    ms = cached["prefix_caching"]["mu_sharing"]
    assert ms is not None and ms["mu_share_per_s"] > 1.5 * ms["mu_per_s"], ms
    # λ* with caching stays below the any-policy bound of docs/theory.md, (d)
    lo = cached["prefix_caching"]["comparison"]["with_caching"]["critical_rate_ci_per_s"][0]
    assert lo <= ms["report"]["upper_per_slot"] / SERVER.bbar, (lo, ms)
    assert any(ln.startswith("μ with sharing") and "beside the paper's μ" in ln for ln in caching_lines(cached))


def test_the_overload_is_raised_until_a_caching_server_is_overloaded(cached: dict[str, Any]) -> None:
    st = cached["stability"]["vllm-v1"]
    # 1.2·μ does not overload a server whose shared blocks serve 3·μ: the saturated rate is measured higher
    assert st["saturated_at_rate_per_s"] > 1.2 * cached["theory"]["mu_per_s"] * 1.01
    assert any("did not overload" in n for n in st["notes"])
    assert not any("which no policy can sustain" in n for n in st["notes"])


def test_the_audits_runs_carry_the_prompts_on_the_compiled_cache_path() -> None:
    w = parse_workload(SHARED)
    params = ModelParams(M=480, chunk=16, block=4, bbar=0.05, prefix_caching=True)
    plan = poisson_plan(w, params, 30.0, 400, 1)
    assert plan.prompts is not None and len(plan.prompts) == len(plan)
    out = run_model(load_scheduler("vllm-v1"), params, plan, 400)
    assert out.engine == "fast", out.reason
    # with drop_oversize the prompts are kept for the requests kept
    assert poisson_plan(w, params, 30.0, 400, 1, drop_oversize=True).prompts is not None
    # a Mooncake trace's own arrivals keep its hash_ids' content
    _, tplan, _ = trace_plan(str(trace_path("mooncake-synthetic")), ModelParams(M=400_000, block=16, bbar=0.05),
                             None, 200)
    assert tplan.prompts is not None and len(tplan.prompts) == len(tplan)


def test_a_workload_without_prefix_structure_is_searched_once() -> None:
    data = _audit(ModelParams(M=480, chunk=16, block=4, bbar=0.05, prefix_caching=True), "s=U(40,48),o=U(4,8)")
    pc = data["prefix_caching"]
    assert pc["comparison"] is None and "no prefix structure" in pc["comparison_note"]
    # caching is on, so the outputs still say μ is the no-sharing formula
    assert any(c["name"] == "prefix caching" and "no-sharing" in c["detail"] for c in data["checks"])


def test_the_command_line_defaults_as_the_engine_and_prints_both_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # current-fit: the paper's rule runs without caching by default; the second search turns it on
    code = main(["audit", "--scheduler", "current-fit", "--baseline", "none", *SMALL, "--workload", SHARED,
                 "--profile", "dev", "--skip", "proofs", "--skip", "properties", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["server"]["prefix_caching"] is False and data["prefix_caching"]["comparison"]["other_search"]["prefix_caching"]
    assert "current-fit with prefix caching: λ* = " in text and "; without: λ* = " in text
    assert "no-sharing formula" in text and "measured/μ" in text
    for name in ("report.md", "report.html", "report.tex"):
        body = (tmp_path / name).read_text()
        assert "no-sharing formula" in body and "with prefix caching" in body, name
    assert "## Prefix caching" in (tmp_path / "report.md").read_text()


def test_the_command_line_without_prefix_structure_keeps_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a paper rule on a workload without prefix structure: no caching, no second search, nothing said
    code = main(["audit", "--scheduler", "current-fit", "--baseline", "none", "--M", "240", "--chunk", "8",
                 "--workload", "s=U(1,16),o=U(1,16)", "--profile", "dev", "--skip", "proofs", "--skip", "properties",
                 "--skip", "stability", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    assert "prefix caching" not in capsys.readouterr().out
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["prefix_caching"]["enabled"] is False and data["prefix_caching"]["comparison"] is None


@pytest.mark.parametrize("argv", [
    ["--scheduler", "sglang", "--prefix-caching", "on"],
    ["--scheduler", "vllm-v1", "--baseline", "sglang"],  # vllm-v1 caches by default: its baseline would too
])
def test_sglang_with_caching_is_refused_in_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", *argv, "--out", str(tmp_path), "--quiet"]) == 2
    msg = capsys.readouterr().err.strip()
    assert "sglang" in msg and "--prefix-caching off" in msg and len(msg.splitlines()) == 1


def test_the_sweep_caches_per_scheduler_as_its_engine_runs(tmp_path: Path) -> None:
    common = ["--workload", SHARED, "--M", "480", "--chunk", "16", "--block", "4", "--bbar", "0.05",
              "--loads", "2", "--slots", "1000", "--workers", "1", "--quiet"]
    assert main(["sweep", "--scheduler", "vllm-v1,current-fit", *common, "--out", str(tmp_path / "a")]) == 0
    rows = {r["scheduler"]: r for r in csv.DictReader((tmp_path / "a" / "sweep.csv").open())}
    assert rows["vllm-v1"]["prefix_caching"] == "True" and rows["current-fit"]["prefix_caching"] == "False"
    # at twice μ, caching serves more than μ (the no-sharing formula); without it, less
    assert float(rows["vllm-v1"]["measured_over_mu"]) > 1.2 > 1.0 > float(rows["current-fit"]["measured_over_mu"])
    assert main(["sweep", "--scheduler", "vllm-v1,current-fit", *common, "--prefix-caching", "off",
                 "--out", str(tmp_path / "b")]) == 0
    rows = {r["scheduler"]: r for r in csv.DictReader((tmp_path / "b" / "sweep.csv").open())}
    assert {r["prefix_caching"] for r in rows.values()} == {"False"}
    assert float(rows["vllm-v1"]["measured_over_mu"]) < 1.0
