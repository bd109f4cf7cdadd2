"""Simulating a fleet: replicas behind a router, each on its own clock.

Replica ``i`` is one server of the model (``docs/MODEL.md``) with its own
:class:`~kvstab.model.ModelParams`, batch time ``b̄_i`` and scheduler.  Time is
continuous across the fleet: replica ``i``'s slot ``k`` spans
``[k·b̄_i, (k+1)·b̄_i)`` seconds, and a request the router sends it at time
``t`` arrives in its slot ``⌊t/b̄_i⌋`` (before that slot's decision).

Two paths, one semantics (``tests/fleet/test_fleet_simulate.py`` checks they
agree request by request on a state-independent router):

* **static** — a state-independent router routes the whole plan first; each
  replica then runs alone on the fast engine (:func:`kvstab.engine.run`:
  compiled for built-in schedulers, exact).  Seconds for 10⁶ requests.
* **event loop** — a state-dependent router needs the replicas' state at each
  arrival, so the replicas are stepped together in time order, each on the
  reference :class:`kvstab.simulator.Engine` (``Engine.arrive`` /
  ``Engine.step``; idle stretches are skipped).

Statistics are taken on a common time grid of :data:`GRID` bins over the
horizon ``H``, after a warm-up of ``warmup·H``: throughput (completions per
second, batch means over the window), queue growth (increase of the number in
system per second, batch means over the last half of the run — a stable queue
started empty fills for a while, and that filling reads as growth), memory
utilisation, TTFT and end-to-end latency percentiles (seconds; over requests
that arrived in the window and finished: censored in an unstable run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.errors import InvalidArgument
from kvstab.fleet.arrivals import FleetArrivals
from kvstab.fleet.routers import PromptChains, ReplicaInfo, ReplicaState, RoutedRequest, load_router, reads_prompts
from kvstab.metrics import Estimate, batch_means
from kvstab.model import ModelParams, prefill_slots, tokens_held
from kvstab.theory import FleetReport, fleet_report, stability_report
from kvstab.validation import MAX_SLOTS, positive_float
from kvstab.workload import Workload

__all__ = [
    "Replica",
    "Stats",
    "ReplicaResult",
    "FleetResult",
    "simulate_fleet",
    "caching_replicas",
    "needs_prompts",
    "compiled_event_ok",
    "replica_infos",
    "GRID",
    "WARMUP",
    "SLOPE_START",
    "Path",
]

#: bins of the common time grid the statistics are taken on
GRID = 2000
#: warm-up fraction of the horizon excluded from throughput, utilisation and latency
WARMUP = 0.25
#: queue growth is measured from this fraction of the horizon on
SLOPE_START = 0.5
#: batches of the batch-means intervals
BATCHES = 20

Path = Literal["auto", "static", "event"]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of a fleet: its server (batch time b̄_i included) and scheduler."""

    params: ModelParams = field(metadata={"help": "the server (M, ŝ, B, token budget, max_num_seqs, b̄)"})
    scheduler: str = field(default="current-fit", metadata={"help": "registered scheduler name or module:attr"})
    name: str = field(default="", metadata={"help": "a label for reports (e.g. the GPU type)"})

    def __post_init__(self) -> None:
        if not isinstance(self.params, ModelParams):
            raise InvalidArgument(f"a replica's params must be ModelParams, got {self.params!r}")
        positive_float("a replica's batch time b̄", self.params.bbar, maximum=3600.0)


@dataclass(frozen=True, slots=True)
class Stats:
    """Measured figures of one replica or of the whole fleet (rates per second)."""

    arrived: int = field(metadata={"help": "requests routed here over the horizon"})
    completed: int = field(metadata={"help": "requests finished over the horizon"})
    throughput: Estimate | None = field(metadata={"help": "completions per second in the steady window"})
    queue_slope: Estimate | None = field(
        metadata={"help": "growth of the number in system, requests per second (last half of the run)"}
    )
    utilisation: float = field(metadata={"help": "mean KV in use / M in the steady window (fleet: Σ used / Σ M)"})
    in_system_end: int = field(metadata={"help": "requests waiting or running at the horizon"})
    preemptions: int = field(metadata={"help": "preemptions over the horizon"})
    ttft_s: dict[str, float] = field(metadata={"help": "TTFT percentiles p50/p90/p99, seconds"})
    e2e_s: dict[str, float] = field(metadata={"help": "end-to-end latency percentiles p50/p90/p99, seconds"})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (estimates as ``[value, low, high]``)."""

        def est(e: Estimate | None) -> list[float] | None:
            return None if e is None else [e.value, e.low, e.high]

        return {
            "arrived": self.arrived,
            "completed": self.completed,
            "throughput_per_s": est(self.throughput),
            "queue_growth_per_s": est(self.queue_slope),
            "utilisation": self.utilisation,
            "in_system_end": self.in_system_end,
            "preemptions": self.preemptions,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
        }


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    """One replica's run: its figures, which engine ran it, and its per-request outcomes."""

    replica: Replica
    info: ReplicaInfo
    stats: Stats
    engine: str = field(metadata={"help": "'fast', 'fast-plugin' or 'reference'"})
    arrival_s: FloatArray = field(repr=False, metadata={"help": "arrival time of each request it received, seconds"})
    finish_s: FloatArray = field(repr=False, metadata={"help": "end of each request's last slot, seconds (nan: unfinished)"})
    request_ids: IntArray = field(repr=False, metadata={"help": "the fleet-wide index of each request it received"})


@dataclass(frozen=True, slots=True)
class FleetResult:
    """A fleet run: per replica and fleet-wide figures, and the theory beside them."""

    router: str
    path: str = field(metadata={"help": "'static' (fast engine per replica) or 'event' (reference engines in time order)"})
    horizon_s: float
    rate_per_s: float = field(metadata={"help": "arrivals / horizon"})
    replicas: tuple[ReplicaResult, ...]
    fleet: Stats
    theory: FleetReport
    grid_s: FloatArray = field(repr=False, metadata={"help": "the time grid's edges, seconds"})
    in_system: FloatArray = field(repr=False, metadata={"help": "number in system per replica at each grid edge"})
    waiting: FloatArray = field(
        repr=False, metadata={"help": "requests waiting (not admitted) per replica at each grid edge"}
    )

    @property
    def path_text(self) -> str:
        """Which path ran, in words."""
        engines = sorted({r.engine for r in self.replicas})
        if self.path == "static":
            return f"static routing, each replica on its own ({'/'.join(engines)} engine)"
        if engines == ["fast"]:
            return "event loop over the replicas' clocks (compiled replicas, routed in the compiled loop)"
        return "event loop over the replicas' clocks (reference engine per replica)"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "router": self.router,
            "path": self.path,
            "engines": [r.engine for r in self.replicas],
            "horizon_s": self.horizon_s,
            "rate_per_s": self.rate_per_s,
            "theory": self.theory.as_dict(),
            "fleet": self.fleet.as_dict(),
            "replicas": [
                {"name": r.replica.name, "scheduler": r.replica.scheduler, "M": r.info.M, "bbar_s": r.info.bbar,
                 "mu_per_s": r.info.mu, "engine": r.engine, **r.stats.as_dict()}
                for r in self.replicas
            ],
        }


def replica_infos(replicas: Sequence[Replica], workload: Workload) -> tuple[tuple[ReplicaInfo, ...], list[float]]:
    """Each replica's ``μ_i``, ``E_i[g]`` (as :class:`ReplicaInfo`) and ``δ_i``."""
    infos: list[ReplicaInfo] = []
    deltas: list[float] = []
    for i, r in enumerate(replicas):
        mu_s, eg, delta = _theory(workload, r.params)
        infos.append(ReplicaInfo(i, mu_s, r.params, eg))
        deltas.append(delta)
    return tuple(infos), deltas


@lru_cache(maxsize=256)
def _theory(workload: Workload, params: ModelParams) -> tuple[float, float, float]:
    """``(μ, E[g], δ)`` of one replica; a search runs the same fleet many times
    (a workload is keyed by identity: it is not hashable by value)."""
    rep = stability_report(workload, params)
    return rep.mu_per_s, rep.E_g, rep.delta


def _check(replicas: Sequence[Replica], workload: Workload) -> None:
    if not replicas:
        raise InvalidArgument("a fleet needs at least one replica")
    for i, r in enumerate(replicas):
        if not isinstance(r, Replica):
            raise InvalidArgument(f"replica {i} must be a Replica, got {r!r}")
        if not r.params.fits_total(workload.max_total):
            # a size-blind router may send any request anywhere: every replica must fit every request
            raise InvalidArgument(
                f"replica {i} ({r.name or r.scheduler}): requests of workload {workload.describe()!r} need up to "
                f"{r.params.peak(workload.max_total)} tokens at their peak but its M = {r.params.M}; a size-blind "
                "router may send any request to any replica: raise M"
            )


@dataclass
class _Outcome:
    """Per-request outcomes of one replica, in the order it received them."""

    ids: IntArray
    arrival_s: FloatArray
    s: IntArray
    first_admit: IntArray
    finish: IntArray
    preemptions: IntArray
    memory: IntArray  # per slot from slot 0
    engine: str
    queue: IntArray  # waiting at the end of each slot, from slot 0


def _percentiles(x: FloatArray) -> dict[str, float]:
    if x.size == 0:
        return {}
    p = np.percentile(x, [50, 90, 99])
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}


def _estimate(x: FloatArray, scale: float) -> Estimate | None:
    return batch_means(x, BATCHES).scaled(scale) if x.size >= 4 else None


def _grid_series(
    arrival_s: FloatArray, finish_s: FloatArray, edges: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Completions per bin and number in system at each edge."""
    dt = float(edges[1] - edges[0])
    done = finish_s[np.isfinite(finish_s)]
    nb = edges.size - 1
    idx = np.minimum((done // dt).astype(np.int64), nb)  # finishes past the horizon land in an overflow bin
    comp = np.bincount(idx, minlength=nb + 1)[:nb].astype(np.float64)
    arrived = np.searchsorted(np.sort(arrival_s), edges, side="right")
    finished = np.searchsorted(np.sort(done), edges, side="right")
    return comp, (arrived - finished).astype(np.float64)


def _stats(
    outs: Sequence[_Outcome], servers: Sequence[ModelParams], edges: FloatArray, horizon: float, warmup: float,
) -> tuple[Stats, FloatArray]:
    """Figures of the requests of ``outs`` pooled (one replica, or the fleet), ``servers[i]`` the server of ``outs[i]``."""
    dt = float(edges[1] - edges[0])
    comp = np.zeros(edges.size - 1)
    n_sys = np.zeros(edges.size)
    lat_ttft: list[FloatArray] = []
    lat_e2e: list[FloatArray] = []
    used = 0.0
    capacity = 0.0
    arrived = completed = pre = 0
    t0 = warmup * horizon
    for out, server in zip(outs, servers):
        b = server.bbar
        fin = np.where(out.finish >= 0, (out.finish + 1) * b, np.nan)
        c, q = _grid_series(out.arrival_s, fin, edges)
        comp += c
        n_sys += q
        k0 = int(math.ceil(t0 / b))
        k1 = int(math.ceil(horizon / b))
        mem = out.memory[k0:k1]
        used += float(mem.mean()) if mem.size else 0.0
        capacity += server.M
        ok = (out.arrival_s >= t0) & (out.finish >= 0)
        n_s = prefill_slots(out.s[ok], server.chunk)
        lat_ttft.append((out.first_admit[ok] + n_s) * b - out.arrival_s[ok])
        lat_e2e.append((out.finish[ok] + 1) * b - out.arrival_s[ok])
        arrived += int(out.arrival_s.size)
        completed += int(np.count_nonzero(np.isfinite(fin) & (fin <= horizon)))
        pre += int(out.preemptions.sum())
    nb = edges.size - 1
    b0 = int(warmup * nb)
    s0 = int(SLOPE_START * nb)
    stats = Stats(
        arrived=arrived,
        completed=completed,
        throughput=_estimate(comp[b0:], 1 / dt),
        queue_slope=_estimate(np.diff(n_sys[s0:]), 1 / dt),
        utilisation=used / capacity if capacity else 0.0,
        in_system_end=int(n_sys[-1]),
        preemptions=pre,
        ttft_s=_percentiles(np.concatenate(lat_ttft)),
        e2e_s=_percentiles(np.concatenate(lat_e2e)),
    )
    return stats, n_sys


def _static(
    router: Any, replicas: Sequence[Replica], infos: Sequence[ReplicaInfo], arrivals: FleetArrivals, seed: int,
    schedulers: Sequence[Any], check: bool,
) -> list[_Outcome]:
    from kvstab.engine import run

    n = len(arrivals)
    rng = np.random.default_rng([seed, 1])
    where = np.asarray(_assign(router, n, infos, rng, arrivals), dtype=np.int64)
    if where.shape != (n,) or (n and (where.min() < 0 or where.max() >= len(replicas))):
        raise InvalidArgument(
            f"router {router.name!r}: assign must return {n} replica indices in [0, {len(replicas)}), got shape "
            f"{where.shape}"
        )
    outs: list[_Outcome] = []
    for i, (rep, sched) in enumerate(zip(replicas, schedulers)):
        ids = np.flatnonzero(where == i).astype(np.int64)
        t = arrivals.time[ids]
        slots = _slots(arrivals.horizon_s, rep.params)
        # each replica's pool is its own: a replica with caching shares blocks only among the requests it gets
        prompts = arrivals.prompts.take(ids) if arrivals.prompts is not None and rep.params.prefix_caching else None
        plan = ArrivalPlan(np.floor(t / rep.params.bbar).astype(np.int64), arrivals.s[ids], arrivals.o[ids],
                           prompts=prompts)
        out = run(sched, rep.params, plan, slots, check=check, engine="auto", record=True)
        res = out.result
        assert res is not None  # record=True
        outs.append(
            _Outcome(ids, t, res.s, res.first_admit, res.finish, res.preemptions, res.memory, out.engine, res.queue)
        )
    return outs


def _assign(router: Any, n: int, infos: Sequence[ReplicaInfo], rng: np.random.Generator,
            arrivals: FleetArrivals) -> Any:
    """A state-independent router's replica for each arrival (a prompt-reading one is handed the chains)."""
    if reads_prompts(router):
        return router.assign(n, infos, rng, PromptChains(arrivals.prompts, n))
    return router.assign(n, infos, rng)


def _slots(horizon: float, params: ModelParams) -> int:
    """The slots of ``params``' b̄ that cover ``horizon`` seconds."""
    bbar = params.bbar
    k = int(math.ceil(horizon / bbar))
    if k > MAX_SLOTS:
        raise InvalidArgument(f"a horizon of {horizon:g} s is {k} slots of b̄ = {bbar:g} s, more than {MAX_SLOTS}")
    return max(k, 1)


def _state(eng: Any, info: ReplicaInfo, request: RoutedRequest | None) -> ReplicaState:
    """What a state-dependent router sees of ``eng``; with ``request``, how much of its prompt the
    replica's pool holds cached (the lookup vLLM makes when the request reaches the queue's head)."""
    block = eng.params.block
    served = sum(r.attempt_area for r in eng.active)
    cache = eng.cache
    if cache is not None:
        kv = cache.used_tokens  # a block shared by several requests counts once
        hit = 0 if request is None else cache.kv.get_computed_blocks(request.hashes(block), request.s).num_tokens
        return ReplicaState(info, len(eng.waiting), len(eng.active), kv, served, hit)
    kv = sum(int(tokens_held(r.progress, block)) for r in eng.active)
    return ReplicaState(info, len(eng.waiting), len(eng.active), kv, served)


def _advance(eng: Any, target: int) -> None:
    """Step ``eng`` until its clock reaches slot ``target`` (idle stretches in one jump)."""
    while eng.slot < target:
        if eng.idle:
            eng.skip_to(target)
            return
        eng.step()


def _event(
    router: Any, replicas: Sequence[Replica], infos: Sequence[ReplicaInfo], arrivals: FleetArrivals, seed: int,
    schedulers: Sequence[Any], check: bool, static_router: bool,
) -> list[_Outcome]:
    from kvstab.simulator import Engine

    n = len(arrivals)
    rng = np.random.default_rng([seed, 1])
    engines = [Engine(sch, rep.params, check=check, spec=rep.scheduler) for rep, sch in zip(replicas, schedulers)]
    bbars = [rep.params.bbar for rep in replicas]
    fixed = np.asarray(_assign(router, n, infos, rng, arrivals), dtype=np.int64) if static_router else None
    got: list[list[int]] = [[] for _ in replicas]
    prompts = arrivals.prompts
    chains = PromptChains(prompts, n) if reads_prompts(router) else None
    looks = bool(getattr(router, "reads_cache", False))
    for k in range(n):
        t = float(arrivals.time[k])
        for eng, b in zip(engines, bbars):
            # floor(t/b), as the static path maps arrivals (Python's t // b is not: 1.0 // 0.1 == 9.0)
            _advance(eng, math.floor(t / b))
        if fixed is not None:
            j = int(fixed[k])
        else:
            req = None if chains is None else RoutedRequest(k, int(arrivals.s[k]), chains)
            states = [_state(e, inf, req if looks else None) for e, inf in zip(engines, infos)]
            j = router.choose(states, rng) if req is None else router.choose(states, rng, req)
            if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < len(engines):
                raise InvalidArgument(f"router {router.name!r} chose {j!r}; valid: a replica index in [0, {len(engines)})")
            j = int(j)
        if prompts is not None and engines[j].cache is not None:
            # the request's content, so that requests routed to one replica share its blocks
            out = None if prompts.output is None else int(prompts.output[k])
            engines[j].arrive(int(arrivals.s[k]), int(arrivals.o[k]), prompts.prompt(k), out)
        else:
            engines[j].arrive(int(arrivals.s[k]), int(arrivals.o[k]))
        got[j].append(k)
    outs: list[_Outcome] = []
    for eng, rep, ids_list in zip(engines, replicas, got):
        slots = _slots(arrivals.horizon_s, rep.params)
        _advance(eng, slots)
        ids = np.asarray(ids_list, dtype=np.int64)
        # slots skipped while idle keep no record: nothing held, nothing waiting
        memory = np.zeros(slots, dtype=np.int64)
        queue = np.zeros(slots, dtype=np.int64)
        for rec in eng.records:
            if rec.slot < slots:
                memory[rec.slot] = rec.memory
                queue[rec.slot] = rec.queue
        reqs = eng.requests
        cols = {k: np.fromiter((getattr(r, k) for r in reqs), dtype=np.int64, count=len(reqs))
                for k in ("s", "first_admit", "finish", "preemptions")}  # fmt: skip
        outs.append(
            _Outcome(ids, arrivals.time[ids], cols["s"], cols["first_admit"], cols["finish"], cols["preemptions"],
                     memory, "reference", queue)  # fmt: skip
        )
    return outs


class _Tables:
    """The replicas' tables for :mod:`kvstab.fleet._fleet_kernel`, stacked (row ``j`` is replica ``j``'s):
    the fast engine's state, request table and plan, the plan filled as requests are routed."""

    NAMES = ("pslot", "ps", "po", "R", "qbuf", "elist", "hk", "hid", "ph", "st", "out", "memory", "queue")

    def __init__(self, params: Sequence[ModelParams], cap: int, nslots: IntArray) -> None:
        from kvstab.engine import _kernel as K
        from kvstab.engine import _layout as L
        from kvstab.fleet import _fleet_kernel as FK

        N = len(params)
        self.pslot = np.full((N, cap), FK.NOT_YET, dtype=np.int64)
        self.ps = np.zeros((N, cap), dtype=np.int64)
        self.po = np.zeros((N, cap), dtype=np.int64)
        self.R = np.zeros((N, L.NF, cap), dtype=np.int64)
        for f in (L.F_FIRST, L.F_FIN, L.F_NXT, L.F_PRV):
            self.R[:, f] = -1
        self.qbuf = np.zeros((N, cap + 1), dtype=np.int64)
        self.elist = np.zeros((N, cap + 1), dtype=np.int64)
        self.hk = np.zeros((N, cap + 1), dtype=np.int64)
        self.hid = np.zeros((N, cap + 1), dtype=np.int64)
        # lazy decoders' phase counts, indexed mod B (a row as wide as the largest B that has them)
        self.ph = np.zeros((N, max([p.block for p in params if p.block <= K.LAZY_BMAX] or [1])), dtype=np.int64)
        self.st = np.zeros((N, L.ST_SIZE), dtype=np.int64)
        for f in (L.ST_AH, L.ST_AT, L.ST_LAH):
            self.st[:, f] = -1
        self.out = np.zeros((N, L.NSIM, FK.BUF), dtype=np.int64)
        self.memory = np.zeros((N, int(nslots.max())), dtype=np.int64)
        self.queue = np.zeros((N, int(nslots.max())), dtype=np.int64)

    def arrays(self) -> tuple[IntArray, ...]:
        """The tables in the kernel's argument order."""
        return tuple(getattr(self, name) for name in self.NAMES)

    def grow(self) -> None:
        """Double every replica's plan and request tables (each queue's ring laid out again from its head)."""
        from kvstab.engine import _layout as L
        from kvstab.fleet import _fleet_kernel as FK

        N, cap = self.pslot.shape
        new = 2 * cap

        def wider(a: IntArray, size: int, fill: int = 0) -> IntArray:
            b = np.full((*a.shape[:-1], size), fill, dtype=np.int64)
            b[..., : a.shape[-1]] = a
            return b

        self.pslot = wider(self.pslot, new, FK.NOT_YET)
        self.ps, self.po = wider(self.ps, new), wider(self.po, new)
        R = wider(self.R, new)
        for f in (L.F_FIRST, L.F_FIN, L.F_NXT, L.F_PRV):
            R[:, f, cap:] = -1
        self.R = R
        q = np.zeros((N, new + 1), dtype=np.int64)
        for j in range(N):
            qh, ql = int(self.st[j, L.ST_QH]), int(self.st[j, L.ST_QL])
            q[j, :ql] = self.qbuf[j, (qh + np.arange(ql)) % (cap + 1)]
            self.st[j, L.ST_QH] = 0
        self.qbuf = q
        self.elist, self.hk, self.hid = (wider(a, new + 1) for a in (self.elist, self.hk, self.hid))


def compiled_event_ok(router: Any, replicas: Sequence[Replica], schedulers: Sequence[Any], static_router: bool) -> bool:
    """Whether the event loop can run on compiled replicas: built-in rules of the shared kernel without
    prefix caching (lookahead's finish tree is sized from a whole plan: not here), behind JSQ or a
    state-independent router that reads no prompts."""
    from kvstab.engine import _layout as L
    from kvstab.engine.driver import fast_rule
    from kvstab.fleet.routers import JoinShortestQueue

    if not static_router and type(router) is not JoinShortestQueue:
        return False
    if static_router and reads_prompts(router):
        return False
    for rep, sch in zip(replicas, schedulers):
        pol = fast_rule(sch)
        if pol is None or pol == L.LOOKAHEAD or rep.params.prefix_caching:
            return False
    return True


def _event_compiled(
    router: Any, replicas: Sequence[Replica], infos: Sequence[ReplicaInfo], arrivals: FleetArrivals, seed: int,
    schedulers: Sequence[Any], check: bool, static_router: bool,
) -> list[_Outcome] | None:
    """The event loop on compiled replicas (:mod:`kvstab.fleet._fleet_kernel`); ``None`` at a broken
    invariant, for the reference loop to raise it with its record."""
    from kvstab.engine import _kernel as K
    from kvstab.engine import _layout as L
    from kvstab.engine._skeleton import config as settings_record
    from kvstab.engine.driver import fast_rule
    from kvstab.fleet import _fleet_kernel as FK

    n = len(arrivals)
    N = len(replicas)
    rng = np.random.default_rng([seed, 1])
    fixed = (np.asarray(_assign(router, n, infos, rng, arrivals), dtype=np.int64) if static_router
             else np.zeros(1, dtype=np.int64))  # fmt: skip
    # JSQ breaks a tie with one uniform of the run's generator per tie, in order: the same stream the
    # reference loop's router draws from one call at a time
    U = rng.random(n) if not static_router else np.zeros(1)
    cap = 64 + n // N + n // (4 * N)  # a fair share and a quarter; the tables grow when a replica outgrows it
    nslots = np.asarray([_slots(arrivals.horizon_s, r.params) for r in replicas], dtype=np.int64)
    tab = _Tables([r.params for r in replicas], cap, nslots)
    # one settings record a replica (the single-server engine's, kvstab.engine._skeleton.config); the fleet's
    # loop sets each batch's end and base slot in it
    records = []
    for rep, sch in zip(replicas, schedulers):
        pol = fast_rule(sch)
        assert pol is not None, "only built-ins reach the compiled fleet loop"
        records.append(settings_record(rep.params, check, 0, False, 0, 0, pol=pol, life=L.KVSTAB_LIFE))
    cfg = np.stack(records)
    bbar = np.asarray([r.params.bbar for r in replicas], dtype=np.float64)
    count = np.zeros(N, dtype=np.int64)
    where = np.zeros(n, dtype=np.int64)
    ucur = np.zeros(1, dtype=np.int64)
    FT = np.zeros((2, 1), dtype=np.int64)
    b1, b2, bp = np.zeros(1), np.zeros(1), np.zeros(L.BP_SIZE, dtype=np.int64)
    times = np.ascontiguousarray(arrivals.time, dtype=np.float64)
    s_all = np.ascontiguousarray(arrivals.s, dtype=np.int64)
    o_all = np.ascontiguousarray(arrivals.o, dtype=np.int64)
    k = 0
    code = FK.FIXED if static_router else FK.JSQ
    while True:
        status, k = FK.run_fleet(code, k, times, s_all, o_all, fixed, U, ucur, bbar, cfg, count, where, nslots,
                                 *tab.arrays(), FT, b1, b2, bp)  # fmt: skip
        if status == FK.VIOLATION:
            return None
        if status == FK.DONE:
            break
        tab.grow()
    outs: list[_Outcome] = []
    for j in range(N):
        if FK.advance(j, int(nslots[j]), cfg, nslots, *tab.arrays(), FT, b1, b2, bp) == FK.VIOLATION:
            return None
        R = tab.R[j]
        K.sync_lazy(R, tab.st[j], replicas[j].params.block)
        c = int(count[j])
        ids = np.flatnonzero(where == j).astype(np.int64)
        outs.append(_Outcome(ids, arrivals.time[ids], R[L.F_S, :c].copy(), R[L.F_FIRST, :c].copy(),
                             R[L.F_FIN, :c].copy(), R[L.F_NPRE, :c].copy(), tab.memory[j, : nslots[j]].copy(), "fast",
                             tab.queue[j, : nslots[j]].copy()))  # fmt: skip
    return outs


def caching_replicas(replicas: Sequence[Replica]) -> list[str]:
    """The labels of the replicas that run with prefix caching."""
    return [r.name or f"{i}:{r.scheduler}" for i, r in enumerate(replicas) if r.params.prefix_caching]


def _check_radix(replicas: Sequence[Replica], schedulers: Sequence[Any]) -> None:
    """Refuse an ``sglang`` replica with prefix caching: its cache is SGLang's radix cache
    (:mod:`kvstab.lifecycles.sglang_radix`), and the fleet's replica engines carry vLLM's block
    pool only, which would run SGLang's rule on another engine's cache without a word."""
    from kvstab.schedulers import Sglang

    for i, (rep, sch) in enumerate(zip(replicas, schedulers)):
        if rep.params.prefix_caching and isinstance(sch, Sglang):
            raise InvalidArgument(
                f"replica {rep.name or f'{i}:{rep.scheduler}'}: prefix caching on an sglang replica is SGLang's radix "
                "cache, which the fleet's replicas do not run yet (they carry vLLM's block pool); pass "
                "--prefix-caching off for it, or run vllm-v1 replicas"
            )


def _check_caching(replicas: Sequence[Replica], workload: Workload, arrivals: FleetArrivals, router: Any) -> None:
    """Refuse a run that would ignore the prompts' content: replicas with prefix caching, or a router that
    reads prompts, on arrivals without the prompts of a workload that has a prefix law.

    Both paths carry caching, each replica on its own block pool (no sharing across replicas): the static
    path runs the compiled cache engine per replica, the event loop reference engines with their pools."""
    cached = caching_replicas(replicas)
    if workload.prefix is None or arrivals.prompts is not None:
        return
    if cached:
        raise InvalidArgument(
            f"prefix caching on replica(s) {', '.join(cached)} but the arrivals carry no prompts for the workload's "
            f"prefix={workload.prefix.describe()}: draw them with prompts=True"
        )
    if reads_prompts(router):
        raise InvalidArgument(
            f"router {router.name!r} routes by the prompts' content but the arrivals carry no prompts for the "
            f"workload's prefix={workload.prefix.describe()}: draw them with prompts=True"
        )


def needs_prompts(replicas: Sequence[Replica], router: str | Any) -> bool:
    """Whether a run of ``replicas`` behind ``router`` needs the arrivals' prompt content."""
    rt = load_router(router) if isinstance(router, str) else router
    return bool(caching_replicas(replicas)) or reads_prompts(rt)


def simulate_fleet(
    replicas: Sequence[Replica],
    router: str | Any,
    workload: Workload,
    arrivals: FleetArrivals,
    *,
    seed: int = 0,
    path: Path = "auto",
    check: bool = True,
    warmup: float = WARMUP,
    grid: int = GRID,
    compiled: bool = True,
) -> FleetResult:
    """Run ``arrivals`` through ``router`` onto ``replicas`` up to ``arrivals.horizon_s``.

    ``workload`` is the length law the arrivals were drawn from (for ``μ_i``,
    ``δ_i`` and the theory beside the results).  ``path``: ``"auto"`` (static
    for a state-independent router, else the event loop), ``"static"``
    (refused for a state-dependent router) or ``"event"`` (the event loop even
    for a state-independent router: the cross-check).  ``seed`` seeds the
    router's own randomness.  ``compiled``: run the event loop on compiled replicas where it can
    (JSQ or a state-independent router, built-in rules without caching; ``False``: always the
    reference engines, the cross-check).
    """
    from kvstab.registry import load_scheduler

    _check(replicas, workload)
    if path not in ("auto", "static", "event"):
        raise InvalidArgument(f"path must be 'auto', 'static' or 'event', got {path!r}")
    if not 0 <= warmup < SLOPE_START:
        raise InvalidArgument(f"warm-up must be in [0, {SLOPE_START}), got {warmup!r}")
    rt = load_router(router) if isinstance(router, str) else router
    dependent = bool(rt.state_dependent)
    if path == "static" and dependent:
        raise InvalidArgument(f"router {rt.name!r} reads the replicas' state: it needs the event loop (path 'event')")
    chosen = "event" if dependent or path == "event" else "static"
    _check_caching(replicas, workload, arrivals, rt)
    bind = getattr(rt, "bind", None)
    infos, deltas = replica_infos(replicas, workload)
    if callable(bind):  # a router with state of its own starts each run afresh
        rt = bind(infos)
    schedulers = [load_scheduler(r.scheduler) for r in replicas]
    _check_radix(replicas, schedulers)
    if chosen == "static":
        outs = _static(rt, replicas, infos, arrivals, seed, schedulers, check)
    else:
        fast = None
        if compiled and compiled_event_ok(rt, replicas, schedulers, static_router=not dependent):
            fast = _event_compiled(rt, replicas, infos, arrivals, seed, schedulers, check, static_router=not dependent)
        # the reference loop: every other router and replica, and a broken invariant raised with its record
        outs = fast if fast is not None else _event(rt, replicas, infos, arrivals, seed, schedulers, check,
                                                    static_router=not dependent)
    H = arrivals.horizon_s
    edges = np.linspace(0.0, H, max(int(grid), 2 * BATCHES * 2) + 1)
    servers = [r.params for r in replicas]
    results: list[ReplicaResult] = []
    series: list[FloatArray] = []
    waiting: list[FloatArray] = []
    for i, out in enumerate(outs):
        st, q = _stats([out], [servers[i]], edges, H, warmup)
        series.append(q)
        # the queue at time t is the one left by the last slot that ended by t
        last = np.floor(edges / servers[i].bbar).astype(np.int64) - 1
        waiting.append(np.where(last >= 0, out.queue[np.clip(last, 0, out.queue.size - 1)], 0).astype(np.float64))
        fin = np.where(out.finish >= 0, (out.finish + 1) * servers[i].bbar, np.nan)
        results.append(ReplicaResult(replicas[i], infos[i], st, out.engine, out.arrival_s, fin, out.ids))
    fleet, _ = _stats(outs, servers, edges, H, warmup)
    rate = len(arrivals) / H
    return FleetResult(
        router=rt.name,
        path=chosen,
        horizon_s=H,
        rate_per_s=rate,
        replicas=tuple(results),
        fleet=fleet,
        theory=fleet_report([i.mu for i in infos], deltas, rate),
        grid_s=edges,
        in_system=np.vstack(series),
        waiting=np.vstack(waiting),
    )
