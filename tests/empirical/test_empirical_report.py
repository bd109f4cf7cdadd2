"""Estimators, the gap decomposition and ``kvstab empirical compare`` on the model (no vLLM needed)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

from kvstab.arrivals import poisson_arrivals
from kvstab.cli import main
from kvstab.empirical.decompose import area, decompose_gap
from kvstab.empirical.estimators import bbar_estimates, queue_growth, saturated_rate, saturated_rate_per_second
from kvstab.empirical.replay import ReplayConfig, replay_model
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
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
         "--no-plots", "--quiet", "--out", str(out), "--data", str(data_dir), "--sglang", "--no-sglang-real"]
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
