"""Estimators, the gap decomposition and ``kvstab empirical compare`` on the model (no vLLM needed)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

from kvstab.arrivals import poisson_arrivals
from kvstab.cli import main
from kvstab.empirical.batchtime import load_profile
from kvstab.empirical.compare import compare, shared_prompt_case
from kvstab.empirical.decompose import CACHING_TERMS, area, decompose_gap
from kvstab.empirical.estimators import bbar_estimates, queue_growth, saturated_rate, saturated_rate_per_second
from kvstab.empirical.replay import replay_model
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.steplog import ReplayConfig
from kvstab.theory.area import expected_g, g_exact
from kvstab.workload import parse_workload

SMALL = "s=U(10,200),o=U(10,200)"


def _run(workload: str, load: float, steps: int, M: int = 4096, block: int = 16, seed: int = 3):  # noqa: ANN202
    w = parse_workload(workload)
    cfg = ReplayConfig.for_capacity(M, block, max_num_batched_tokens=512, max_num_seqs=256)
    Eg = expected_g(w, ModelParams(M=M, chunk=512, g="continuous"))
    return replay_model(poisson_arrivals(w, load * M / Eg, ModelParams(bbar=1.0), steps, seed=seed), cfg, steps), Eg


def test_queue_grows_above_mu_and_not_below() -> None:
    above, _ = _run(SMALL, 1.4, 4000)
    below, _ = _run(SMALL, 0.7, 4000)
    up = queue_growth(above)
    assert up.low > 0  # grows, and the interval says so
    rate = saturated_rate(above)
    assert up.value == pytest.approx(above.arrived.mean() - rate.value, abs=3 * (up.high - up.low))
    # below μ the system is stable: the number in system stays small
    assert below.in_system[1000:].max() < 60
    assert abs(queue_growth(below).value) < 0.01


def test_rate_per_second_with_constant_steps_is_rate_per_step_over_bbar() -> None:
    log, _ = _run(SMALL, 1.4, 2000)
    per_step = saturated_rate(log).value
    per_s = saturated_rate_per_second(log, np.full(log.steps, 0.04))
    assert per_s.value == pytest.approx(per_step / 0.04, rel=1e-9)
    assert per_s.low <= per_s.value <= per_s.high


def test_bbar_median_and_trimmed_mean() -> None:
    x = np.array([1.0] * 8 + [100.0, 200.0])  # heavy tail: the mean is misleading
    b = bbar_estimates(x, trim=0.1)
    assert b.median == 1.0 and b.trimmed_mean == pytest.approx(13.375)
    assert b.mean == pytest.approx(30.8)
    with pytest.raises(InvalidArgument):
        bbar_estimates([])


def test_area_with_no_decode_unit() -> None:
    s = np.array([1, 100, 700, 1024])
    for B in (1, 16):
        two = area(s, np.full(4, 2), 512, B)
        one = area(s, np.full(4, 1), 512, B)
        zero = area(s, np.zeros(4, dtype=np.int64), 512, B)
        # each decode unit adds what the request holds in that slot
        assert (one - zero == B * -(-(s + 1) // B)).all()
        assert (two - one == B * -(-(s + 2) // B)).all()
    assert (area(s, np.zeros(4, dtype=np.int64), 512, 1) == g_exact(s, np.ones(4), 512) - (s + 1)).all()


def test_decomposition_terms_that_are_exact_for_a_fixed_workload() -> None:
    # s a multiple of ŝ and fixed lengths: no partial chunk, no sampling noise, B = 1: no rounding
    log, Eg = _run("s=const(512),o=const(64)", 1.3, 3000, M=8192, block=1)
    d = decompose_gap(log, 8192, Eg)
    assert d.terms["sample"] == pytest.approx(0, abs=1e-12)
    assert d.terms["partial_chunks"] == pytest.approx(0, abs=1e-12)
    assert d.terms["block_rounding"] == pytest.approx(0, abs=1e-12)
    g64, g63 = g_exact(512, 64, 512), g_exact(512, 63, 512)
    assert d.terms["first_token"] == pytest.approx(np.log(g63 / g64), rel=1e-12)
    assert d.gap == pytest.approx(d.explained + d.residual, abs=1e-12)
    # the replay recorded the window boundary: the accounting is exact
    assert abs(d.residual) < 1e-9
    # another window has no recorded boundary: the boundary is then what is left over
    other = decompose_gap(log, 8192, Eg, warmup=0.3)
    assert other.terms["boundary"] == 0.0
    assert other.residual == pytest.approx(other.gap - other.explained, abs=1e-12)


def test_decomposition_is_exact_on_a_preempting_run() -> None:
    log, Eg = _run("s=U(10,1200),o=U(10,1200)", 1.3, 3000, M=8192)
    assert log.preempted.sum() > 0 and log.wasted.sum() > 0
    d = decompose_gap(log, 8192, Eg)
    assert abs(d.residual) < 1e-9
    assert d.terms["waste"] > 0


def test_compare_model_only_writes_every_format(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "rep"
    code = main(
        ["empirical", "compare", "--no-vllm", "--cases", "small", "--steps", "300", "--small-steps", "1500",
         "--no-plots", "--quiet", "--out", str(out), "--data", str(data_dir), "--sglang", "--no-sglang-real",
         "--prefix-caching", "off"]  # the caching column has its own test below (its reference replays are slower)
    )
    assert code == 0
    md = (out / "compare.md").read_text()
    assert "Decomposition of the paper formula's gap" in md and "P/D 1:1@16k" in md
    rows = list(csv.reader((out / "compare.csv").open()))
    assert len(rows) == 1 + 4 and "decomp residual %" in rows[0]
    # SGLang's own decomposition (the sglang model's logs here), exact on every case
    part = md.split("Decomposition of the paper formula's gap to SGLang")[1]
    resid = next(r for r in part.split("\n") if r.startswith("| residual"))
    assert resid.count("+0.00") + resid.count("-0.00") == 4, resid
    assert "held through prefill-only steps" in part and "the gap by family" in md
    rows = list(csv.reader((out / "compare-sglang.csv").open()))
    assert len(rows) == 1 + 4 and "decomp stall %" in rows[0] and "decomp residual %" in rows[0]
    tex = (out / "compare.tex").read_text()
    # main, decomposition, A100, then SGLang's table, its decomposition and the side-by-side families
    assert tex.count(r"\begin{tabular}") == 6 and r"\mu" in tex


def test_compare_without_vllm_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kvstab.empirical import vllm_driver

    monkeypatch.setattr(vllm_driver, "_VLLM", None)
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    assert main(["empirical", "compare", "--cases", "small", "--no-profile"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "vLLM is not installed" in err and "scripts/install-vllm.sh" in err


def test_compare_rejects_a_load_below_one(tmp_path: Path) -> None:
    assert main(["empirical", "compare", "--no-vllm", "--cases", "small", "--load", "0.9", "--no-profile",
                 "--no-plots", "--quiet", "--out", str(tmp_path)]) == 2


def test_compare_only_names_a_valid_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["empirical", "compare", "--no-vllm", "--cases", "small", "--only", "P/D 9:9@16k", "--no-profile",
                 "--no-plots", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'P/D 9:9@16k' is not a case" in err and "P/D 1:1@16k" in err


def test_compare_with_caching_shows_the_off_column_and_decomposes_the_gap(tmp_path: Path, data_dir: Path) -> None:
    """Issue 25's shared system prompt on the model (caching on by default, as vLLM's): the caching-off
    rate beside the caching-on one, ``ln(μ_on / μ_off)`` split exactly into its terms, shared memory the
    largest, the hits' saved prefill counted, and μ_paper named the no-sharing formula."""
    out = tmp_path / "rep"
    profile = load_profile(str(data_dir / "profiles" / "a100-llama-3-8b"))
    report = compare([shared_prompt_case()], str(out), steps=900, use_vllm=False, plots=False, profile=profile)
    (r,) = report.results
    assert r.caching and r.off is not None and r.off.vllm is None
    gap = r.off.gap
    on, off = r.mu_measured.value, r.off.mu_measured.value
    assert on > 2 * off, (on, off)  # vLLM measures 3.4x on this case; the model is vLLM step for step
    assert gap.ratio == pytest.approx(gap.on.rate / gap.off.rate, rel=1e-12)
    assert abs(gap.residual) < 1e-9  # both replays recorded the window boundary: the accounting is exact
    assert gap.off.sharing == pytest.approx(1.0, abs=1e-9) and gap.on.sharing > 2  # nothing shared when off
    assert gap.terms["shared"] == max(gap.terms.values()) and gap.terms["shared"] > np.log(2)
    assert gap.saved > 900  # most of the 1,024 shared prompt tokens are hits, not computed
    no_saving = gap.ceilings()[2]
    assert gap.on.rate > no_saving  # sharing memory alone, computing every prompt token, could not reach it
    # the paper formula's decomposition is the caching-off run's (the formula's world), exact too
    assert abs(r.decomposition.residual) < 1e-9 and r.decomposition.mu_measured == pytest.approx(gap.off.rate)
    md = (out / "compare.md").read_text()
    assert "μ paper is the no-sharing formula" in md and "Prefix caching on vs off" in md
    assert "measured / μ paper" in md and f"{on / r.mu_paper:.3f}" in md
    assert "on / off in req/s (A100 profile)" in md  # both runs' steps priced by the profile
    rows = list(csv.reader((out / "compare.csv").open()))
    row = dict(zip(rows[0], rows[1]))
    assert row["prefix caching"] == "on" and row["caching on / off"].startswith(f"{on / off:.3f} [")
    terms = sum(float(row[f"caching {k} %"]) for k, _ in CACHING_TERMS) + float(row["caching residual %"])
    assert terms == pytest.approx(float(row["caching total %"]), abs=1e-3)
    assert float(row["caching total %"]) == pytest.approx(100 * gap.gap, abs=1e-3)
    # the total is C/T over the whole window, the μ columns its batch means (whole batches): close, not equal
    assert gap.gap == pytest.approx(np.log(on / off), abs=0.05)


def test_compare_caching_off_and_the_fast_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--prefix-caching off`` runs the paper's world alone (no caching column); the compiled engine,
    which has no prefix cache yet, is refused with caching on in one line before any run."""
    args = ["empirical", "compare", "--no-vllm", "--cases", "prefix", "--steps", "300", "--no-profile",
            "--no-plots", "--quiet", "--out", str(tmp_path)]
    assert main([*args, "--engine", "fast"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no prefix cache" in err and "--prefix-caching off" in err
    assert main([*args, "--engine", "fast", "--prefix-caching", "off"]) == 0
    md = (tmp_path / "compare.md").read_text()
    assert "Prefix caching on vs off" not in md and "| shared-prompt@64k |" in md
    row = dict(zip(*list(csv.reader((tmp_path / "compare.csv").open()))[:2]))
    assert row["prefix caching"] == "off" and row["caching on / off"] == "n/a"
