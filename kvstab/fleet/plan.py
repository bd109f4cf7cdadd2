"""Capacity planning: the cheapest fleet from a GPU menu, then verified by simulation.

**The program.**  A menu lists GPU types ``k`` with their KV capacity ``M_k``
(given, or derived from GPU memory, model size and KV bytes per token by
vLLM's accounting, :mod:`kvstab.kv_capacity`, the one ``kvstab tune`` uses),
batch time ``b̄_k``, cost per hour ``c_k`` and how many are available
``a_k``.  For a workload, each type has ``μ_k = M_k/(b̄_k·E_k[g])``.  The plan
chooses integer counts ``n_k`` and the routing flows ``x_k`` (requests per
second sent to type ``k``, split evenly over its ``n_k`` replicas):

    minimise   Σ c_k·n_k
    subject to Σ x_k = λ,   0 ≤ x_k ≤ ρ·r_k·n_k,   n_k ∈ {0, …, a_k}

with ``r_k = μ_k`` (``ρ`` is the target utilisation; ``--guarantee`` uses the
rate certified for the type's scheduler, :func:`kvstab.theory.certified.policy_guarantee`:
``μ_k(1 − Δ/M_k)`` for a non-preempting policy with a margin ``Δ``, nothing for
a preempting one).  The per-replica constraint ``x_k/n_k ≤ ρ·r_k`` is the static
split's stability condition of :mod:`kvstab.theory.fleet` (``λ·p_i < μ_i``)
with the margin ``ρ``; the split it yields is ``p_i = x_k/(n_k·λ)``.  It is a
mixed-integer linear program, written in cvxpy and solved with
``scipy.optimize.milp`` (HiGHS, shipped with SciPy; no licence, no network).

**Verification.**  The plan's fleet is simulated behind its router (default:
weighted round-robin with the plan's split) at ``λ``: the queue growth must
not be significantly above zero, and the measured capacity — the fleet's
saturated throughput with the same split at ``λ/ρ·1.2`` — gives the measured
margin ``1 − λ/capacity``.  Optional SLOs (TTFT / end-to-end percentiles) are
checked on the run at ``λ``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, prefill_slots
from kvstab.validation import MAX_COUNT, MAX_TOKENS, nonneg_int, positive_float, positive_int, unit_fraction
from kvstab.workload import Workload

__all__ = ["GpuType", "load_menu", "Plan", "solve_plan", "Verification", "verify_plan", "example_menu_path", "SLO"]

#: the keys that derive M from memory (instead of giving M)
_MEMORY_KEYS = ("gpu", "gpu_memory_gib", "config", "model_gib", "kv_bytes_per_token", "memory_utilisation",
                "reserve_gib")  # fmt: skip
#: every key a menu entry may have
_KEYS = {"name", "M", *_MEMORY_KEYS, "bbar", "cost_per_hour", "available", "chunk", "block", "scheduler"}


def _memory_M(raw: dict[str, Any], block: int, chunk: int) -> int:
    """``M`` of a menu entry from memory, by vLLM's accounting (:func:`kvstab.kv_capacity.vllm_capacity`, the
    one ``kvstab tune`` uses): the GPU's total (``gpu`` from kvstab's menu, or ``gpu_memory_gib``) times
    ``memory_utilisation`` (default 0.9), less the weights (``model_gib``, or the ``config``'s shape) and the
    activation/CUDA-graph reserve (``reserve_gib``, default :func:`~kvstab.kv_capacity.vllm_reserve`), in
    whole blocks of ``block`` tokens of ``kv_bytes_per_token`` (or the config's), one block being vLLM's
    null block."""
    from dataclasses import replace

    from kvstab.kv_capacity import GIB, GpuSpec, ModelShape, gpu_spec, load_model_shape, vllm_capacity, vllm_reserve

    if ("gpu" in raw) == ("gpu_memory_gib" in raw):
        raise InvalidArgument("needs M, or the GPU's memory: gpu (a name kvstab knows) or gpu_memory_gib, "
                              "with model_gib and kv_bytes_per_token (or config)")  # fmt: skip
    if "config" in raw:
        if "kv_bytes_per_token" in raw:
            raise InvalidArgument("give config or kv_bytes_per_token, not both")
        shape = load_model_shape(str(raw["config"]))
    else:
        missing = [k for k in ("model_gib", "kv_bytes_per_token") if k not in raw]
        if missing:
            raise InvalidArgument(f"needs M, or the model's size and KV bytes (missing {', '.join(missing)}; "
                                  "or give config = a config.json)")  # fmt: skip
        shape = ModelShape(int(positive_float("kv_bytes_per_token", raw["kv_bytes_per_token"], maximum=1e12)))
    if "model_gib" in raw:
        shape = replace(shape, weights_bytes=int(positive_float("model_gib", raw["model_gib"], maximum=1e6) * GIB))
    if "gpu" in raw:
        gpu = gpu_spec(str(raw["gpu"]))
    else:
        gpu = GpuSpec("gpu_memory_gib", positive_float("gpu_memory_gib", raw["gpu_memory_gib"], maximum=1e6))
    util = unit_fraction("memory_utilisation", raw.get("memory_utilisation", 0.9))
    reserve = (int(positive_float("reserve_gib", raw["reserve_gib"], maximum=1e6) * GIB) if "reserve_gib" in raw
               else vllm_reserve(shape, max(chunk, 2048), 256))  # fmt: skip
    try:
        cap = vllm_capacity(shape, gpu, util, block_size=block, reserve_bytes=reserve)
    except InvalidArgument as exc:
        raise InvalidArgument(f"the model does not fit: {exc}") from None
    return cap.M


@dataclass(frozen=True, slots=True)
class GpuType:
    """One entry of a GPU menu."""

    name: str = field(metadata={"help": "the GPU type's label, e.g. A100-80GB"})
    M: int = field(metadata={"help": "KV capacity in tokens of one replica of this type"})
    bbar: float = field(metadata={"help": "batch time b̄ in seconds per slot"})
    cost_per_hour: float = field(metadata={"help": "cost of one replica per hour (any currency)"})
    available: int = field(metadata={"help": "how many replicas of this type may be used"})
    chunk: int = field(default=512, metadata={"help": "chunked-prefill size ŝ"})
    block: int = field(default=1, metadata={"help": "KV block size B"})
    scheduler: str = field(default="current-fit", metadata={"help": "the scheduler each replica runs"})

    def params(self) -> ModelParams:
        """The server of one replica of this type (the menu's flat keys, as the one server object)."""
        return ModelParams(M=self.M, chunk=self.chunk, block=self.block, bbar=self.bbar)


def _entry(raw: Any, where: str) -> GpuType:
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: a GPU entry must be a table of keys, got {raw!r}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise InvalidArgument(f"{where}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(_KEYS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument(f"{where}: every GPU entry needs a non-empty 'name'")
    where = f"{where} ({name})"
    try:
        block = positive_int("block", raw.get("block", 1), maximum=MAX_TOKENS)
        chunk = positive_int("chunk", raw.get("chunk", 512), maximum=MAX_TOKENS)
        if "M" in raw:
            if any(k in raw for k in _MEMORY_KEYS):
                raise InvalidArgument(f"give either M or the memory keys ({', '.join(_MEMORY_KEYS)}), not both")
            M = positive_int("M", raw["M"], maximum=MAX_TOKENS)
        else:
            M = _memory_M(raw, block, chunk)
        return GpuType(
            name=name.strip(),
            M=M,
            bbar=positive_float("bbar", raw.get("bbar"), maximum=3600.0),
            cost_per_hour=positive_float("cost_per_hour", raw.get("cost_per_hour"), maximum=1e9),
            available=nonneg_int("available", raw.get("available"), maximum=MAX_COUNT),
            chunk=chunk,
            block=block,
            scheduler=str(raw.get("scheduler", "current-fit")),
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None


def load_menu(path: str | Path) -> tuple[GpuType, ...]:
    """A GPU menu from a TOML file (``[[gpu]]`` tables) or a JSON file (a list, or ``{"gpu": [...]}``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read GPU menu {str(p)!r}: {exc}") from None
    try:
        if p.suffix.lower() == ".json" or text.lstrip().startswith(("[{", "{", "[\n", "[ ")) and p.suffix != ".toml":
            data: Any = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument(f"GPU menu {str(p)!r} does not parse: {exc}") from None
    rows = data.get("gpu") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows:
        raise InvalidArgument(f"GPU menu {str(p)!r} lists no GPU types; expected [[gpu]] tables (TOML) or a JSON list")
    menu = tuple(_entry(r, f"GPU menu {str(p)!r}, entry {i + 1}") for i, r in enumerate(rows))
    names = [g.name for g in menu]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidArgument(f"GPU menu {str(p)!r} names {', '.join(dup)} more than once")
    return menu


def example_menu_path() -> Path:
    """The example menu shipped with kvstab (``kvstab/fleet/gpus-example.toml``)."""
    from importlib import resources

    return Path(str(resources.files("kvstab.fleet").joinpath("gpus-example.toml")))


@dataclass(frozen=True, slots=True)
class Plan:
    """The cheapest fleet for a load, by the mixed-integer program."""

    lam: float = field(metadata={"help": "the target load λ, req/s"})
    rho: float = field(metadata={"help": "target utilisation ρ"})
    guarantee: bool = field(metadata={"help": "whether the certified rates were used instead of μ_k"})
    types: tuple[GpuType, ...]
    mus: tuple[float, ...] = field(metadata={"help": "μ_k of each type, req/s"})
    deltas: tuple[float, ...] = field(metadata={"help": "δ_k of each type"})
    counts: tuple[int, ...] = field(metadata={"help": "n_k: replicas of each type"})
    flows: tuple[float, ...] = field(metadata={"help": "x_k: req/s routed to each type"})
    cost_per_hour: float
    solver: str
    sharing: tuple[bool, ...] = field(
        default=(), metadata={"help": "per type: whether μ_k is μ with sharing (its replicas cache prefixes and the "
                                      "workload's prefix law has a closed form), else the paper's μ"})

    @property
    def capacity(self) -> float:
        """``Σ n_k·μ_k``, req/s."""
        return float(sum(n * m for n, m in zip(self.counts, self.mus)))

    def replica_split(self) -> list[float]:
        """The share of λ each replica gets, replicas listed type by type."""
        out: list[float] = []
        for n, x in zip(self.counts, self.flows):
            if n:
                out += [x / n / self.lam] * n
        return out

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "lambda_per_s": self.lam,
            "rho": self.rho,
            "guarantee": self.guarantee,
            "cost_per_hour": self.cost_per_hour,
            "capacity_per_s": self.capacity,
            "solver": self.solver,
            "types": [
                {**asdict(t), "mu_per_s": m, "mu_basis": "sharing" if sh else "paper", "delta": d, "count": n,
                 "flow_per_s": x, "load_per_replica": (x / n / m) if n else None}
                for t, m, d, n, x, sh in zip(self.types, self.mus, self.deltas, self.counts, self.flows,
                                             self.sharing or (False,) * len(self.types))
            ],
        }  # fmt: skip


def _rates(
    types: Sequence[GpuType], workload: Workload, caching: Callable[[str], bool] | None = None
) -> tuple[list[float], list[float], list[bool]]:
    """Each type's μ_k and δ_k, and whether μ_k is μ with sharing: for a type whose replicas cache
    prefixes (``caching(scheduler)``) on a workload whose prefix law has a closed form
    (:func:`kvstab.theory.sharing_area.sharing_report`), the saturated rate it predicts (μ_share, or the
    running cap or token budget where one binds first) and δ_share; else the paper's μ and δ."""
    from kvstab.theory import stability_report
    from kvstab.theory.sharing_area import sharing_report

    mus: list[float] = []
    deltas: list[float] = []
    shared: list[bool] = []
    for t in types:
        params = t.params()
        if not params.fits_total(workload.max_total):
            # no --drop-oversize here: a dropped request is load the plan would silently not carry
            raise InvalidArgument(
                f"GPU type {t.name} (M = {t.M}): requests of workload {workload.describe()!r} need up to "
                f"{params.peak(workload.max_total)} tokens at their peak, and the fleet may route any request to any "
                "replica; raise its M in the menu, remove it from the menu, or plan for a workload that fits"
            )
        share = None
        if caching is not None and caching(t.scheduler):
            share = sharing_report(workload, dataclasses.replace(params, prefix_caching=True))
        if share is not None and share.delta_share is not None and share.predicted_per_slot > 0:
            # the least of its ceilings (memory with the shared part held once, the running cap, the token
            # budget): with sharing the cap on running requests can bind before memory does
            mus.append(share.predicted_per_slot / params.bbar)
            deltas.append(share.delta_share)
            shared.append(True)
            continue
        rep = stability_report(workload, params)
        mus.append(rep.mu_per_s)
        deltas.append(rep.delta)
        shared.append(False)
    return mus, deltas, shared


def _certified(types: Sequence[GpuType], workload: Workload, mus: Sequence[float]) -> list[float]:
    """Each type's certified stable rate (:func:`kvstab.theory.certified.policy_guarantee`
    for its scheduler: ``μ(1 − Δ/M)`` for a non-preempting policy with a margin ``Δ``);
    0 for a type whose scheduler has none.  None at all is refused: a guarantee
    that covers no replica is no guarantee."""
    from kvstab.registry import load_scheduler
    from kvstab.theory.certified import policy_guarantee

    rates: list[float] = []
    why: list[str] = []
    for t, m in zip(types, mus):
        rate, reason = policy_guarantee(load_scheduler(t.scheduler), t.params(), workload, m)
        rates.append(0.0 if rate is None else rate)
        why.append(f"{t.name} ({t.scheduler}): {reason}")
    if not any(r > 0 for r in rates):
        raise InvalidArgument("--guarantee: no GPU type of the menu has a certified stable rate; " + "; ".join(why))
    return rates


def _infeasible(lam: float, rho: float, types: Sequence[GpuType], rates: Sequence[float], what: str) -> str:
    need = lam / rho
    have = sum(t.available * r for t, r in zip(types, rates))
    alone = ", ".join(
        f"{math.ceil(need / r - 1e-12)} {t.name} alone ({t.available} available)" if r > 0 else f"{t.name}: {what} 0"
        for t, r in zip(types, rates)
    )
    return (
        f"no fleet from the menu carries λ = {lam:g} req/s at ρ = {rho:g}: it needs Σ n_k·{what} ≥ λ/ρ = {need:.4g} "
        f"req/s but every available GPU together gives {have:.4g} req/s (would need {alone})"
    )


def solve_plan(
    types: Sequence[GpuType], workload: Workload, lam: float, rho: float = 0.8, *, guarantee: bool = False,
    caching: Callable[[str], bool] | None = None,
) -> Plan:
    """The cheapest fleet for load ``lam`` at utilisation ``rho`` (see the module docstring).
    ``caching(scheduler)`` says whether a type's replicas cache prefixes: their μ_k is then μ with
    sharing where the workload's prefix law has a closed form (``docs/theory.md``, "Prefix caching").

    An infeasible request raises :class:`InvalidArgument` with one line naming the
    binding constraint (the load against all the capacity the menu holds).
    """
    import cvxpy as cp

    lam = positive_float("the target load λ", lam, maximum=1e9)
    rho = unit_fraction("the target utilisation ρ", rho)
    if not types:
        raise InvalidArgument("the GPU menu is empty")
    mus, deltas, sharing = _rates(types, workload, caching)
    if guarantee:
        rates = _certified(types, workload, mus)
        what = "certified rate"
    else:
        rates = list(mus)
        what = "μ_k"
    if sum(t.available * r for t, r in zip(types, rates)) * rho < lam * (1 - 1e-12):
        raise InvalidArgument(_infeasible(lam, rho, types, rates, what))
    k = len(types)
    n = cp.Variable(k, integer=True)
    x = cp.Variable(k)
    r = np.asarray(rates)
    cost = np.asarray([t.cost_per_hour for t in types])
    avail = np.asarray([t.available for t in types], dtype=np.float64)
    # a tiny price per replica breaks cost ties towards fewer replicas (fewer to run)
    tie = 1e-6 * float(cost.min())
    # flows as shares of λ (y = x/λ), and each replica's share capped at 1: y_k ≤ min(1, ρ·r_k/λ)·n_k is the
    # same constraint (a share never exceeds 1) but keeps the coefficients in [0, 1] — with μ ~ 10⁵ and
    # λ ~ 10⁻² the unscaled program is one the MILP solver wrongly calls infeasible
    cap_share = np.minimum(1.0, rho * r / lam)
    problem = cp.Problem(
        cp.Minimize(cost @ n + tie * cp.sum(n)),
        [cp.sum(x) == 1, x >= 0, x <= cp.multiply(cap_share, n), n >= 0, n <= avail],
    )
    solver = "SCIPY" if "SCIPY" in cp.installed_solvers() else "HIGHS"
    try:
        problem.solve(solver=solver)
    except cp.error.SolverError as exc:
        raise InvalidArgument(f"the MILP solver {solver} failed: {exc}") from None
    if problem.status not in ("optimal", "optimal_inaccurate") or n.value is None or x.value is None:
        raise InvalidArgument(_infeasible(lam, rho, types, rates, what) + f" [solver status {problem.status}]")
    counts = tuple(int(round(float(v))) for v in n.value)
    # the flows for the rounded counts: proportional to each type's allowed capacity
    # (the solver's flows are one optimum of many; this split keeps every replica
    # at the same utilisation, which is also the optimal static split)
    cap = np.asarray([ct * rt for ct, rt in zip(counts, rates)])
    flows = tuple(float(v) for v in lam * cap / cap.sum())
    return Plan(
        lam=lam, rho=rho, guarantee=guarantee, types=tuple(types), mus=tuple(mus), deltas=tuple(deltas),
        counts=counts, flows=flows, cost_per_hour=float(cost @ np.asarray(counts)),
        solver=f"cvxpy {cp.__version__} + {solver} (mixed-integer)", sharing=tuple(sharing),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SLO:
    """A latency objective: the ``percentile`` of TTFT or end-to-end latency at most ``seconds``."""

    metric: str = field(metadata={"help": "'ttft' or 'e2e'"})
    percentile: str = field(metadata={"help": "'p50', 'p90' or 'p99'"})
    seconds: float


@dataclass(frozen=True, slots=True)
class Verification:
    """The plan's fleet simulated at λ and under overload."""

    router: str
    path: str
    horizon_s: float
    slope: Any = field(metadata={"help": "queue growth at λ, req/s (an Estimate)"})
    stable: bool = field(metadata={"help": "the growth interval at λ does not lie above the threshold"})
    threshold: float = field(metadata={"help": "the growth threshold, req/s"})
    capacity: Any = field(metadata={"help": "saturated fleet throughput with the same split, req/s (an Estimate)"})
    margin: float = field(metadata={"help": "1 − λ/measured capacity"})
    utilisation: float = field(metadata={"help": "KV utilisation at λ"})
    ttft_s: dict[str, float]
    e2e_s: dict[str, float]
    slo: tuple[tuple[str, float, float, bool], ...] = field(
        metadata={"help": "(objective, target s, measured s, met) for each SLO"}
    )
    latency_run: str = field(default="Poisson arrivals at λ", metadata={"help": "the run the latencies come from"})
    prefix_caching: tuple[str, ...] = field(
        default=(), metadata={"help": "the replicas that ran with prefix caching (each its own block pool)"}
    )
    measured_over_planned: float = field(
        default=math.nan,
        metadata={"help": "measured capacity / the plan's Σ n·μ (μ the no-sharing formula: above 1 with shared blocks)"},
    )

    @property
    def passed(self) -> bool:
        """Stable at λ, a positive measured margin and every SLO met."""
        return self.stable and self.margin > 0 and all(ok for *_, ok in self.slo)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "router": self.router,
            "path": self.path,
            "horizon_s": self.horizon_s,
            "queue_growth_per_s": [self.slope.value, self.slope.low, self.slope.high],
            "growth_threshold_per_s": self.threshold,
            "stable": self.stable,
            "measured_capacity_per_s": [self.capacity.value, self.capacity.low, self.capacity.high],
            "measured_margin": self.margin,
            "utilisation": self.utilisation,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "latency_run": self.latency_run,
            "slo": [{"objective": o, "target_s": t, "measured_s": m, "met": ok} for o, t, m, ok in self.slo],
            "passed": self.passed,
            "prefix_caching_replicas": list(self.prefix_caching),
            "measured_capacity_over_planned": self.measured_over_planned,
        }


def plan_replicas(plan: Plan, caching: Callable[[str], bool] | None = None) -> list[Any]:
    """The plan's fleet as :class:`~kvstab.fleet.simulate.Replica` objects, type by type; ``caching``
    says from a type's scheduler whether its replicas run with prefix caching (default: none)."""
    from dataclasses import replace

    from kvstab.fleet.simulate import Replica

    out = []
    for t, n in zip(plan.types, plan.counts):
        params = t.params()
        if caching is not None:
            params = replace(params, prefix_caching=caching(t.scheduler))
        out += [Replica(params, t.scheduler, t.name) for _ in range(n)]
    return out


def verify_plan(
    plan: Plan, workload: Workload, *, router: str | None = None, horizon_s: float | None = None,
    slos: Sequence[SLO] = (), seed: int = 0, arrivals: Any = None, caching: Callable[[str], bool] | None = None,
) -> Verification:
    """Simulate the plan's fleet at ``plan.lam`` (or on ``arrivals``) and under
    overload with the same split; see the module docstring.

    ``router`` defaults to weighted round-robin with the plan's split; the
    horizon defaults to 40 mean request lifetimes on the slowest replica, and
    at least 20 000 requests.
    """
    from kvstab.fleet.critical import evaluate_rate
    from kvstab.fleet.simulate import caching_replicas

    replicas = plan_replicas(plan, caching)
    split = ",".join(f"{p:.12g}" for p in plan.replica_split())
    spec = router or f"weighted-rr:{split}"
    if horizon_s is None:
        ls, lo = workload.sample(np.random.default_rng(0), 4096)  # a mean lifetime n(s) + o, by sampling
        life = max(t.bbar * float(np.mean(prefill_slots(ls, t.chunk) + lo)) for t, n in zip(plan.types, plan.counts) if n)
        horizon_s = max(40 * life, 20_000 / plan.lam)
    horizon_s = positive_float("the verification horizon (seconds)", horizon_s, maximum=1e9)
    threshold = 0.01 * plan.lam
    at = evaluate_rate(replicas, spec, workload, plan.lam, horizon_s, seeds=2, max_seeds=4, threshold=threshold,
                       seed=seed)  # fmt: skip
    run = at.example
    if arrivals is not None:
        from kvstab.fleet.simulate import simulate_fleet

        run = simulate_fleet(replicas, spec, workload, arrivals, seed=seed)
    assert run is not None
    over = plan.lam / plan.rho * 1.2
    sat = evaluate_rate(replicas, spec, workload, over, horizon_s, seeds=2, classify=False, seed=seed)
    # with prefix caching the capacity can exceed the no-sharing Σ n·μ: raise the load until the queue grows
    for _ in range(4 if caching_replicas(replicas) else 0):
        if sat.slope.low > threshold:
            break
        over *= 2
        sat = evaluate_rate(replicas, spec, workload, over, horizon_s, seeds=2, classify=False, seed=seed)
    checks: list[tuple[str, float, float, bool]] = []
    for s in slos:
        measured = (run.fleet.ttft_s if s.metric == "ttft" else run.fleet.e2e_s).get(s.percentile, math.inf)
        checks.append((f"{s.metric} {s.percentile}", s.seconds, measured, measured <= s.seconds))
    return Verification(
        router=run.router, path=run.path_text, horizon_s=horizon_s, slope=at.slope,
        stable=at.slope.low <= threshold and at.slope.value <= threshold, threshold=threshold,
        capacity=sat.throughput, margin=1 - plan.lam / sat.throughput.value, utilisation=run.fleet.utilisation,
        ttft_s=run.fleet.ttft_s, e2e_s=run.fleet.e2e_s, slo=tuple(checks),
        latency_run="Poisson arrivals at λ" if arrivals is None else
        f"the given arrivals ({len(arrivals)} requests over {arrivals.horizon_s:g} s)",
        prefix_caching=tuple(caching_replicas(replicas)), measured_over_planned=sat.throughput.value / plan.capacity,
    )  # fmt: skip
