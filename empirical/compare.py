"""``kvstab empirical compare``: the paper's formula, kvstab's ``vllm-v1`` model and vLLM's scheduler.

For each case (a workload and a capacity ``M``) one overloaded Poisson plan is
drawn and replayed on vLLM's own scheduler and on kvstab's model; the report
gives ``μ`` per step from the paper's formula, from the model and measured on
vLLM, the gaps, the decomposition of the formula's gap
(:mod:`kvstab.empirical.decompose`), the recomputed tokens per completion,
and ``b̄`` and ``μ`` in requests/s on an A100 from the profile
(:mod:`kvstab.empirical.batchtime`).  With ``sglang=True`` every case is
also replayed on kvstab's ``sglang`` model and SGLang 0.5.23's own scheduler,
with SGLang's own decomposition (:mod:`kvstab.empirical.decompose_sglang`)
and the two engines' gaps side by side.  Output: Markdown, CSV, LaTeX, PNG
(``queue.png``, ``kv.png``, ``gap.png``).

Prefix caching is on by default, as vLLM 0.33 runs (``caching=True``): every
vLLM case is replayed with ``enable_prefix_caching`` on and off, on vLLM and on
the model (the reference engine: the compiled step-log replay has no block pool yet), the
caching-off rate beside the caching-on one, and the gap between them decomposed
(:func:`kvstab.empirical.decompose.decompose_caching`) into the prefill compute
the hits saved and the memory the shared blocks saved.  The paper's ``μ`` is the
no-sharing formula; its own decomposition is taken on the caching-off run, the
world it describes.  The ``shared-prompt@64k`` case is issue 25's headline: every
request a 1,280-token prompt whose first 1,024 tokens are one system prompt.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.empirical.batchtime import A100Profile, BatchTimeModel, FitReport, fit_batch_time
from kvstab.empirical.decompose import (
    CACHING_TERMS,
    TERMS,
    CachingDecomposition,
    GapDecomposition,
    decompose_caching,
    decompose_gap,
)
from kvstab.empirical.decompose_sglang import SGLANG_TERMS, decompose_sglang_gap, sglang_window
from kvstab.empirical.estimators import (
    bbar_estimates,
    queue_growth,
    relative_gap,
    saturated_rate,
    saturated_rate_per_second,
    window,
)
from kvstab.empirical.replay import replay_model, replay_vllm
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang import clip_max_new
from kvstab.metrics import Estimate, batch_means
from kvstab.model import PAPER_CHUNK, PAPER_M, ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.steplog import ReplayConfig, SglangModelLog, StepLog
from kvstab.theory.area import expected_g
from kvstab.theory.latex import tex_text
from kvstab.traces import load_trace
from kvstab.workload import PAPER_WORKLOADS, Workload, parse_workload

__all__ = [
    "Case",
    "CaseResult",
    "SglangCaseResult",
    "default_cases",
    "run_case",
    "run_sglang_case",
    "Report",
    "compare",
    "SMALL_M",
    "TRACE_FILES",
    "SHARED_SPEC",
    "SHARED_M",
    "shared_prompt_case",
]

#: a replay log: vLLM's terms (:class:`StepLog`) or SGLang's (:class:`SglangModelLog`)
L = TypeVar("L", StepLog, SglangModelLog)

#: The small capacity of the issue: about a dozen paper-workload requests fit.
SMALL_M = 16_384
TRACE_FILES = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
}
#: Issue 25's headline workload: a 1,024-token system prompt shared by every request, 256 own tokens, 256 out.
SHARED_SPEC = "s=const(1280),o=const(256),prefix=shared(1024)"
#: Its capacity (4,096 blocks of 16).
SHARED_M = 65_536


@dataclass(frozen=True, slots=True)
class Case:
    """One comparison: a length law (or two, for the mixed trace: first half, second half) and ``M``."""

    name: str
    M: int
    first: Workload
    second: Workload | None = None  # the mixed workload switches to this law half-way
    #: arrivals as a multiple of μ_paper when the run's ``load`` would not flood this case (sharing
    #: lifts the saturated rate above the no-sharing μ_paper); the larger of the two is used
    load: float | None = None
    #: the most steps this case runs (its caching-on replays take the reference engine)
    max_steps: int | None = None

    def steps(self, steps: int) -> int:
        """The horizon of this case for a run of ``steps`` steps."""
        return steps if self.max_steps is None else min(steps, self.max_steps)

    def load_for(self, load: float) -> float:
        """The arrival rate (× μ_paper) of this case for a run at ``load``."""
        return load if self.load is None else max(load, self.load)

    def expected_g(self, chunk: int) -> float:
        """The paper's ``E[g]`` (continuous form) of the law, the two halves averaged when mixed."""
        p = ModelParams(M=self.M, chunk=chunk, g="continuous")
        g1 = expected_g(self.first, p)
        return g1 if self.second is None else 0.5 * (g1 + expected_g(self.second, p))

    def plan(self, steps: int, rate: float, seed: int) -> ArrivalPlan:
        """Poisson(``rate``) arrivals per step for ``steps`` steps."""
        per_step = ModelParams(M=self.M, bbar=1.0)  # the server with the step as its time unit
        if self.second is None:
            return poisson_arrivals(self.first, rate, per_step, steps, seed=seed)
        half = steps // 2
        a = poisson_arrivals(self.first, rate, per_step, half, seed=seed)
        b = poisson_arrivals(self.second, rate, per_step, steps - half, seed=seed + 1)
        return ArrivalPlan(np.concatenate([a.slot, b.slot + half]), np.concatenate([a.s, b.s]), np.concatenate([a.o, b.o]))


def shared_prompt_case() -> Case:
    """Issue 25's headline case: :data:`SHARED_SPEC` at ``M =`` :data:`SHARED_M`, flooded (4 × μ_paper:
    with caching vLLM completes about 3 × μ_paper), at most 8,000 steps."""
    return Case("shared-prompt@64k", SHARED_M, parse_workload(SHARED_SPEC), load=4.0, max_steps=8_000)


def default_cases(data_dir: str | None, which: str = "all") -> list[Case]:
    """The issues' cases: paper workloads at ``M = 131000`` and ``16384``, the traces at ``131000``,
    and the shared system prompt (:func:`shared_prompt_case`, case set ``prefix``)."""
    paper = [(n.removeprefix("paper-"), PAPER_WORKLOADS[n]) for n in ("paper-1:1", "paper-2:1", "paper-1:2")]
    cases: list[Case] = []
    for M, tag in ((PAPER_M, ""), (SMALL_M, "@16k")):
        if which in ("all", "paper" if M == PAPER_M else "small"):
            cases += [Case(f"P/D {n}{tag}", M, w) for n, w in paper]
            cases.append(Case(f"mixed{tag}", M, PAPER_WORKLOADS["paper-2:1"], PAPER_WORKLOADS["paper-1:2"]))
    if which in ("all", "traces"):
        if data_dir is None:
            raise InvalidArgument("the trace cases need the data folder (--data PATH, or the data shipped with kvstab)")
        for name, f in TRACE_FILES.items():
            tr = load_trace(os.path.join(data_dir, "traces", f))
            cases.append(Case(name, PAPER_M, Workload.joint(tr.s, tr.o, name=name)))
    if which in ("all", "prefix"):
        cases.append(shared_prompt_case())
    if not cases:
        raise InvalidArgument(f"unknown case set {which!r}; valid: all, paper, small, traces, prefix")
    return cases


class _Beside(Generic[L]):
    """The model's replay and the real scheduler's beside it (vLLM's or SGLang's), and what a
    report reads as measured: the real scheduler's log and rate when it ran, else the model's.
    A subclass names its real log's field in ``REAL``; its rate is ``mu_`` and that name."""

    __slots__ = ()
    REAL: ClassVar[str]
    model: L
    mu_model: Estimate

    @property
    def measured(self) -> L:
        """The real scheduler's log when it ran, else the model's."""
        real: L | None = getattr(self, self.REAL)
        return real if real is not None else self.model

    @property
    def mu_measured(self) -> Estimate:
        """The real scheduler's rate when it ran, else the model's."""
        mu: Estimate | None = getattr(self, "mu_" + self.REAL)
        return mu if mu is not None else self.mu_model


def _vllm_first(model: StepLog, vllm: StepLog) -> str | None:
    """Where the model first departs from vLLM (vLLM's log is the reference the report reads)."""
    return vllm.first_difference(model)


def _beside(
    model: L, real: L | None, rate: Callable[[L], Estimate], differ: Callable[[L, L], str | None]
) -> tuple[Estimate, Estimate | None, str | None]:
    """``(mu_model, mu_real, difference)`` of two replays of one plan: each one's saturated rate
    and where they first part (``None`` for the real ones where the real scheduler did not run)."""
    if real is None:
        return rate(model), None, None
    return rate(model), rate(real), differ(model, real)


@dataclass(frozen=True, slots=True, eq=False)
class CaseResult(_Beside[StepLog]):
    """Everything the report says about one case."""

    REAL = "vllm"

    case: Case
    config: ReplayConfig
    steps: int
    mu_paper: float  # per step, the paper's formula
    model: StepLog
    vllm: StepLog | None
    mu_model: Estimate
    mu_vllm: Estimate | None
    difference: str | None  # first step where the model departs from vLLM (None: identical)
    slope: Estimate
    decomposition: GapDecomposition  # of the caching-off run when caching is on (the formula's world)
    dropped: int
    #: the caching-off replays beside the caching-on ones (None: the run was with caching off)
    off: CachingOff | None = None

    @property
    def caching(self) -> bool:
        """Whether the replays ran with vLLM's prefix caching on."""
        return self.config.enable_prefix_caching


@dataclass(frozen=True, slots=True, eq=False)
class CachingOff(_Beside[StepLog]):
    """The same plan with prefix caching off, beside a caching-on case, and the gap between them."""

    REAL = "vllm"

    model: StepLog
    vllm: StepLog | None
    mu_model: Estimate
    mu_vllm: Estimate | None
    difference: str | None  # first step where the model departs from vLLM, caching off (None: identical)
    gap: CachingDecomposition  # measured on against measured off (vLLM's logs when it ran)


def run_case(
    case: Case,
    steps: int,
    *,
    load: float = 1.3,
    seed: int = 0,
    warmup: float = 0.25,
    use_vllm: bool = True,
    budget: int = PAPER_CHUNK,
    max_num_seqs: int = 256,
    block: int = 16,
    engine: str = "auto",
    caching: bool = False,
) -> CaseResult:
    """Replay one overloaded plan (rate ``load × μ_paper``, or the case's own load) on vLLM and on the
    model (``engine``: see :func:`model_replay`; identical logs); with ``caching``, with vLLM's prefix
    caching on and again off, the gap between the two decomposed (:func:`decompose_caching`)."""
    if not load > 1:
        raise InvalidArgument(f"a saturated-rate run needs load > 1 (arrivals above μ), got {load}")
    replay_on = model_replay(engine, caching)  # a fast engine asked for with caching is refused first
    cfg_off = ReplayConfig.for_capacity(case.M, block, max_num_batched_tokens=budget, max_num_seqs=max_num_seqs)
    cfg = replace(cfg_off, enable_prefix_caching=caching)
    Eg = case.expected_g(budget)
    mu_paper = case.M / Eg
    plan = case.plan(steps, case.load_for(load) * mu_paper, seed)
    before = len(plan)
    plan = plan.fit_to(ModelParams(M=cfg.M, chunk=budget, block=block), drop_oversize=True)
    model = replay_on(plan, cfg, steps)
    vlog = replay_vllm(plan, cfg, steps) if use_vllm else None
    measured = vlog if vlog is not None else model
    rate = lambda log: saturated_rate(log, warmup)  # noqa: E731
    off = None
    if caching:
        model_off = model_replay(engine)(plan, cfg_off, steps)
        vlog_off = replay_vllm(plan, cfg_off, steps) if use_vllm else None
        off_measured = vlog_off if vlog_off is not None else model_off
        mu, mu_v, diff = _beside(model_off, vlog_off, rate, _vllm_first)
        gap = decompose_caching(measured, off_measured, warmup)
        off = CachingOff(model=model_off, vllm=vlog_off, mu_model=mu, mu_vllm=mu_v, difference=diff, gap=gap)
    mu, mu_v, diff = _beside(model, vlog, rate, _vllm_first)
    return CaseResult(
        case=case,
        config=cfg,
        steps=steps,
        mu_paper=mu_paper,
        model=model,
        vllm=vlog,
        mu_model=mu,
        mu_vllm=mu_v,
        difference=diff,
        slope=queue_growth(measured, warmup),
        decomposition=decompose_gap(off.measured if off is not None else measured, case.M, Eg, warmup),
        dropped=before - len(plan),
        off=off,
    )


@dataclass(frozen=True, slots=True, eq=False)
class SglangCaseResult(_Beside[SglangModelLog]):
    """One case on SGLang: the paper's formula, kvstab's ``sglang`` model and SGLang's own scheduler."""

    REAL = "real"

    case: Case
    rule: Sglang  # SGLang's knobs
    params: ModelParams  # the server both replays ran on
    steps: int
    mu_paper: float  # per step, the paper's formula
    model: SglangModelLog
    real: SglangModelLog | None  # None: SGLang's own scheduler was not run
    mu_model: Estimate
    mu_real: Estimate | None
    difference: str | None  # first step where the model departs from SGLang (None: identical)
    dropped: int  # requests SGLang refuses (prompt of max_req_len - 5 tokens or more), left out of the plan
    #: the paper formula's gap to the measured log (SGLang's, else the model's; the cache-off one when caching)
    decomposition: GapDecomposition
    eos: Any = None  # SGLang's ignore_eos path on the same plan (a sglang_driver.IgnoreEosCheck), when asked
    #: the radix cache off beside it (None: the run was with the cache off)
    off: SglangCachingOff | None = None

    @property
    def caching(self) -> bool:
        """Whether the replays ran with SGLang's radix cache on."""
        return bool(self.params.prefix_caching)


@dataclass(frozen=True, slots=True, eq=False)
class SglangCachingOff(_Beside[SglangModelLog]):
    """The same plan with SGLang's radix cache off (``--disable-radix-cache``), beside a caching-on case."""

    REAL = "real"

    model: SglangModelLog
    real: SglangModelLog | None
    mu_model: Estimate
    mu_real: Estimate | None
    difference: str | None  # first step where the model departs from SGLang, cache off (None: identical)


def sglang_rate(log: SglangModelLog, warmup: float = 0.25, batches: int = 20) -> Estimate:
    """Completed requests per step over the steady-state window (batch-means CI), as :func:`saturated_rate`."""
    done = np.array([len(st.finished) for st in log.steps], dtype=np.float64)
    return batch_means(done[sglang_window(log, warmup)], batches)


def _sglang_fits(rule: Sglang, params: ModelParams, s: int, o: int) -> bool:
    """Whether SGLang accepts the request on ``params`` and leaves it at least one output token."""
    try:
        return clip_max_new(rule, params, s, o) >= 1
    except InvalidArgument:
        return False


def run_sglang_case(
    case: Case,
    steps: int,
    *,
    load: float = 1.3,
    seed: int = 0,
    warmup: float = 0.25,
    use_sglang: bool = True,
    chunk: int = PAPER_CHUNK,
    max_num_seqs: int = 256,
    ignore_eos: bool = False,
    caching: bool = False,
) -> SglangCaseResult:
    """Replay one overloaded plan (rate ``load × μ_paper``, the plan :func:`run_case` draws) on
    SGLang's own scheduler and on kvstab's ``sglang`` model (page size 1, SGLang's default);
    ``ignore_eos``: also on SGLang's ``ignore_eos`` path, against the model
    (:func:`~kvstab.empirical.sglang_driver.check_ignore_eos`); ``caching``: with SGLang's radix
    cache on (its server default; the model is :mod:`kvstab.lifecycles.sglang_radix`, the plan's
    prompts are the token ids) and again off beside it."""
    if not load > 1:
        raise InvalidArgument(f"a saturated-rate run needs load > 1 (arrivals above μ), got {load}")
    rule = Sglang()
    params_off = ModelParams(M=case.M, chunk=chunk, max_num_seqs=max_num_seqs)
    params = replace(params_off, prefix_caching=caching)
    Eg = case.expected_g(chunk)
    mu_paper = case.M / Eg
    plan = case.plan(steps, case.load_for(load) * mu_paper, seed)
    keep = np.array([_sglang_fits(rule, params, int(s), int(o)) for s, o in zip(plan.s, plan.o)], dtype=bool)
    prompts = plan.prompts.take(keep) if plan.prompts is not None else None
    kept = ArrivalPlan(plan.slot[keep], plan.s[keep], plan.o[keep], prompts=prompts)

    def both(p: ModelParams) -> tuple[SglangModelLog, SglangModelLog | None]:
        model = replay_sglang_model(kept, rule, p, steps)
        if not use_sglang:
            return model, None
        from kvstab.empirical.sglang_driver import replay_sglang

        return model, replay_sglang(kept, rule, p, steps)

    model, real = both(params)
    measured = real if real is not None else model
    rate = lambda log: sglang_rate(log, warmup)  # noqa: E731
    off = None
    if caching:
        model_off, real_off = both(params_off)
        # the paper formula's gap is decomposed in its own world, without sharing (as for vLLM)
        measured = real_off if real_off is not None else model_off
        mu, mu_r, diff = _beside(model_off, real_off, rate, SglangModelLog.first_difference)
        off = SglangCachingOff(model=model_off, real=real_off, mu_model=mu, mu_real=mu_r, difference=diff)
    eos = None
    if ignore_eos:
        from kvstab.empirical.sglang_driver import check_ignore_eos

        eos = check_ignore_eos(kept, rule, params_off, steps, model=off.model if off is not None else model)
    mu, mu_r, diff = _beside(model, real, rate, SglangModelLog.first_difference)
    return SglangCaseResult(
        case=case,
        rule=rule,
        params=params,
        steps=steps,
        mu_paper=mu_paper,
        model=model,
        real=real,
        mu_model=mu,
        mu_real=mu_r,
        difference=diff,
        dropped=int((~keep).sum()),
        decomposition=decompose_sglang_gap(measured, case.M, Eg, warmup, requested=kept.o),
        eos=eos,
        off=off,
    )


def _sglang_per_completion(log: SglangModelLog, values: list[float], warmup: float) -> float:
    w = sglang_window(log, warmup)
    c = sum(len(st.finished) for st in log.steps[w])
    return float(sum(values[w])) / c if c else float("nan")


def _pm(e: Estimate | None) -> str:
    """An estimate as ``value ± half-width`` (``n/a`` when there is none), as every μ column prints it."""
    return "n/a" if e is None else f"{e.value:.5f} ± {(e.high - e.low) / 2:.5f}"


def _mu_cells(
    name: str, M: int, mu_paper: float, model: Estimate, real: Estimate | None, measured: float, ran: bool,
    difference: str | None,
) -> list[str]:
    """The columns the vLLM and the SGLang tables share: the case, ``M``, the three μ, the two gaps (the paper's
    to ``measured``, the model's to the real engine) and whether the model stepped with the engine (``n/a`` when
    the engine did not run)."""
    return [
        name,
        str(M),
        f"{mu_paper:.5f}",
        _pm(model),
        _pm(real),
        f"{100 * relative_gap(mu_paper, measured):+.2f}",
        "n/a" if real is None else f"{100 * relative_gap(model.value, real.value):+.2f}",
        "n/a" if not ran else ("yes" if difference is None else "no"),
    ]


def _case_notes(results: Sequence[CaseResult | SglangCaseResult], departs: str, dropped: str) -> list[str]:
    """A Markdown bullet per case where the model departs from the engine (``departs at`` the first
    difference) and per case whose plan lost requests (``N dropped``)."""
    out = []
    for r in results:
        if r.difference is not None:
            out.append(f"- {r.case.name}: {departs} at {r.difference}")
        if r.dropped:
            out.append(f"- {r.case.name}: {r.dropped} {dropped}")
    return out


def _ratio(on: Estimate, off: Estimate) -> str:
    """``on / off`` with the range the two 95 % intervals allow (``low_on / high_off`` to ``high_on / low_off``)."""
    lo = on.low / off.high if off.high > 0 else float("nan")
    hi = on.high / off.low if off.low > 0 else float("inf")
    return f"{on.value / off.value:.3f} [{lo:.3f}, {hi:.3f}]"


def _decomposition_head(terms: tuple[tuple[str, str], ...]) -> list[str]:
    """The CSV columns of a decomposition: one per term, the residual and the total (%)."""
    return [f"decomp {k} %" for k, _ in terms] + ["decomp residual %", "decomp total %"]


def _decomposition_cells(d: GapDecomposition, terms: tuple[tuple[str, str], ...]) -> list[str]:
    """One case's decomposition as the cells under :func:`_decomposition_head` (%)."""
    return [f"{100 * d.terms[k]:.4f}" for k, _ in terms] + [f"{100 * d.residual:.4f}", f"{100 * d.gap:.4f}"]


def _per_completion(log: StepLog, values: np.ndarray, warmup: float) -> float:
    w = window(log, warmup)
    c = int(log.completed[w].sum())
    return float(values[w].sum()) / c if c else float("nan")


@dataclass(frozen=True, slots=True, eq=False)
class Report:
    """The comparison over all cases, with the batch-time fit and the A100 predictions."""

    results: list[CaseResult]
    profile: A100Profile | None
    fit: BatchTimeModel | None
    fit_report: FitReport | None
    warmup: float
    plots: list[str] = field(default_factory=list)
    sglang: list[SglangCaseResult] = field(default_factory=list)

    # --- the tables, as rows of strings
    def main_rows(self) -> list[list[str]]:
        """μ per step and the gaps, one row per case."""
        rows = []
        for r in self.results:
            m, v = r.mu_model, r.mu_vllm
            meas = r.mu_measured.value
            rows.append(
                _mu_cells(r.case.name, r.config.M, r.mu_paper, m, v, meas, r.vllm is not None, r.difference)
                + [
                    f"{_per_completion(r.measured, r.measured.preempted, self.warmup):.3f}",
                    f"{_per_completion(r.measured, r.measured.recomputed, self.warmup):.1f}",
                    f"{_per_completion(r.model, r.model.recomputed, self.warmup):.1f}",
                    f"{r.slope.value:+.4f}",
                    "on" if r.caching else "off",
                    _pm(r.off.mu_measured) if r.off is not None else "n/a",
                    _ratio(r.mu_measured, r.off.mu_measured) if r.off is not None else "n/a",
                    f"{meas / r.mu_paper:.3f}",
                ]
            )
        return rows

    MAIN_HEADER = [
        "case",
        "M (tokens)",
        "μ paper (/step)",
        "μ vllm-v1 model (/step)",
        "μ vLLM (/step)",
        "gap paper→vLLM %",
        "gap model→vLLM %",
        "step-identical",
        "preemptions /completion",
        "recomputed tok /completion (vLLM)",
        "recomputed tok /completion (model)",
        "queue slope (/step)",
        "prefix caching",
        "μ measured, caching off (/step)",
        "caching on / off",
        "measured / μ paper",
    ]

    def caching_rows(self) -> list[list[str]]:
        """Prefix caching on beside off, one row per case that ran both: the rates, model and vLLM,
        their ratio and each over the no-sharing ``μ_paper``."""
        rows = []
        for r in self.results:
            if r.off is None:
                continue
            on, off = r.mu_measured, r.off.mu_measured
            same = ["n/a" if v is None else ("yes" if d is None else "no")
                    for v, d in ((r.vllm, r.difference), (r.off.vllm, r.off.difference))]
            rows.append(
                [
                    r.case.name,
                    str(r.config.M),
                    f"{r.mu_paper:.5f}",
                    _pm(r.mu_model),
                    _pm(r.mu_vllm),
                    _pm(r.off.mu_model),
                    _pm(r.off.mu_vllm),
                    _ratio(on, off),
                    f"{on.value / r.mu_paper:.3f}",
                    f"{off.value / r.mu_paper:.3f}",
                    " / ".join(same),
                ]
            )
        return rows

    CACHING_HEADER = [
        "case",
        "M (tokens)",
        "μ paper, no sharing (/step)",
        "μ model on (/step)",
        "μ vLLM on (/step)",
        "μ model off (/step)",
        "μ vLLM off (/step)",
        "on / off (measured)",
        "measured on / μ paper",
        "measured off / μ paper",
        "step-identical on / off",
    ]

    def caching_gap_rows(self) -> list[list[str]]:
        """``ln(μ_on / μ_off)`` term by term (log points), one column per case that ran both."""
        gaps = [r.off.gap for r in self.results if r.off is not None]
        cols = [dict(g.rows()) for g in gaps]
        labels = [label for _, label in CACHING_TERMS] + ["residual", "total: ln(μ_on / μ_off)"]
        return [[label] + [f"{c[label]:+.2f}" for c in cols] for label in labels]

    def compute_rows(self) -> list[list[str]]:
        """What the hits saved, one row per term, one column per case that ran both: prefill tokens
        computed per completion, and the compute ceilings ``budget / tokens computed per completion``."""
        gaps = [r.off.gap for r in self.results if r.off is not None]
        ceil = [g.ceilings() for g in gaps]
        table: list[tuple[str, list[float], str]] = [
            ("prompt tokens /completion", [g.on.prompt for g in gaps], ".1f"),
            ("prefill tokens computed /completion, off", [g.off.prefill for g in gaps], ".1f"),
            ("prefill tokens computed /completion, on", [g.on.prefill for g in gaps], ".1f"),
            ("(a) prefill tokens saved by hits /completion", [g.saved for g in gaps], ".1f"),
            ("tokens computed /completion (prefill + decode), off", [g.off.computed for g in gaps], ".1f"),
            ("tokens computed /completion (prefill + decode), on", [g.on.computed for g in gaps], ".1f"),
            ("compute ceiling off: budget / tokens (/step)", [c[0] for c in ceil], ".4f"),
            ("compute ceiling on (/step)", [c[1] for c in ceil], ".4f"),
            ("compute ceiling on without the saving (/step)", [c[2] for c in ceil], ".4f"),
            ("steps with the budget spent, off", [g.off.budget_spent for g in gaps], ".3f"),
            ("steps with the budget spent, on", [g.on.budget_spent for g in gaps], ".3f"),
            ("(b) sharing on: own tables / memory in use", [g.on.sharing for g in gaps], ".3f"),
            ("sharing off (1: nothing shared)", [g.off.sharing for g in gaps], ".3f"),
        ]
        if self.profile is not None:
            # in seconds the steps differ too: fewer prefill tokens, but more requests attending longer contexts
            per_s = [(self._rate_per_s(r.measured), self._rate_per_s(r.off.measured))
                     for r in self.results if r.off is not None]
            table += [
                ("μ on, A100 profile step times (req/s)", [on for on, _ in per_s], ".3f"),
                ("μ off, A100 profile step times (req/s)", [off for _, off in per_s], ".3f"),
                ("on / off in req/s (A100 profile)", [on / off for on, off in per_s], ".3f"),
            ]
        return [[label] + [format(v, fmt) for v in vals] for label, vals, fmt in table]

    def _rate_per_s(self, log: StepLog) -> float:
        """Completions per second over the window with the A100 profile's step times."""
        assert self.profile is not None
        return saturated_rate_per_second(log, np.maximum(self.profile.step_times(log), 1e-12), self.warmup).value

    def caching_names(self) -> list[str]:
        """The cases that ran with caching on and off."""
        return [r.case.name for r in self.results if r.off is not None]

    def sglang_rows(self) -> list[list[str]]:
        """μ per step on SGLang: the formula, the ``sglang`` model, SGLang's own scheduler; one row per case."""
        rows = []
        for r in self.sglang:
            m, v = r.mu_model, r.mu_real
            log = r.measured
            w = self.warmup
            n = len(log.steps)
            win = log.steps[int(n * w):]
            kv = float(np.mean([st.kv_used for st in win])) / r.params.M if win else float("nan")
            queued = [float(st.kv_used) for st in win if st.queue > 0]
            idle_q = float(np.mean(queued)) / r.params.M if queued else float("nan")
            retracted = [float(len(st.retracted)) for st in log.steps]
            prefill_share = float(np.mean([st.kind == "prefill" for st in win])) if win else float("nan")
            rows.append(
                _mu_cells(r.case.name, r.params.M, r.mu_paper, m, v, (v or m).value, r.real is not None, r.difference)
                + [
                    f"{_sglang_per_completion(log, retracted, w):.3f}",
                    f"{kv:.3f}",
                    f"{idle_q:.3f}",
                    f"{prefill_share:.3f}",
                ]
            )
        return rows

    SGLANG_HEADER = [
        "case",
        "M (tokens)",
        "μ paper (/step)",
        "μ sglang model (/step)",
        "μ SGLang (/step)",
        "gap paper→SGLang %",
        "gap model→SGLang %",
        "step-identical",
        "retractions /completion",
        "KV in use / M",
        "KV in use / M while queued",
        "prefill-only steps share",
    ]

    def radix_rows(self) -> list[list[str]]:
        """SGLang's radix cache on beside off, and vLLM's block cache on beside off on the same plan
        when the case ran on vLLM too: one row per SGLang case that ran both."""
        by_name = {r.case.name: r for r in self.results}
        rows = []
        for s in self.sglang:
            if s.off is None:
                continue
            v = by_name.get(s.case.name)
            same = ["n/a" if real is None else ("yes" if d is None else "no")
                    for real, d in ((s.real, s.difference), (s.off.real, s.off.difference))]
            row = [s.case.name, str(s.params.M), _pm(s.mu_measured), _pm(s.off.mu_measured),
                   _ratio(s.mu_measured, s.off.mu_measured)]
            if v is not None and v.off is not None:
                row += [_pm(v.mu_measured), _pm(v.off.mu_measured), _ratio(v.mu_measured, v.off.mu_measured)]
            else:
                row += ["n/a", "n/a", "n/a"]
            rows.append(row + [" / ".join(same)])
        return rows

    RADIX_HEADER = [
        "case",
        "M (tokens)",
        "μ SGLang radix on (/step)",
        "μ SGLang radix off (/step)",
        "SGLang on / off",
        "μ vLLM blocks on (/step)",
        "μ vLLM blocks off (/step)",
        "vLLM on / off",
        "SGLang step-identical on / off",
    ]

    def decomposition_rows(self) -> list[list[str]]:
        """One row per term, one column per case (log points, %)."""
        return _decomposition_rows(TERMS, [r.decomposition for r in self.results])

    def sglang_decomposition_rows(self) -> list[list[str]]:
        """SGLang's decomposition: one row per term, one column per case (log points, %)."""
        return _decomposition_rows(SGLANG_TERMS, [r.decomposition for r in self.sglang])

    def pairs(self) -> list[tuple[CaseResult, SglangCaseResult]]:
        """The cases replayed on both engines, in order."""
        by_name = {r.case.name: r for r in self.results}
        return [(by_name[s.case.name], s) for s in self.sglang if s.case.name in by_name]

    def family_rows(self) -> list[list[str]]:
        """vLLM beside SGLang at the same ``M``: the measured μ and the gap by family (log points)."""
        rows = []
        for v, s in self.pairs():
            fv, fs = gap_families(v.decomposition), gap_families(s.decomposition)
            row = [v.case.name, str(v.case.M), _pm(v.mu_measured), _pm(s.mu_real or s.mu_model),
                   f"{100 * v.decomposition.gap:+.2f}", f"{100 * s.decomposition.gap:+.2f}"]
            row += [f"{100 * fv[k]:+.2f} / {100 * fs[k]:+.2f}" for k, _ in FAMILIES]
            rows.append(row)
        return rows

    def ignore_eos_rows(self) -> list[list[str]]:
        """SGLang's ``ignore_eos`` path beside its ratio path and the model, one row per case that ran it."""
        rows = []
        for r in self.sglang:
            if r.eos is None:
                continue
            e = r.eos.real
            mu_e = sglang_rate(e.log, self.warmup)
            retracted = [float(len(st.retracted)) for st in e.log.steps]
            rows.append(
                [
                    r.case.name,
                    str(r.params.M),
                    f"{r.mu_paper:.5f}",
                    _pm(r.mu_model),
                    _pm(r.mu_real),
                    _pm(mu_e),
                    f"{100 * relative_gap(r.mu_model.value, mu_e.value):+.2f}",
                    "none" if r.eos.first_step is None else str(r.eos.first_step),
                    e.admission_path,
                    f"{_sglang_per_completion(e.log, retracted, self.warmup):.3f}",
                    str(e.calls["ScheduleBatch.retract_decode"]),
                ]
            )
        return rows

    EOS_HEADER = [
        "case",
        "M (tokens)",
        "μ paper (/step)",
        "μ sglang model (/step)",
        "μ SGLang ratio path (/step)",
        "μ SGLang ignore_eos (/step)",
        "gap model→ignore_eos %",
        "first differing step",
        "admission path run",
        "retractions /completion (ignore_eos)",
        "retract_decode calls (ignore_eos)",
    ]

    @property
    def family_header(self) -> list[str]:
        """The header of :meth:`family_rows`."""
        return ["case", "M (tokens)", "μ vLLM (/step)", "μ SGLang (/step)", "gap vLLM", "gap SGLang"] + [
            f"{label} (vLLM / SGLang)" for _, label in FAMILIES
        ]

    def a100_rows(self) -> list[list[str]]:
        """b̄ and μ in requests/s on an A100 by the profile (kernel time only)."""
        if self.profile is None:
            return []
        rows = []
        for r in self.results:
            log = r.measured
            w = window(log, self.warmup)
            t_prof = self.profile.step_times(log)
            bb = bbar_estimates(t_prof[w][log.tokens[w] > 0])
            mu_const = r.mu_paper / bb.median
            mu_prof = saturated_rate_per_second(log, np.maximum(t_prof, 1e-12), self.warmup)
            row = [r.case.name, f"{1e3 * bb.median:.2f}", f"{1e3 * bb.trimmed_mean:.2f}", f"{mu_const:.3f}",
                   f"{mu_prof.value:.3f}"]
            if self.fit is not None:
                t_fit = self.fit.times(log)
                mu_fit = saturated_rate_per_second(log, np.maximum(t_fit, 1e-12), self.warmup)
                rec = float(log.recomputed[w].sum())
                # a recomputed token is a prefill token: charged b per token by the fitted model
                cost = self.fit.b * rec
                total = float(t_fit[w].sum())
                free = float(log.completed[w].sum()) / (total - cost)
                row += [f"{mu_fit.value:.3f}", f"{100 * cost / total:.2f}", f"{free:.3f}"]
            else:
                row += ["n/a", "n/a", "n/a"]
            rows.append(row)
        return rows

    A100_HEADER = [
        "case",
        "b̄ median (ms)",
        "b̄ trimmed mean (ms)",
        "μ paper, constant b̄ (req/s)",
        "μ measured, profile step times (req/s)",
        "μ fitted batch-time model (req/s)",
        "recompute share of time %",
        "μ if recompute were free (req/s)",
    ]

    # --- writers
    def markdown(self) -> str:
        """The whole report as Markdown."""
        out = ["# kvstab empirical compare", ""]
        out.append(
            "μ per step: the paper's `M / E[g]` (continuous g, chunk 512), kvstab's `vllm-v1` model and vLLM 0.33.0's "
            "own v1 scheduler, on the same overloaded Poisson plan (load 1.3 × μ_paper, or the case's own load when "
            f"that would not flood it); steady-state window after {int(100 * self.warmup)} % warm-up; ± is a 95 % "
            "batch-means half-width.  Gaps are (predicted − measured) / measured."
        )
        caching = [r for r in self.results if r.caching]
        if caching:
            out += [
                "",
                "**Prefix caching is on** (vLLM 0.33's default; `--prefix-caching off` for the paper's world): the μ "
                "columns are with caching on, the caching-off rate and the ratio beside them.  **μ paper is the "
                "no-sharing formula** (`M / E[g]`, each request charged its whole prompt): with shared prefixes "
                "the measured rate exceeds it, and `measured / μ paper` says by how much.",
            ]
        out += ["", _md_table(self.MAIN_HEADER, self.main_rows()), ""]
        out += _case_notes(
            self.results, "the model departs from vLLM", "requests whose peak exceeds M were dropped from the plan"
        )
        out += ["", "## Decomposition of the paper formula's gap (log points, %)", ""]
        if caching:
            out += [
                "Taken on the caching-off runs (the formula's world, no shared blocks); the caching section below "
                "decomposes the rest of the way to the caching-on rate.",
                "",
            ]
        out.append(
            "Each term is `100·ln` of a ratio (see `kvstab.empirical.decompose`); the terms and the residual add up to "
            "the total `100·ln(μ_paper / μ_measured)`. Positive terms make the formula optimistic. The window boundary "
            "is the finite window's noise (work done before the window for requests completing in it, work in "
            "progress at its end); longer runs shrink it."
        )
        out += ["", _md_table(["term"] + [r.case.name for r in self.results], self.decomposition_rows()), ""]
        if caching:
            out += self._caching_markdown()
        if self.sglang:
            out += ["## SGLang 0.5.23 (issue 16)", ""]
            out.append(
                "The same plans (requests SGLang refuses left out) on kvstab's `sglang` model and on SGLang's own "
                "scheduler (`Scheduler.get_next_batch_to_run` and its PrefillAdder, ScheduleBatch, pools and ratio "
                "tracker; chunk 512, page 1, max_running_requests 256, `ignore_eos=False`). A step is a prefill-only "
                "or a decode-only step, so μ per step is not comparable with vLLM's mixed steps in seconds."
            )
            out += ["", _md_table(self.SGLANG_HEADER, self.sglang_rows()), ""]
            if any(r.off is not None for r in self.sglang):
                out += ["### SGLang's radix cache on vs off, beside vLLM's block cache (issue 27)", ""]
                out.append(
                    "The rows above ran with SGLang's radix cache on (its server default; LPM queue order, the model "
                    "is `kvstab.lifecycles.sglang_radix` on the reference engine), the plan's prompts as token ids. "
                    "Here the same plan with the cache off (`--disable-radix-cache`) beside it, and vLLM's block "
                    "cache on and off on the same plan. μ is per step on each engine: SGLang's steps are "
                    "prefill-only or decode-only, vLLM's mixed, so compare the on / off ratios across engines."
                )
                out += ["", _md_table(self.RADIX_HEADER, self.radix_rows()), ""]
            out += _case_notes(
                self.sglang, "the sglang model departs from SGLang", "requests SGLang refuses were left out of the plan"
            )
            out += ["", "### Decomposition of the paper formula's gap to SGLang (log points, %)", ""]
            out.append(
                "See `kvstab.empirical.decompose_sglang`: idle memory by SGLang's causes (what the reservation "
                "holds back, the batch_is_full flag, the caps and budgets, head-of-line), the retraction waste, the "
                "window boundary and the area per request, whose last link is the area held through prefill-only "
                "steps (no decode progress). The terms and the residual add up to the total."
            )
            cases = [s.case.name for s in self.sglang]
            out += ["", _md_table(["term"] + cases, self.sglang_decomposition_rows()), ""]
            if any(s.eos is not None for s in self.sglang):
                out += ["### SGLang's ignore_eos regime (what `kvstab bench` measures on a real server)", ""]
                out.append(
                    "The same plans with every request `ignore_eos=True`: SGLang admits through "
                    "`PrefillAdder.add_one_req_ignore_eos` (confirmed by the calls counted) and reserves running "
                    "requests at ratio 1.0; kvstab's `sglang` model has the ratio path only, so it departs from the "
                    "first differing step named."
                )
                out += ["", _md_table(self.EOS_HEADER, self.ignore_eos_rows()), ""]
            if self.pairs():
                out += ["### vLLM and SGLang at the same M: the gap by family (log points, %)", ""]
                out.append(
                    "Each cell is vLLM's / SGLang's sum of the terms of one family; a larger gap is a lower "
                    "saturated rate per step (a less stable server at the same M)."
                )
                out += ["", _md_table(self.family_header, self.family_rows()), ""]
        if self.profile is not None:
            out += ["## A100 / Llama-3-8B: b̄ and μ in requests/s from the profile", ""]
            out.append(
                "Step times from the vidur A100 profile (kernel time only: the LM head, sampling and the engine's CPU "
                "time are not in it, so real steps are longer and real μ lower). The constant-b̄ column is the paper's "
                "prediction with b̄ = the median profiled step; the fitted column charges every step, recomputed "
                "prefill tokens included, through the fitted batch-time model."
            )
            out += ["", _md_table(self.A100_HEADER, self.a100_rows()), ""]
            de, pe = self.profile.decode_error, self.profile.prefill_error
            out.append(
                f"Profile surrogates (per layer, relative error RMS / max): decode attention {100 * de[0]:.1f} % / "
                f"{100 * de[1]:.1f} %, prefill attention {100 * pe[0]:.1f} % / {100 * pe[1]:.1f} %."
            )
        if self.fit is not None and self.fit_report is not None:
            f = self.fit_report
            out += [
                "",
                f"Fitted batch-time model (cvxpy, non-negative): `{self.fit.describe()}`; held-out steps: relative RMS "
                f"error {100 * f.test_rel_rmse:.2f} %, max {100 * f.test_max_rel:.2f} %, error of the summed time "
                f"{100 * f.test_total_rel:+.3f} % ({f.train_steps} steps fitted, {f.test_steps} held out).",
            ]
        if self.plots:
            out += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in self.plots]
        return "\n".join(out) + "\n"

    def _caching_markdown(self) -> list[str]:
        """The prefix-caching section: on beside off, the gap decomposed, what the hits saved."""
        names = self.caching_names()
        out = ["## Prefix caching on vs off (vLLM's block pool, `enable_prefix_caching`)", ""]
        out.append(
            "The same plan on the same server with caching on and off; the model with caching runs the reference "
            "engine (the compiled step-log replay has no block pool yet).  `on / off` gives the range the two 95 % intervals "
            "allow.  μ paper is the no-sharing formula: a rate of sharing is not in it yet."
        )
        out += ["", _md_table(self.CACHING_HEADER, self.caching_rows()), ""]
        out += ["### The caching gap, decomposed (log points, %)", ""]
        out.append(
            "`C/T = Ū · σ · f / ḡ` in each run (`kvstab.empirical.decompose.decompose_caching`), so the terms add up "
            "to `100·ln(μ_on / μ_off)`: **(b) shared memory** is `ln(σ_on / σ_off)`, σ the requests' own block "
            "tables summed over the memory in use (a block held by k requests is one block of M, in k tables; "
            "σ = 1 without sharing); **(a) saved prefill compute** shows here as the area per completed request "
            "(a hit's prefill starts past its cached blocks, so its lifetime loses the steps that would compute "
            "them); then memory in use, preemption waste and the window boundary."
        )
        out += ["", _md_table(["term"] + names, self.caching_gap_rows()), ""]
        out += ["### (a) The prefill compute the hits saved, and what it is worth", ""]
        out.append(
            "Prefill tokens computed per completion off and on (a hit is not computed; the last token of a "
            "whole-prompt hit is), and the compute ceiling `budget / tokens computed per completion`: the most "
            "completions a step's token budget allows.  *On without the saving* is that ceiling for a server "
            "that shared the memory but computed every prompt token: when the measured caching-on rate is above "
            "it, shared memory alone could not have reached it — the saved compute is what keeps the server "
            "memory-bound.  In seconds the steps differ too (fewer prefill tokens, but more running requests "
            "attending their whole contexts, the shared prefix included): with the A100 profile the last rows "
            "price both runs' steps."
        )
        out += ["", _md_table(["quantity"] + names, self.compute_rows()), ""]
        return out

    def write_csv(self, path: str) -> None:
        """One row per case: the main table, then every decomposition term (%)."""
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            head = list(self.MAIN_HEADER) + _decomposition_head(TERMS)
            head += [f"caching {k} %" for k, _ in CACHING_TERMS] + ["caching residual %", "caching total %"]
            head += ["prefill tokens saved /completion"]
            if self.profile is not None:
                head += self.A100_HEADER[1:]
            w.writerow(head)
            a100 = self.a100_rows()
            for i, (row, r) in enumerate(zip(self.main_rows(), self.results)):
                gap = r.off.gap if r.off is not None else None
                cells = (
                    [f"{100 * gap.terms[k]:.4f}" for k, _ in CACHING_TERMS]
                    + [f"{100 * gap.residual:.4f}", f"{100 * gap.gap:.4f}", f"{gap.saved:.1f}"]
                    if gap is not None
                    else ["n/a"] * (len(CACHING_TERMS) + 3)
                )
                w.writerow(row + _decomposition_cells(r.decomposition, TERMS) + cells + (a100[i][1:] if a100 else []))

    def write_sglang_csv(self, path: str) -> None:
        """One row per SGLang case: the SGLang table, then every term of its decomposition (%)."""
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(list(self.SGLANG_HEADER) + _decomposition_head(SGLANG_TERMS))
            for row, r in zip(self.sglang_rows(), self.sglang):
                w.writerow(row + _decomposition_cells(r.decomposition, SGLANG_TERMS))

    def latex(self) -> str:
        """The main and decomposition tables as LaTeX ``tabular`` environments."""
        parts = [_tex_table(self.MAIN_HEADER, self.main_rows())]
        parts.append(_tex_table(["term"] + [r.case.name for r in self.results], self.decomposition_rows()))
        if self.caching_names():
            parts.append(_tex_table(self.CACHING_HEADER, self.caching_rows()))
            parts.append(_tex_table(["term"] + self.caching_names(), self.caching_gap_rows()))
            parts.append(_tex_table(["quantity"] + self.caching_names(), self.compute_rows()))
        if self.profile is not None:
            parts.append(_tex_table(self.A100_HEADER, self.a100_rows()))
        if self.sglang:
            parts.append(_tex_table(self.SGLANG_HEADER, self.sglang_rows()))
            parts.append(_tex_table(["term"] + [s.case.name for s in self.sglang], self.sglang_decomposition_rows()))
            if self.pairs():
                parts.append(_tex_table(self.family_header, self.family_rows()))
        return "\n\n".join(parts) + "\n"


#: Families of decomposition terms, for the side-by-side table and the plot: (key, label).
FAMILIES: tuple[tuple[str, str], ...] = (
    ("capacity", "capacity"),
    ("reservation", "idle: SGLang's reservation"),
    ("idle", "idle: other causes"),
    ("waste", "preemption / retraction waste"),
    ("boundary", "window boundary"),
    ("stall", "area: prefill-only stalls"),
    ("area", "area per request: the rest"),
)
_RESERVATION = ("idle_ratio", "idle_new", "idle_head_max_new")


def gap_families(d: GapDecomposition) -> dict[str, float]:
    """The terms of ``d`` (vLLM's or SGLang's) summed by family (:data:`FAMILIES`); they add up to ``Σ terms``."""
    out = dict.fromkeys((k for k, _ in FAMILIES), 0.0)
    for key, value in d.terms.items():
        if key in ("capacity", "waste", "boundary", "stall"):
            out[key] += value
        elif key in _RESERVATION:
            out["reservation"] += value
        elif key.startswith("idle_"):
            out["idle"] += value
        else:
            out["area"] += value
    return out


def _decomposition_rows(terms: tuple[tuple[str, str], ...], decomps: list[GapDecomposition]) -> list[list[str]]:
    labels = [label for _, label in terms] + ["residual", "total: ln(μ_paper / μ_measured)"]
    cols = [dict(d.rows()) for d in decomps]
    return [[label] + [f"{c[label]:+.2f}" for c in cols] for label in labels]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _tex(text: str) -> str:
    """A table cell as LaTeX text, by theory's one escaper (:func:`kvstab.theory.latex.tex_text`).

    That escaper has no form for ``±`` yet (the half-widths of the tables), so
    the cell is escaped around it; once theory maps ``±`` this is ``tex_text(text)``.
    """
    return r"$\pm$".join(tex_text(part) for part in text.split("±"))


def _tex_table(header: list[str], rows: list[list[str]]) -> str:
    cols = "l" + "r" * (len(header) - 1)
    lines = [rf"\begin{{tabular}}{{{cols}}}", r"\hline", " & ".join(_tex(h) for h in header) + r" \\", r"\hline"]
    lines += [" & ".join(_tex(c) for c in row) + r" \\" for row in rows]
    lines += [r"\hline", r"\end{tabular}"]
    return "\n".join(lines)


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, or one line saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgument(
            "plots need matplotlib (pip install 'kvstab[empirical]', or matplotlib), or pass --no-plots"
        ) from None
    return plt


def writable_folder(out_dir: str) -> None:
    """Create ``out_dir`` if needed and check that files can be written in it,
    by writing (and removing) one: a read-only folder is refused before any
    case runs, so no work is lost."""
    where = os.fspath(out_dir)
    try:
        os.makedirs(where, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kvstab-write-check-", dir=where)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise InvalidArgument(
            f"--out {where!r}: cannot write the report there ({exc.strerror or exc}); give a writable folder"
        ) from None


#: the engines of the ``vllm-v1`` model's replay (:func:`model_replay`)
ENGINES = ("auto", "fast", "reference")


def model_replay(engine: str, caching: bool = False) -> Callable[[ArrivalPlan, ReplayConfig, int], StepLog]:
    """The replay of the ``vllm-v1`` model on ``engine``: ``"fast"`` (the compiled
    engine, :func:`kvstab.engine.replay_model`), ``"reference"``, or ``"auto"``
    (the fast one unless ``caching``); both give the same :class:`StepLog` step for
    step (``tests/test_engine_*``).  The compiled replay has no block pool yet (the
    compiled prefix-cache loop of ``kvstab.engine.run`` records no step log), so
    a replay with prefix caching on runs the reference engine, and ``"fast"`` with
    ``caching`` is refused."""
    if engine not in ENGINES:
        raise InvalidArgument(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "fast" and caching:
        raise InvalidArgument(
            "--engine fast: the compiled step-log replay has no prefix cache yet; with --prefix-caching on use "
            "--engine auto or reference (the reference engine), or pass --prefix-caching off"
        )
    if engine == "fast" or (engine == "auto" and not caching):
        from kvstab.engine import replay_model as fast

        return lambda plan, cfg, steps: fast(plan, cfg, steps)
    return lambda plan, cfg, steps: replay_model(plan, cfg, steps)


def plot_queues(out_dir: str, steps: int, seed: int, use_vllm: bool, engine: str = "auto") -> list[str]:
    """Queue length and KV utilisation over time for P/D 1:1 at ``M = 131000``, at 0.8 μ and 1.2 μ."""
    plt = _pyplot()
    case = Case("P/D 1:1", PAPER_M, PAPER_WORKLOADS["paper-1:1"])
    cfg = ReplayConfig.for_capacity(PAPER_M, 16)
    mu = case.M / case.expected_g(PAPER_CHUNK)
    runs = {}
    for load in (0.8, 1.2):
        plan = case.plan(steps, load * mu, seed)
        runs[load] = replay_vllm(plan, cfg, steps) if use_vllm else model_replay(engine)(plan, cfg, steps)
    src = "vLLM scheduler" if use_vllm else "vllm-v1 model"
    paths = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for load, log in runs.items():
        ax.plot(log.queue, label=f"λ = {load} μ", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("waiting requests")
    ax.set_title(f"Queue length, P/D 1:1, M = {PAPER_M} ({src})")
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "queue.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for load, log in runs.items():
        ax.plot(log.memory / cfg.M, label=f"λ = {load} μ", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("KV in use / M")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"KV utilisation, P/D 1:1 ({src})")
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "kv.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def plot_gaps(out_dir: str, results: list[CaseResult], sglang: list[SglangCaseResult]) -> str:
    """``gap.png``: the paper formula's gap per case by family of terms (:data:`FAMILIES`), stacked
    (positive terms up, negative down, the total as a dot), vLLM's panel beside SGLang's."""
    plt = _pyplot()
    panels: list[tuple[str, list[str], list[GapDecomposition]]] = []
    if results:
        src = "vLLM 0.33" if results[0].vllm is not None else "vllm-v1 model"
        panels.append((src, [r.case.name for r in results], [r.decomposition for r in results]))
    if sglang:
        src = "SGLang 0.5.23" if sglang[0].real is not None else "sglang model"
        panels.append((src, [s.case.name for s in sglang], [s.decomposition for s in sglang]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False, sharey=True)
    colours = plt.get_cmap("tab10").colors
    for ax, (title, names, decomps) in zip(axes[0], panels):
        fam = [gap_families(d) for d in decomps]
        x = np.arange(len(names))
        up = np.zeros(len(names))
        down = np.zeros(len(names))
        for j, (key, label) in enumerate(FAMILIES):
            v = np.array([100 * f[key] for f in fam])
            base = np.where(v >= 0, up, down)
            ax.bar(x, v, bottom=base, color=colours[j % len(colours)], label=label, width=0.7)
            up += np.maximum(v, 0)
            down += np.minimum(v, 0)
        ax.plot(x, [100 * d.gap for d in decomps], "ko", label="total gap")
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
        ax.set_title(f"Gap of μ_paper to {title}")
    axes[0][0].set_ylabel("log points (100·ln)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    path = os.path.join(out_dir, "gap.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare(
    cases: list[Case],
    out_dir: str,
    *,
    steps: int,
    small_steps: int | None = None,
    seed: int = 0,
    load: float = 1.3,
    warmup: float = 0.25,
    use_vllm: bool = True,
    profile: A100Profile | None = None,
    plots: bool = True,
    plot_steps: int = 6000,
    progress: Callable[[str], None] | None = None,
    engine: str = "auto",
    sglang: bool = False,
    use_sglang: bool = True,
    ignore_eos: bool = False,
    caching: bool = True,
    sglang_caching: bool = False,
) -> Report:
    """Run every case, fit the batch-time model on the measured logs, write the report files into ``out_dir``;
    ``caching``: the vLLM cases with prefix caching on, and off beside them (vLLM's default is on);
    ``sglang_caching``: the SGLang cases with SGLang's radix cache on, and off beside them."""
    model_replay(engine, caching)  # a bad engine name, or fast with caching, is one line before any work
    writable_folder(out_dir)  # checked before any case runs, so no work is lost
    if plots:
        _pyplot()  # likewise: a missing matplotlib is one line before the runs
    results = []
    for c in cases:
        if progress is not None:
            progress(f"{c.name} (M={c.M})")
        n = c.steps(small_steps if (small_steps is not None and c.M <= SMALL_M) else steps)
        results.append(
            run_case(c, n, load=load, seed=seed, warmup=warmup, use_vllm=use_vllm, engine=engine, caching=caching)
        )
    sg_results = []
    if sglang:
        for c in cases:
            if progress is not None:
                progress(f"{c.name} (M={c.M}) on SGLang")
            n = c.steps(small_steps if (small_steps is not None and c.M <= SMALL_M) else steps)
            sg_results.append(
                run_sglang_case(c, n, load=load, seed=seed, warmup=warmup, use_sglang=use_sglang, ignore_eos=ignore_eos,
                                caching=sglang_caching)
            )
    fit = fit_report = None
    if profile is not None:
        logs = [r.measured for r in results]
        fit, fit_report = fit_batch_time(logs, [profile.step_times(g) for g in logs], seed=seed)
    paths = plot_queues(out_dir, plot_steps, seed, use_vllm, engine) if plots else []
    if plots and (results or sg_results):
        paths.append(plot_gaps(out_dir, results, sg_results))
    report = Report(results, profile, fit, fit_report, warmup, paths, sg_results)
    with open(os.path.join(out_dir, "compare.md"), "w", encoding="utf-8") as fh:
        fh.write(report.markdown())
    report.write_csv(os.path.join(out_dir, "compare.csv"))
    if report.sglang:
        report.write_sglang_csv(os.path.join(out_dir, "compare-sglang.csv"))
    with open(os.path.join(out_dir, "compare.tex"), "w", encoding="utf-8") as fh:
        fh.write(report.latex())
    return report
