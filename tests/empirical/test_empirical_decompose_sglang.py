"""SGLang's gap decomposition (``kvstab.empirical.decompose_sglang``) on the model's logs (no SGLang needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from kvstab.arrivals import fixed_arrivals, poisson_arrivals
from kvstab.cli import main
from kvstab.empirical.decompose_sglang import SGLANG_TERMS, decompose_sglang_gap, sglang_accounts
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.theory.area import expected_g, g_exact
from kvstab.workload import parse_workload


def _run(workload: str, rule: Sglang, params: ModelParams, load: float, steps: int, seed: int = 3):  # noqa: ANN202
    w = parse_workload(workload)
    Eg = expected_g(w, ModelParams(M=params.M, chunk=params.chunk, g="continuous"))
    plan = poisson_arrivals(w, load * params.M / Eg, ModelParams(bbar=1.0), steps, seed=seed)
    return replay_sglang_model(plan, rule, params, steps), Eg


def test_a_prefill_step_stalls_the_running_request_and_its_area_says_so() -> None:
    # request 0 prefills in step 0 and decodes in steps 1-2 (holding 21, 22); request 1 arrives at
    # step 3, whose prefill-only step gives request 0 no token while it holds 22 tokens
    rule, params = Sglang(), ModelParams(M=4096, chunk=64)
    log = replay_sglang_model(fixed_arrivals([(0, 20, 10), (3, 20, 10)]), rule, params)
    assert [st.kind for st in log.steps[:4]] == ["prefill", "decode", "decode", "prefill"]
    acc = sglang_accounts(log, 0)
    g = g_exact(20, 9, 64)  # max_new 10: token 1 comes with the prefill, 9 decode steps
    assert acc.progress_area[0] == g and acc.area[0] == g + 22
    assert acc.progress_area[1] == acc.area[1] == g  # nothing stalls request 1
    assert (acc.final_s == 20).all()
    # memory during a step is kv_used plus what the requests finishing in it held; every
    # token-step is some request's area
    kv = np.array([st.kv_used for st in log.steps])
    last = [t for t, st in enumerate(log.steps) if st.finished]
    assert (acc.memory[last] > kv[last]).all() and int(acc.memory.sum()) == int(acc.area.sum())


def test_fixed_lengths_give_the_area_terms_exactly() -> None:
    # s a multiple of ŝ, fixed lengths, page 1: no sample noise, no partial chunk, no rounding
    rule, params = Sglang(), ModelParams(M=8192, chunk=512)
    log, Eg = _run("s=const(512),o=const(64)", rule, params, 1.3, 800)
    d = decompose_sglang_gap(log, 8192, Eg)
    for k in ("sample", "partial_chunks", "page_rounding", "capacity"):
        assert d.terms[k] == pytest.approx(0, abs=1e-12), k
    assert d.terms["first_token"] == pytest.approx(np.log(g_exact(512, 63, 512) / g_exact(512, 64, 512)), rel=1e-12)
    assert abs(d.residual) < 1e-9 and d.terms["stall"] > 0
    assert [k for k, _ in d.labels] == [k for k, _ in SGLANG_TERMS] == list(d.terms)


def test_the_decomposition_is_exact_with_retractions_and_pages() -> None:
    # a low initial ratio under-reserves, so decode runs out of memory and retracts
    rule, params = Sglang(init_new_token_ratio=0.05), ModelParams(M=4096, chunk=256, block=16)
    log, Eg = _run("s=U(10,600),o=U(10,600)", rule, params, 1.3, 1500)
    assert sum(log.retractions) > 0
    d = decompose_sglang_gap(log, 4096, Eg)
    assert abs(d.residual) < 1e-9
    assert d.terms["waste"] > 0 and d.terms["reprefill"] != 0 and d.terms["page_rounding"] > 0
    assert d.terms["idle_retraction"] > 0
    # a request retracted once from its decode re-prefills its prompt and the outputs it kept
    acc = sglang_accounts(log, 0)
    once = [r for r, k in enumerate(log.retractions) if k == 1 and log.finish[r] >= 0]
    assert once and all(acc.final_s[r] == log.recomputed[r] + 1 for r in once)


def test_the_cap_is_the_idle_cause_when_it_binds() -> None:
    # 40 short requests at once on a large pool: only the cap of 2 keeps memory idle while they queue
    rule, params = Sglang(), ModelParams(M=65536, chunk=512, max_num_seqs=2)
    rng = np.random.default_rng(1)
    plan = fixed_arrivals([(0, int(rng.integers(10, 100)), int(rng.integers(10, 100))) for _ in range(40)])
    log = replay_sglang_model(plan, rule, params)
    d = decompose_sglang_gap(log, 65536, 2000.0, warmup=0.1)
    idle = sum(v for k, v in d.terms.items() if k.startswith("idle_"))
    assert d.terms["idle_cap"] > 0.9 * idle and abs(d.residual) < 1e-9


def test_a_log_the_accounting_does_not_explain_is_refused() -> None:
    rule, params = Sglang(), ModelParams(M=4096, chunk=64)
    log = replay_sglang_model(fixed_arrivals([(0, 20, 10), (3, 20, 10)]), rule, params)
    steps = list(log.steps)
    steps[5] = dataclasses.replace(steps[5], kv_used=steps[5].kv_used + 1)
    with pytest.raises(InvalidArgument, match=r"step 5 of the model log: kv_used"):
        sglang_accounts(dataclasses.replace(log, steps=tuple(steps)), 0)
    steps = list(log.steps)
    steps[2] = dataclasses.replace(steps[2], queue=3)
    with pytest.raises(InvalidArgument, match=r"step 2 .* queue 3"):
        sglang_accounts(dataclasses.replace(log, steps=tuple(steps)), 0)


def test_plot_of_the_gaps(tmp_path: Path) -> None:
    import matplotlib.image

    from kvstab.empirical.compare import CaseResult, SglangCaseResult, plot_gaps
    from kvstab.empirical.decompose import TERMS, GapDecomposition

    def case(name: str, terms: tuple[tuple[str, str], ...], sign: float) -> SimpleNamespace:
        values = {k: sign * 0.01 * (i + 1) * (-1) ** i for i, (k, _) in enumerate(terms)}
        d = GapDecomposition(0.1, 0.09, sum(values.values()), values, 0.0, 100, 9, labels=terms)
        return SimpleNamespace(case=SimpleNamespace(name=name), decomposition=d, vllm=None, real=None)

    vllm = [case(f"v{i}", TERMS, 1 + i) for i in range(3)]
    sglang = [case(f"s{i}", SGLANG_TERMS, 2 - i) for i in range(3)]
    path = plot_gaps(str(tmp_path), cast(list[CaseResult], vllm), cast(list[SglangCaseResult], sglang))
    img = matplotlib.image.imread(path)
    assert Path(path).name == "gap.png" and img.shape[1] > 1000  # two panels
    assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 20


def test_ignore_eos_needs_sglangs_own_scheduler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["empirical", "compare", "--no-vllm", "--sglang-ignore-eos", "--cases", "small", "--no-profile",
                 "--no-plots", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--sglang-ignore-eos" in err and "--sglang" in err


def test_the_ignore_eos_look_ahead_admits_what_the_whole_max_new_test_refuses() -> None:
    from kvstab.empirical.sglang_ignore_eos import Entry, ignore_eos_pass

    rule, params = Sglang(), ModelParams(M=1000, chunk=512)
    # one running request with 10 tokens left holds 499 (it will free 500 when it ends); the head
    # needs 100 + a page now and 400 more by its end: not all at once (100 + 400 + 1 >= 501 - 10),
    # but the running request ends first, so at every future finish memory suffices
    running = [Entry(0, s=400, o=109, progress=499)]
    head = Entry(1, s=100, o=399, progress=0)
    assert (running[0].left, running[0].occupied, head.left, head.occupied) == (10, 500, 400, 100)
    assert ignore_eos_pass(rule, params, 501, running, None, [head], False).admitted == (1,)
    # the first stage (the running request's end, both alive, each 10 tokens longer) needs
    # free - 101 - 2·10 > 2·1 (IGNORE_EOS_RESERVE_TOKENS per live request): 124 passes, 123 does not
    assert ignore_eos_pass(rule, params, 124, running, None, [head], False).admitted == (1,)
    tighter = ignore_eos_pass(rule, params, 123, running, None, [head], False)
    assert tighter.admitted == () and tighter.set_full
