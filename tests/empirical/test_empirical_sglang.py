"""Cross-check: kvstab's ``sglang`` model against SGLang 0.5.23's own scheduler, step for step.

Needs SGLang's CPU scheduler (``scripts/install-sglang.sh``).  Without it these
tests skip with the reason — unless ``KVSTAB_REQUIRE_SGLANG=1``, when a missing
SGLang is a failure.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from kvstab.arrivals import ArrivalPlan, fixed_arrivals, poisson_arrivals
from kvstab.data import trace_path
from kvstab.empirical.decompose_sglang import decompose_sglang_gap
from kvstab.empirical.sglang_driver import SglangUnavailable, check_ignore_eos, load_sglang, replay_sglang, run_sglang
from kvstab.empirical.sglang_ignore_eos import check_spec
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.steplog import SglangModelLog
from kvstab.theory.area import mu_per_slot
from kvstab.traces import load_trace
from kvstab.workload import PAPER_WORKLOADS, Workload


@pytest.fixture(scope="module", autouse=True)
def sglang() -> None:
    """SGLang 0.5.23, or a skip (a failure under ``KVSTAB_REQUIRE_SGLANG=1``)."""
    try:
        load_sglang()
    except SglangUnavailable as exc:
        if os.environ.get("KVSTAB_REQUIRE_SGLANG") == "1":
            pytest.fail(f"KVSTAB_REQUIRE_SGLANG=1 but {exc}", pytrace=False)
        pytest.skip(f"{exc} (KVSTAB_REQUIRE_SGLANG=1 turns this skip into a failure)")


def assert_same(
    plan: ArrivalPlan, rule: Sglang, params: ModelParams, steps: int | None = None
) -> tuple[SglangModelLog, SglangModelLog]:
    real = replay_sglang(plan, rule, params, steps)
    model = replay_sglang_model(plan, rule, params, steps)
    diff = model.first_difference(real)
    assert diff is None, diff
    return real, model


def small_server(seed: int) -> tuple[Sglang, ModelParams, ArrivalPlan]:
    """A small random server and 40 requests over 150 steps: page sizes 1/4/16, chunks of a
    few pages, caps on and off, prefill budgets at one chunk or two, and initial ratios low
    enough that the reservation under-counts and decode runs out of memory (retraction)."""
    rng = np.random.default_rng(seed)
    B = int(rng.choice([1, 1, 4, 16]))
    chunk = B * int(rng.integers(1, 9)) * (4 if B == 1 else 1) * 4
    M = B * int(rng.integers(max(2, 2 * chunk // B), 120)) if B > 1 else int(rng.integers(2 * chunk, 600))
    seqs = None if rng.random() < 0.3 else int(rng.integers(1, 12))
    budget = int(rng.choice([chunk, 2 * chunk, 16384]))
    ratio = float(rng.choice([0.7, 0.3, 0.1, 0.05]))
    rule = Sglang(max_prefill_tokens=budget, init_new_token_ratio=ratio)
    params = ModelParams(M=M, chunk=chunk, block=B, max_num_seqs=seqs)
    reqs = [(int(rng.integers(0, 150)), int(rng.integers(1, max(2, M // 3))), int(rng.integers(1, max(2, M // 3))))
            for _ in range(40)]
    return rule, params, fixed_arrivals(sorted(reqs))


@pytest.mark.parametrize("seed", range(12))
def test_random_small_servers_match_step_for_step(seed: int) -> None:
    rule, params, plan = small_server(seed)
    real, _ = assert_same(plan, rule, params)
    assert all(f >= 0 for f in real.finish)  # drained: every request finished on both


def test_the_small_servers_exercise_every_mechanism() -> None:
    # the parametrised cases are only a check if they hit what they claim to
    logs = []
    for seed in range(12):
        rule, params, plan = small_server(seed)
        logs.append(assert_same(plan, rule, params)[0])
    steps = [st for log in logs for st in log.steps]
    assert sum(sum(log.retractions) for log in logs) >= 12  # retraction, on every server
    assert any(st.kind == "prefill" and st.decode_tokens == 0 and st.queue > 0 and st.batch_is_full for st in steps)
    assert any(st.kind == "idle" for st in steps)
    chunked = [st for st in steps if st.kind == "prefill" and len(st.tokens) > 1]
    assert chunked  # multi-request prefill batches
    ratios = {round(st.new_token_ratio, 6) for st in steps}
    assert max(ratios) > 0.7 and min(ratios) < 0.05  # jumps after retraction above init; decays
    capped = [log for log in logs if log.params.max_num_seqs is not None]
    assert capped and any(log.params.block > 1 for log in logs)


@pytest.mark.parametrize("name", ["paper-1:1", "paper-2:1", "paper-1:2"])
@pytest.mark.parametrize("M", [16_384, 131_000])
def test_paper_workloads_match(name: str, M: int) -> None:
    w = PAPER_WORKLOADS[name]
    rule, params = Sglang(), ModelParams(M=M, chunk=512, max_num_seqs=256)
    mu = mu_per_slot(w, ModelParams(M=M, chunk=512))
    steps = 1200 if M == 16_384 else 500
    plan = poisson_arrivals(w, 1.3 * mu, ModelParams(bbar=1.0), steps, seed=3)
    real, model = assert_same(plan, rule, params, steps)
    assert sum(st.decode_tokens for st in real.steps) > 0 and sum(st.prefill_tokens for st in real.steps) > 0
    # the same plan in SGLang's ignore_eos regime, against the model (it has the ratio path only:
    # at M = 16384 the two part ways within these steps; at 131000 memory is not short yet)
    assert_ignore_eos_cross_check(plan, rule, params, steps, model, must_differ=M == 16_384)


#: whether kvstab's sglang rule has an ignore_eos knob yet (modelling the path is a follow-up of issue 16)
MODEL_HAS_IGNORE_EOS = "ignore_eos" in {f.name for f in dataclasses.fields(Sglang)}


def assert_ignore_eos_cross_check(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int,
    model: SglangModelLog | None = None,
    *,
    must_differ: bool = True,
) -> None:
    """The cross-check of SGLang's ignore_eos regime, ready for the rule's knob.  Until the rule
    models the path, this checks the divergence it has: SGLang ran its ignore_eos branch and never
    retracted, the model agrees with it on every step before the first difference, and that
    difference is an admission decision (the request lifecycle agrees).  Once the rule has an
    ``ignore_eos`` knob, the same plans must be step-identical."""
    if MODEL_HAS_IGNORE_EOS:
        rule = dataclasses.replace(rule, ignore_eos=True)  # type: ignore[call-arg]
        model = None
    check = check_ignore_eos(plan, rule, params, steps, model=model)
    real = check.real
    assert real.admission_path == "ignore_eos" and real.calls["PrefillAdder._select_prefill_admission"] == 0
    assert real.calls["ScheduleBatch.retract_decode"] == 0 and sum(real.log.retractions) == 0
    # the specification in docs/empirical.md (its executable form) predicts every step of the path
    assert check_spec(real.log) is None, check_spec(real.log)
    if MODEL_HAS_IGNORE_EOS:
        assert check.difference is None, check.difference
        return
    if check.first_step is None:
        assert not must_differ, "the model matched SGLang's ignore_eos path: has the rule learnt it?"
        return
    t = check.first_step
    a, b = check.model.steps[t], real.log.steps[t]
    assert check.model.steps[:t] == real.log.steps[:t]
    assert (a.kind, a.admitted, a.batch_is_full) != (b.kind, b.admitted, b.batch_is_full), check.difference


def test_the_model_departs_from_sglangs_ignore_eos_path_at_large_m() -> None:
    # M = 131000 fills up only after several hundred steps at 1.3 μ; at 2 μ the look-ahead
    # reservation decides differently from the ratio path within 300 steps
    w = PAPER_WORKLOADS["paper-2:1"]
    rule, params = Sglang(), ModelParams(M=131_000, chunk=512, max_num_seqs=256)
    plan = poisson_arrivals(w, 2.0 * mu_per_slot(w, ModelParams(M=131_000, chunk=512)), ModelParams(bbar=1.0), 300, seed=3)
    assert_ignore_eos_cross_check(plan, rule, params, 300)


@pytest.mark.parametrize("seed", [5, 8])
def test_ignore_eos_takes_sglangs_own_path_and_never_retracts(seed: int) -> None:
    rule, params, plan = small_server(seed)
    ratio = run_sglang(plan, rule, params, ignore_eos=False)
    eos = run_sglang(plan, rule, params, ignore_eos=True)
    # which code ran: the ratio path's admission test, or add_one_req's ignore_eos branch
    assert ratio.admission_path == "ratio" and ratio.calls["PrefillAdder.add_one_req_ignore_eos"] == 0
    assert eos.admission_path == "ignore_eos" and eos.log.source == "sglang (ignore_eos)"
    assert eos.calls["PrefillAdder.add_one_req_ignore_eos"] == eos.calls["PrefillAdder.add_one_req"] > 0
    # the look-ahead reservation: no decode runs out of memory, where the ratio path retracts
    assert sum(ratio.log.retractions) >= 1 and ratio.calls["ScheduleBatch.retract_decode"] >= 1
    assert sum(eos.log.retractions) == 0 and eos.calls["ScheduleBatch.retract_decode"] == 0
    assert all(f >= 0 for f in eos.log.finish)  # drained
    # the specification predicts SGLang's ignore_eos path, and not its ratio path
    assert check_spec(eos.log) is None and check_spec(ratio.log) is not None


def test_ignore_eos_never_admits_a_request_at_the_arrival_clip() -> None:
    # max_new clipped to M - s - 2 (page 1) leaves the look-ahead a margin of exactly 1 token on an
    # empty pool, which IGNORE_EOS_RESERVE_TOKENS refuses: SGLang's ignore_eos path never admits it
    rule, params = Sglang(), ModelParams(M=256, chunk=64)
    plan = fixed_arrivals([(0, 100, 1000)])
    assert replay_sglang(plan, rule, params).finish == (154,)  # the ratio path serves it (max_new clipped to 154)
    with pytest.raises(InvalidArgument, match="did not drain within 300 steps"):
        replay_sglang(plan, rule, params, max_steps=300, ignore_eos=True)


@pytest.mark.parametrize("trace", ["azure-conv", "azure-code", "sharegpt", "arxiv"])
def test_real_traces_match(trace: str) -> None:
    tr = load_trace(str(trace_path(trace)))
    w = Workload.joint(tr.s, tr.o, name=trace)
    rule, params = Sglang(), ModelParams(M=131_000, chunk=512, max_num_seqs=256)
    plan = poisson_arrivals(w, 0.3, ModelParams(bbar=1.0), 500, seed=5)
    keep = plan.s < params.M - 8  # SGLang refuses a prompt of max_req_len - 5 tokens or more
    plan = ArrivalPlan(plan.slot[keep], plan.s[keep], plan.o[keep])
    assert_same(plan, rule, params, 500)


def test_a_difference_is_named() -> None:
    # first_difference is a check only if it can fail: a different server gives another log
    rule, params, plan = small_server(3)
    real = replay_sglang(plan, rule, params)
    other = replay_sglang_model(plan, rule, dataclasses.replace(params, M=params.M + 64))
    diff = other.first_difference(real)
    assert diff is not None and "on sglang" in diff


def test_a_prompt_sglang_refuses_is_one_line() -> None:
    with pytest.raises(InvalidArgument, match=r"SGLang refuses it") as info:
        replay_sglang(fixed_arrivals([(0, 250, 10)]), Sglang(), ModelParams(M=256, chunk=64))
    assert "\n" not in str(info.value)


def test_other_sglang_version_names_the_install_script(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from kvstab.empirical import sglang_driver

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.4.0" if d == "sglang" else real(d))
    monkeypatch.setattr(sglang_driver, "_SGL", None)
    with pytest.raises(SglangUnavailable, match=r"SGLang 0\.4\.0 is installed .* scripts/install-sglang\.sh"):
        load_sglang()


def test_the_stubs_do_not_outlive_the_import() -> None:
    import sys

    from kvstab.empirical.sglang_driver import _StubModule

    assert not [m for m, mod in sys.modules.items() if isinstance(mod, _StubModule)]


def test_compare_report_on_sglang(tmp_path: Path) -> None:
    from kvstab.cli import main

    out = tmp_path / "rep"
    code = main(
        ["empirical", "compare", "--cases", "small", "--small-steps", "800", "--no-plots", "--no-profile", "--quiet",
         "--no-vllm", "--sglang", "--out", str(out)]
    )
    assert code == 0
    text = (out / "compare.md").read_text()
    table = text.split("## SGLang")[1].split("### Decomposition")[0]
    rows = [r for r in table.split("\n") if r.startswith("| P/D") or r.startswith("| mixed")]
    assert len(rows) == 4
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[7] == "yes", r  # step-identical
        assert cells[6] == "+0.00", r  # gap model → SGLang
    assert (out / "compare-sglang.csv").read_text().count("\n") == 5


def test_compare_without_sglang_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    from kvstab.cli import main
    from kvstab.empirical import sglang_driver

    real = importlib.metadata.version

    def version(dist: str) -> str:
        if dist == "sglang":
            raise importlib.metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(sglang_driver, "_SGL", None)
    code = main(["empirical", "compare", "--cases", "small", "--no-vllm", "--sglang", "--no-plots", "--no-profile",
                 "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "scripts/install-sglang.sh" in err and "--no-sglang-real" in err



def test_the_decomposition_is_exact_on_sglangs_own_logs() -> None:
    # a small server that retracts: SGLang's log and the model's (step-identical) decompose the
    # same way, and the terms add up to the gap
    rule, params, plan = small_server(8)
    real, model = assert_same(plan, rule, params)
    assert sum(real.retractions) > 0
    d = decompose_sglang_gap(real, params.M, 5000.0, warmup=0.0)
    assert abs(d.residual) < 1e-9 and d.terms["waste"] > 0
    assert d.terms == decompose_sglang_gap(model, params.M, 5000.0, warmup=0.0).terms
