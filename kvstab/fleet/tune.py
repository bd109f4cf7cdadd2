"""``kvstab tune``: from a target λ to vLLM's and SGLang's flags, and from an existing deployment's flags to its λ*.

**Forward.**  For each ``gpu_memory_utilization`` on a grid (0.80 … 0.94) and
each ``max_num_batched_tokens`` (512 … 8192, also the prefill chunk ``ŝ``, as
vLLM's one budget is both), the memory accounting of :mod:`kvstab.kv_capacity`
gives ``M``, the batch time ``b̄`` comes from ``--bbar`` or the shipped A100
profile, and three closed-form bounds on the stable rate follow:

* memory: ``μ = M/(b̄·E[g])`` (the paper's formula, with vLLM's blocks);
* token budget: every request needs ``s + o − 1`` tokens of compute
  (vLLM samples output token 1 in its last prefill step) and a step carries
  at most ``max_num_batched_tokens``: ``λ ≤ budget/(b̄·E[s + o − 1])``;
* running requests: by Little's law ``λ ≤ max_num_seqs/(b̄·E[n(s) + o − 1])``.

``max_num_seqs`` is chosen above the requests a full pool holds
(``M·E[lifetime]/E[g]``, with a quarter's slack), so that memory, not the cap,
binds.  The recommendation is the lowest utilisation (the most memory left for
everything else) whose least bound, less the margin, still carries ``λ``; at
that utilisation, the budget with the largest bound.  SGLang gets the same
``M`` from its own accounting (``mem_fraction_static``), ``chunked_prefill_size``
= the chunk and ``max_running_requests`` = ``max_num_seqs``.

**Verification.**  Each engine's model is simulated under overload on the fast
engine (``vllm-v1`` under vLLM's lifecycle with prefix caching off and on;
``sglang`` under SGLang's): both rules are FCFS through the queue's head, so
their saturated throughput is ``λ*`` (the audit's method, :mod:`kvstab.audit.stability`,
step 1).  A recommendation passes when ``λ ≤ (1 − margin)·λ*`` at the lower end
of λ*'s 95 % interval.

**Inverse.**  ``--from-flags "<vllm serve flags>"`` reads the deployment's
flags (vLLM's defaults for the rest: ``vllm/config/cache.py``,
``engine/arg_utils.py`` ``get_batch_defaults``), derives ``M``, and reports the
bounds, the binding one, the simulated ``λ*`` and the headroom ``1 − λ/λ*``.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvstab.errors import InvalidArgument
from kvstab.kv_capacity import GIB, GpuSpec, ModelShape, sglang_capacity, vllm_capacity, vllm_reserve
from kvstab.metrics import Estimate
from kvstab.model import PAPER_BBAR, PAPER_CHUNK, PAPER_M, ModelParams, prefill_slots
from kvstab.workload import Workload

__all__ = [
    "VllmFlags", "SglangFlags", "Bounds", "Engine", "ProfileBbar", "bounds", "recommend", "verify",
    "parse_vllm_flags", "saturated_rate", "UTILISATIONS", "BUDGETS", "FRACTIONS", "Recommendation", "Check",
    "sglang_search", "bbar_oracle", "recommend_verified",
]  # fmt: skip

#: the gpu_memory_utilization grid the forward search walks (vLLM 0.33's default is 0.92)
UTILISATIONS = (0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94)
#: the max_num_batched_tokens candidates (each also the prefill chunk)
BUDGETS = (512, 1024, 2048, 4096, 8192)
#: slack on the requests a full pool holds when choosing max_num_seqs
SEQ_SLACK = 1.25


@dataclass(frozen=True, slots=True)
class VllmFlags:
    """The ``vllm serve`` flags kvstab models (vLLM 0.33's names)."""

    gpu_memory_utilization: float = 0.92
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None

    def command(self, model: str) -> str:
        """The ready ``vllm serve`` line."""
        parts = ["vllm", "serve", model, "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}",
                 "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", str(self.max_num_batched_tokens),
                 "--block-size", str(self.block_size)]  # fmt: skip
        if not self.enable_prefix_caching:
            parts.append("--no-enable-prefix-caching")
        if self.num_gpu_blocks_override is not None:
            parts += ["--num-gpu-blocks-override", str(self.num_gpu_blocks_override)]
        if self.kv_cache_memory_bytes is not None:
            parts += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        return shlex.join(parts)


@dataclass(frozen=True, slots=True)
class SglangFlags:
    """The ``sglang.launch_server`` flags kvstab models (SGLang 0.5.23's names)."""

    mem_fraction_static: float
    max_running_requests: int
    chunked_prefill_size: int
    page_size: int = 1

    def command(self, model: str) -> str:
        """The ready ``python -m sglang.launch_server`` line (radix cache off: tune sizes and verifies SGLang without it)."""
        return shlex.join(["python", "-m", "sglang.launch_server", "--model-path", model,
                           "--mem-fraction-static", f"{self.mem_fraction_static:g}",
                           "--max-running-requests", str(self.max_running_requests),
                           "--chunked-prefill-size", str(self.chunked_prefill_size),
                           "--page-size", str(self.page_size), "--disable-radix-cache"])  # fmt: skip


@dataclass(frozen=True, slots=True)
class Moments:
    """The workload's means the bounds need (by sampling: any law, traces too)."""

    tokens: float  # E[s + o − 1]
    lifetime: Callable[[int], float]  # chunk ↦ E[n(s) + o − 1]


def moments(workload: Workload, seed: int = 0, n: int = 40_000) -> Moments:
    """``E[s + o − 1]`` and ``E[n(s) + o − 1]`` by sampling ``n`` requests."""
    s, o = workload.sample(np.random.default_rng(seed), n)
    s = np.asarray(s, dtype=np.int64)
    o = np.asarray(o, dtype=np.int64)
    return Moments(float(np.mean(s + o - 1)), lambda chunk: float(np.mean(prefill_slots(s, chunk) + o - 1)))


@dataclass(frozen=True, slots=True)
class ProfileBbar:
    """``b̄`` from the shipped A100 / Llama-3-8B profile, anchored at the paper's measured
    ``b̄ = 0.0372 s`` (``M = 131 000``, ``ŝ = 512``): the profile's kernel times leave out the LM
    head, sampling and the engine's CPU (``empirical/batchtime.py``), so kvstab uses its *ratio*
    between a configuration and the paper's, times the paper's measurement."""

    profile: Any
    anchor_ms: float

    def step_ms(self, M: int, budget: int, decoders: float, mean_s: float) -> float:
        """Profile milliseconds of a saturated step: ``decoders`` requests decoding over ``M`` tokens of
        KV, the rest of the token budget a prefill chunk over half a mean prompt of context."""
        p = self.profile
        d = min(decoders, budget)
        prefill = max(budget - d, 0.0)
        lin = float(np.interp(d + prefill, p.tokens, p.linear_ms))
        dec = p.decode_coef[0] + p.decode_coef[1] * M * (d / decoders if decoders else 0.0)
        c = mean_s / 2
        pre = (p.prefill_coef[0] + p.prefill_coef[1] * prefill + p.prefill_coef[2] * prefill * c
               + p.prefill_coef[3] * prefill**2) if prefill else 0.0  # fmt: skip
        return lin + 32 * (dec + pre)

    def bbar(self, M: int, budget: int, decoders: float, mean_s: float) -> float:
        """Seconds per slot for the configuration."""
        return PAPER_BBAR * self.step_ms(M, budget, decoders, mean_s) / self.anchor_ms

    def sglang_bbar(self, M: int, chunk: int, decoders: float, mean_s: float, mean_o: float) -> float:
        """Seconds per step of SGLang's alternation: prefill-only steps of ``chunk`` tokens and decode-only
        steps of ``decoders`` requests over ``M`` tokens of KV, weighted by their shares at saturation
        (per request ``E[s]/chunk`` prefill steps and ``E[o]/decoders`` decode steps)."""
        prefill = self.step_ms(M, chunk, 0.0, mean_s)
        decode = self.step_ms(M, max(int(decoders), 1), decoders, mean_s)
        p_steps, d_steps = mean_s / chunk, mean_o / max(decoders, 1.0)
        share = p_steps / (p_steps + d_steps)
        return PAPER_BBAR * (share * prefill + (1 - share) * decode) / self.anchor_ms


def profile_bbar(workload: Workload, eg_paper: float, lifetime_paper: float, mean_s: float) -> ProfileBbar:
    """The anchored profile oracle (loads the shipped profile: a second or two of fits)."""
    from kvstab.data import profile_dir
    from kvstab.empirical.batchtime import load_profile

    prof = load_profile(str(profile_dir()))
    raw = ProfileBbar(prof, 1.0)
    d = PAPER_M * lifetime_paper / eg_paper
    return ProfileBbar(prof, raw.step_ms(PAPER_M, PAPER_CHUNK, d, mean_s))


def bbar_oracle(shape: ModelShape, gpu: GpuSpec, workload: Workload) -> BbarFn:
    """b̄ from the shipped A100 / Llama-3-8B profile (:class:`ProfileBbar`) for ``workload``: a saturated mixed
    step for vLLM, the prefill/decode alternation for SGLang; refused in one line where the profile does not
    apply (another GPU, another model): ``--bbar`` is then the user's to give."""
    if gpu.profile is None or not shape.is_llama3_8b:
        why = f"no batch-time profile ships for {gpu.name}" if gpu.profile is None else \
            "the shipped A100 profile is Llama-3-8B's and this model is another"
        raise InvalidArgument(f"{why}: give --bbar (seconds per step at saturation; kvstab bench measures it)")
    from kvstab.workload import parse_workload

    s, o = workload.sample(np.random.default_rng(0), 4096)
    mean_s, mean_o = float(np.mean(s)), float(np.mean(o))
    paper = parse_workload("paper-1:1")
    pm = moments(paper, n=8192)
    oracle = profile_bbar(paper, _eg(paper, PAPER_CHUNK, 1), pm.lifetime(PAPER_CHUNK), 805.0)
    where = f"the shipped A100 profile ({gpu.profile}), scaled to the paper's measured {PAPER_BBAR} s"

    def fn(M: int, budget: int, d: float, engine: str) -> tuple[float, str]:
        if engine == "sglang":
            return oracle.sglang_bbar(M, budget, d, mean_s, mean_o), where + ": prefill-only and decode-only steps"
        return oracle.bbar(M, budget, d, mean_s), where + ": a saturated mixed step"

    return fn


@dataclass(frozen=True, slots=True)
class Bounds:
    """The closed-form bounds on the stable rate of one server (req/s)."""

    memory: float
    tokens: float | None
    seqs: float | None

    @property
    def least(self) -> float:
        """The least bound."""
        return min(x for x in (self.memory, self.tokens, self.seqs) if x is not None)

    @property
    def binding(self) -> str:
        """Which constraint gives the least bound."""
        named = {"KV memory M": self.memory, "token budget (max_num_batched_tokens)": self.tokens,
                 "running cap (max_num_seqs)": self.seqs}  # fmt: skip
        return min((v, k) for k, v in named.items() if v is not None)[1]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"memory_per_s": self.memory, "token_budget_per_s": self.tokens, "running_cap_per_s": self.seqs,
                "least_per_s": self.least, "binding": self.binding}  # fmt: skip


def bounds(workload: Workload, params: ModelParams, mom: Moments, *, token_budget: bool = True) -> Bounds:
    """The three bounds of the module docstring for the server ``params``."""
    mu = params.M / (params.bbar * _eg(workload, params.chunk, params.block))
    tok = params.token_budget / (params.bbar * mom.tokens) if token_budget and params.token_budget else None
    seqs = params.max_num_seqs / (params.bbar * mom.lifetime(params.chunk)) if params.max_num_seqs else None
    return Bounds(mu, tok, seqs)


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine's configuration as kvstab models it."""

    engine: str  # "vllm" or "sglang"
    params: ModelParams
    flags: VllmFlags | SglangFlags
    capacity: dict[str, Any]
    bounds: Bounds
    bbar_source: str


def _seqs_for(M: int, eg: float, lifetime: float) -> int:
    """max_num_seqs above what a full pool holds (M·E[lifetime]/E[g]) with slack: a multiple of 64, ≥ 256."""
    return max(256, int(math.ceil(SEQ_SLACK * M * lifetime / eg / 64)) * 64)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The forward search's answer."""

    vllm: Engine
    sglang: Engine
    lam: float
    margin: float
    considered: tuple[tuple[float, int, float], ...]  # (utilisation, budget, least bound) on the grid


#: (M, budget or chunk, decoders, engine) ↦ (b̄, where it came from)
BbarFn = Callable[[int, int, float, str], tuple[float, str]]


#: E[g] by (workload, chunk, block): the search asks for the same few many times
_EG: dict[tuple[str, int, int], float] = {}


def _eg(workload: Workload, chunk: int, block: int) -> float:
    """``E[g]`` of ``workload`` for chunk ``ŝ`` and block ``B`` (the closed forms of :mod:`kvstab.theory`)."""
    from kvstab.theory import stability_report

    key = (workload.describe(), chunk, block)
    if key not in _EG:
        _EG[key] = stability_report(workload, ModelParams(M=PAPER_M, chunk=chunk, block=block)).E_g
    return _EG[key]


def vllm_engine(
    workload: Workload, shape: ModelShape, gpu: GpuSpec, flags: VllmFlags, mom: Moments, bbar_fn: BbarFn,
    *, weights_bytes: int | None = None, available_bytes: int | None = None, kv_tokens: int | None = None,
) -> Engine:
    """vLLM's server for ``flags`` on ``gpu``: ``M`` (the accounting, or a measured/set size), b̄, the bounds."""
    B = flags.block_size
    if kv_tokens is not None:
        # vLLM logs num_blocks·B ("GPU KV cache size": get_kv_cache_capacity); one block is its null block
        M = (kv_tokens // B - 1) * B
        cap: dict[str, Any] = {"M_tokens": M, "num_gpu_blocks": kv_tokens // B, "block_size": B,
                               "source": "--kv-cache-tokens (vLLM's logged 'GPU KV cache size', less the null block)"}
    elif flags.num_gpu_blocks_override is not None:
        M = (flags.num_gpu_blocks_override - 1) * B
        cap = {"M_tokens": M, "num_gpu_blocks": flags.num_gpu_blocks_override, "source": "--num-gpu-blocks-override",
               "block_size": B}  # fmt: skip
    else:
        avail = available_bytes
        source = None
        if flags.kv_cache_memory_bytes is not None:
            avail, source = flags.kv_cache_memory_bytes, "--kv-cache-memory-bytes"
        reserve = vllm_reserve(shape, flags.max_num_batched_tokens, flags.max_num_seqs)
        c = vllm_capacity(shape, gpu, flags.gpu_memory_utilization, block_size=B, weights_bytes=weights_bytes,
                          reserve_bytes=reserve, available_bytes=avail, source=source)  # fmt: skip
        M, cap = c.M, c.as_dict()
    if M < B:
        raise InvalidArgument(f"the KV pool holds {M} tokens: less than one block of {B}")
    peak = -(-workload.max_total // B) * B
    if peak > M:
        raise InvalidArgument(f"requests of {workload.describe()!r} need up to {peak} tokens at their peak but the "
                              f"KV pool holds M = {M}: they could never run; a larger pool, or a workload that fits")  # fmt: skip
    eg = _eg(workload, flags.max_num_batched_tokens, B)
    # the requests a full pool holds, as many as the running cap lets in
    decoders = min(M * mom.lifetime(flags.max_num_batched_tokens) / eg, float(flags.max_num_seqs))
    bbar, how = bbar_fn(M, flags.max_num_batched_tokens, decoders, "vllm")
    params = ModelParams(M=M, chunk=flags.max_num_batched_tokens, block=B, token_budget=flags.max_num_batched_tokens,
                         max_num_seqs=flags.max_num_seqs, bbar=bbar, prefix_caching=flags.enable_prefix_caching)  # fmt: skip
    return Engine("vllm", params, flags, cap, bounds(workload, replace(params, prefix_caching=False), mom), how)


def sglang_engine(
    workload: Workload, shape: ModelShape, gpu: GpuSpec, like: Engine, mom: Moments, *,
    weights_bytes: int | None = None,
) -> Engine:
    """SGLang's server matching the vLLM one ``like``: the lowest ``mem_fraction_static`` (a 0.01 grid) whose
    pool is at least vLLM's ``M``, the same chunk, running cap and b̄."""
    vf = like.flags
    assert isinstance(vf, VllmFlags)
    cap = None
    for hundredths in range(60, 96):
        try:
            cap = sglang_capacity(shape, gpu, hundredths / 100, weights_bytes=weights_bytes)
        except InvalidArgument:
            continue  # the weights do not fit at this fraction yet
        if cap.M >= like.params.M:
            break
    if cap is None:
        raise InvalidArgument(f"SGLang: no mem_fraction_static ≤ 0.95 leaves room for the KV cache on {gpu.name}")
    flags = SglangFlags(cap.mem_fraction_static, vf.max_num_seqs, vf.max_num_batched_tokens)
    params = ModelParams(M=cap.M, chunk=flags.chunked_prefill_size, block=1, max_num_seqs=flags.max_running_requests,
                         bbar=like.params.bbar)  # fmt: skip
    return Engine("sglang", params, flags, cap.as_dict(), bounds(workload, params, mom, token_budget=False),
                  like.bbar_source + " (vLLM's, for the same chunk and pool)")  # fmt: skip


#: the mem_fraction_static grid SGLang's simulated search walks
FRACTIONS = (0.70, 0.74, 0.78, 0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92)


def sglang_search(
    workload: Workload, shape: ModelShape, gpu: GpuSpec, lam: float, margin: float, mom: Moments, bbar_fn: BbarFn,
    *, weights_bytes: int | None = None, seeds: int = 2, seed: int = 0,
) -> tuple[Engine, list[Check]]:
    """SGLang's flags by simulation: SGLang runs prefill-only and decode-only steps (no mixed batches in
    kvstab's model of it), which no closed-form bound here captures, so each ``mem_fraction_static`` on
    :data:`FRACTIONS` (lowest first) and ``chunked_prefill_size`` on :data:`BUDGETS` is simulated under
    overload (a fraction of a second each on the compiled engine); the first fraction at which some chunk
    carries ``λ`` with the margin wins, with its best chunk, and is verified again on fresh seeds."""
    need = lam / (1 - margin)
    best: tuple[float, Engine] | None = None
    for f in FRACTIONS:
        try:
            cap = sglang_capacity(shape, gpu, f, weights_bytes=weights_bytes)
        except InvalidArgument:
            continue  # the weights do not fit at this fraction
        found: tuple[float, Engine] | None = None
        for chunk in BUDGETS:
            eg = _eg(workload, chunk, 1)
            seqs = _seqs_for(cap.M, eg, mom.lifetime(chunk))
            bbar, how = bbar_fn(cap.M, chunk, cap.M * mom.lifetime(chunk) / eg, "sglang")
            params = ModelParams(M=cap.M, chunk=chunk, block=1, max_num_seqs=seqs, bbar=bbar)
            try:
                from kvstab.lifecycles.sglang import check_server

                check_server(params)
                if not params.fits_total(workload.max_total):
                    continue
            except InvalidArgument:
                continue
            eng = Engine("sglang", params, SglangFlags(f, seqs, chunk), cap.as_dict(),
                         bounds(workload, params, mom, token_budget=False), how)  # fmt: skip
            est, _u = saturated_rate("sglang", params, workload, 1.3 * eng.bounds.least, lifecycle="sglang",
                                     seeds=seeds, seed=seed + 1)  # fmt: skip
            if best is None or est.low > best[0]:
                best = (est.low, eng)
            if est.low >= need and (found is None or est.low > found[0]):
                found = (est.low, eng)
        if found is not None:
            return found[1], verify(found[1], workload, lam, margin, seeds=seeds, seed=seed)
    if best is None:
        raise InvalidArgument(f"SGLang: no mem_fraction_static up to {FRACTIONS[-1]} leaves room for a KV cache "
                              f"that holds every request on {gpu.name}")  # fmt: skip
    raise InvalidArgument(
        f"SGLang: λ = {lam:g} req/s is above anything one {gpu.name} carries with margin {margin:g}: the best "
        f"simulated configuration (mem_fraction_static {best[1].flags.mem_fraction_static:g}, "  # type: ignore[union-attr]
        f"chunked_prefill_size {best[1].params.chunk}) sustains λ* ≥ {best[0]:.4g} req/s; use --engine vllm or "
        f"about {math.ceil(need / best[0])} replicas (kvstab plan)"
    )


def recommend(
    workload: Workload, shape: ModelShape, gpu: GpuSpec, lam: float, margin: float, mom: Moments, bbar_fn: BbarFn,
    *, prefix_caching: bool = True, weights_bytes: int | None = None,
) -> Recommendation:
    """The forward search of the module docstring.  λ beyond every configuration on the grid is refused
    with the best the GPU reaches and the replicas it would take."""
    best: tuple[float, Engine] | None = None
    considered: list[tuple[float, int, float]] = []
    need = lam / (1 - margin)
    for util in UTILISATIONS:
        chosen: Engine | None = None
        for budget in BUDGETS:
            try:
                eg = _eg(workload, budget, 16)
                # max_num_seqs from M at a first guess of the reserve, then M again with the chosen cap
                first = vllm_engine(workload, shape, gpu, VllmFlags(util, 256, budget, 16, prefix_caching), mom,
                                    bbar_fn, weights_bytes=weights_bytes)  # fmt: skip
                seqs = _seqs_for(first.params.M, eg, mom.lifetime(budget))
                eng = vllm_engine(workload, shape, gpu, VllmFlags(util, seqs, budget, 16, prefix_caching), mom,
                                  bbar_fn, weights_bytes=weights_bytes)  # fmt: skip
            except InvalidArgument:
                continue
            considered.append((util, budget, eng.bounds.least))
            if best is None or eng.bounds.least > best[0]:
                best = (eng.bounds.least, eng)
            if eng.bounds.least >= need and (chosen is None or eng.bounds.least > chosen.bounds.least):
                chosen = eng
        if chosen is not None:
            sgl = sglang_engine(workload, shape, gpu, chosen, mom, weights_bytes=weights_bytes)
            return Recommendation(chosen, sgl, lam, margin, tuple(considered))
    if best is None:
        raise InvalidArgument(f"no configuration on {gpu.name} (gpu_memory_utilization up to {UTILISATIONS[-1]}) "
                              f"leaves a KV cache that holds the workload's largest request ({workload.max_total} "
                              "tokens): a larger GPU, or a workload that fits")  # fmt: skip
    reps = math.ceil(need / best[0])
    raise InvalidArgument(
        f"λ = {lam:g} req/s is above anything one {gpu.name} can carry with margin {margin:g}: the best "
        f"configuration (gpu_memory_utilization {best[1].flags.gpu_memory_utilization:g}, max_num_batched_tokens "  # type: ignore[union-attr]
        f"{best[1].params.chunk}) bounds λ* at {best[0]:.4g} req/s ({best[1].bounds.binding} binds), so "
        f"λ/(1 − margin) = {need:.4g} needs about {reps} replicas: see kvstab plan"
    )


def saturated_rate(
    scheduler: str, params: ModelParams, workload: Workload, rate: float, *, lifecycle: str, seeds: int = 3,
    lifetimes: float = 25.0, completions: float = 6000.0, seed: int = 0,
) -> tuple[Estimate, float]:
    """The saturated throughput (req/s, 95 % interval over ``seeds`` replications' batch means) of
    ``scheduler`` on ``params`` under Poisson arrivals at ``rate`` (an overload), and the mean KV
    utilisation.  Horizon: ``lifetimes`` mean lifetimes and ``completions`` completions at ``rate``."""
    from scipy import stats

    from kvstab.arrivals import poisson_arrivals
    from kvstab.audit.runs import derive_seed, run_model
    from kvstab.registry import load_scheduler

    mom = moments(workload, n=4096)
    per_slot = rate * params.bbar
    slots = int(max(lifetimes * mom.lifetime(params.chunk), completions / per_slot, 2000))
    sched = load_scheduler(scheduler)
    values: list[float] = []
    util: list[float] = []
    for rep in range(seeds):
        plan = poisson_arrivals(workload, rate, params, slots, seed=derive_seed("tune", seed, rep))
        out = run_model(sched, params, plan, slots, record=False, lifecycle=lifecycle)  # type: ignore[arg-type]
        thr = out.summary.throughput
        if thr is None:
            raise InvalidArgument("the verification run was too short to measure a throughput")
        values.append(thr.value / params.bbar)
        util.append(out.summary.utilisation)
    x = np.asarray(values)
    centre = float(x.mean())
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else math.inf
    return Estimate(centre, centre - half, centre + half, 0.95), float(np.mean(util))


@dataclass(frozen=True, slots=True)
class Check:
    """One engine model simulated under overload."""

    label: str
    scheduler: str
    lifecycle: str
    prefix_caching: bool
    critical: Estimate = field(metadata={"help": "λ*: the saturated throughput, req/s, 95 % interval"})
    utilisation: float
    lam: float | None
    margin: float

    @property
    def headroom(self) -> float | None:
        """``1 − λ/λ*`` (at the interval's lower end); None without a λ."""
        return None if self.lam is None else 1 - self.lam / self.critical.low

    @property
    def passed(self) -> bool:
        """λ at most (1 − margin)·λ* (lower end)."""
        return self.lam is None or self.lam <= (1 - self.margin) * self.critical.low

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        c = self.critical
        return {"model": self.label, "scheduler": self.scheduler, "lifecycle": self.lifecycle,
                "prefix_caching": self.prefix_caching, "critical_rate_per_s": c.value,
                "critical_rate_ci_per_s": [c.low, c.high], "kv_utilisation_saturated": self.utilisation,
                "headroom": self.headroom, "passed": self.passed}  # fmt: skip


def verify(
    engine: Engine, workload: Workload, lam: float | None, margin: float, *, caching: Sequence[bool] = (False, True),
    seeds: int = 3, seed: int = 0,
) -> list[Check]:
    """Simulate ``engine``'s model under overload (1.3 × its least bound): ``vllm-v1`` under vLLM's lifecycle
    for each of ``caching``, or ``sglang`` under SGLang's."""
    rate = 1.3 * engine.bounds.least
    out: list[Check] = []
    if engine.engine == "sglang":
        est, util = saturated_rate("sglang", engine.params, workload, rate, lifecycle="sglang", seeds=seeds, seed=seed)
        return [Check("sglang (SGLang 0.5.23's rule, radix cache off)", "sglang", "sglang", False, est, util, lam,
                      margin)]  # fmt: skip
    for on in caching:
        params = replace(engine.params, prefix_caching=on)
        est, util = saturated_rate("vllm-v1", params, workload, rate * (1.5 if on else 1.0), lifecycle="vllm",
                                   seeds=seeds, seed=seed)  # fmt: skip
        out.append(Check(f"vllm-v1 (vLLM 0.33's rule), prefix caching {'on' if on else 'off'}", "vllm-v1", "vllm", on,
                         est, util, lam, margin))  # fmt: skip
    return out


def recommend_verified(
    workload: Workload, shape: ModelShape, gpu: GpuSpec, lam: float, margin: float, mom: Moments, bbar_fn: BbarFn,
    *, prefix_caching: bool = True, weights_bytes: int | None = None, caching: Sequence[bool] = (False, True),
    seeds: int = 3, seed: int = 0, tries: int = 3,
) -> tuple[Recommendation, list[Check]]:
    """:func:`recommend`, then :func:`verify` of its vLLM flags; where the simulated λ* falls short of the
    bound the search used (blocks, recompute preemption, the budget shared by prefill and decode), the
    search is asked again for λ scaled by that shortfall, up to ``tries`` times.  The last answer is
    returned whether it passed or not (the caller prints the verdict)."""
    target = lam
    rec = recommend(workload, shape, gpu, target, margin, mom, bbar_fn, prefix_caching=prefix_caching,
                    weights_bytes=weights_bytes)  # fmt: skip
    checks = verify(rec.vllm, workload, lam, margin, caching=caching, seeds=seeds, seed=seed)
    for _ in range(tries - 1):
        if all(c.passed for c in checks):
            break
        worst = min(c.critical.low for c in checks)
        target = max(target * 1.02, target * rec.vllm.bounds.least / max(worst, 1e-12) * 1.02)
        try:
            again = recommend(workload, shape, gpu, target, margin, mom, bbar_fn, prefix_caching=prefix_caching,
                              weights_bytes=weights_bytes)  # fmt: skip
        except InvalidArgument:
            break  # nothing on the grid carries the corrected target: keep the failing answer and its verdict
        rec = replace(again, lam=lam)
        checks = verify(rec.vllm, workload, lam, margin, caching=caching, seeds=seeds, seed=seed)
    return rec, checks


#: ``vllm serve`` flags --from-flags reads, and the ones it accepts and ignores (they do not change the model)
_VLLM_VALUE_FLAGS = {
    "--gpu-memory-utilization": "gpu_memory_utilization", "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens", "--block-size": "block_size",
    "--num-gpu-blocks-override": "num_gpu_blocks_override", "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
}  # fmt: skip
_VLLM_IGNORED_VALUE_FLAGS = ("--model", "--host", "--port", "--served-model-name", "--dtype", "--max-model-len",
                             "--tokenizer", "--seed", "--api-key")  # fmt: skip


def parse_vllm_flags(text: str, gpu: GpuSpec) -> tuple[VllmFlags, str | None, list[str]]:
    """The flags of a ``vllm serve`` command line (with or without ``vllm serve MODEL`` in front), vLLM 0.33's
    defaults for the rest (the batch defaults by GPU: ``get_batch_defaults``); the model named, if any; and
    the flags accepted but not modelled.  An unknown flag is refused."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InvalidArgument(f"--from-flags {text!r} does not parse: {exc}") from None
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    model = None
    if words and not words[0].startswith("-"):
        model, words = words[0], words[1:]
    large = gpu.vllm_large_defaults
    kv: dict[str, Any] = {"max_num_seqs": 1024 if large else 256, "max_num_batched_tokens": 8192 if large else 2048}
    caching = True
    ignored: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, inline = w.partition("=")
        if name in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
            caching = name == "--enable-prefix-caching"
            i += 1
            continue
        if name == "--enable-chunked-prefill":
            i += 1
            continue
        if name in _VLLM_VALUE_FLAGS or name in _VLLM_IGNORED_VALUE_FLAGS:
            if eq:
                value = inline
            elif i + 1 < len(words):
                value = words[i + 1]
                i += 1
            else:
                raise InvalidArgument(f"--from-flags: {name} needs a value")
            i += 1
            if name in _VLLM_IGNORED_VALUE_FLAGS:
                if name == "--model":
                    model = value
                else:
                    ignored.append(f"{name} {value}")
                continue
            key = _VLLM_VALUE_FLAGS[name]
            try:
                kv[key] = float(value) if key == "gpu_memory_utilization" else int(value)
            except ValueError:
                raise InvalidArgument(f"--from-flags: {name} {value!r} is not a number") from None
            continue
        known = sorted([*_VLLM_VALUE_FLAGS, *_VLLM_IGNORED_VALUE_FLAGS, "--enable-prefix-caching",
                        "--no-enable-prefix-caching", "--enable-chunked-prefill"])  # fmt: skip
        raise InvalidArgument(f"--from-flags: {w!r} is not a vllm serve flag kvstab models; it reads {', '.join(known)}")
    flags = VllmFlags(enable_prefix_caching=caching, **kv)
    if not 0 < flags.gpu_memory_utilization <= 1:
        raise InvalidArgument(f"--from-flags: --gpu-memory-utilization must be in (0, 1], got {flags.gpu_memory_utilization}")
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(flags, key) < 1:
            raise InvalidArgument(f"--from-flags: --{key.replace('_', '-')} must be ≥ 1")
    return flags, model, ignored


def gib(x: float) -> int:
    """GiB (a float) in bytes."""
    return int(round(x * GIB))
