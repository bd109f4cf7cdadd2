"""An emulated vLLM engine in real time: kvstab's ``vllm-v1`` rule, stepped on a clock.

:class:`Emulator` owns a :class:`~kvstab.lifecycles.vllm.VllmEngine` (the
``vllm-v1`` rule with vLLM's request lifecycle: the last prefill step samples
output token 1, a preempted request keeps its outputs as prompt) and runs one
step after another while anything is waiting or running.  Each step lasts its
batch time — a constant ``b̄`` or the fitted model
``a + b·prefill + c·decode + d·kv_attended`` of
:class:`kvstab.empirical.batchtime.BatchTimeModel` — divided by ``speedup``:
the emulator is simply a server that many times faster, and every time it
reports (``/metrics``, its ground truth) is wall-clock seconds.  Tokens a step
produces are delivered when the step ends, as a GPU's would be.

With prefix caching (``server.prefix_caching``, vLLM's
``enable_prefix_caching``) the ``vllm-v1`` model runs vLLM's block pool: a
request sent as token ids shares the KV blocks of every full block of ids it
has in common with an earlier prompt (:func:`prompt_content`), and
``/metrics`` counts the prompt tokens looked up and found cached at each
request's first admission under vLLM's names (``vllm:prefix_cache_queries``,
``vllm:prefix_cache_hits``).

The emulator keeps its own ground truth (:class:`GroundTruth`): step
durations, completions and ``M``, so that a test can check what a client
measuring it over HTTP recovers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvstab.empirical.batchtime import BatchTimeModel
from kvstab.empirical.replay import composition
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.model import ModelParams, tokens_held
from kvstab.prefix import Prompt
from kvstab.schedulers.vllm_v1 import SCHEDULER
from kvstab.steplog import ReplayConfig
from kvstab.validation import positive_float

__all__ = [
    "EmulatorConfig",
    "Emulator",
    "LiveRequest",
    "GroundTruth",
    "Backend",
    "ModelBackend",
    "StepOutcome",
    "prompt_content",
]

#: vLLM's buckets (``vllm/v1/metrics/loggers.py``) for the histograms the harness reads
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_ITER_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """The emulated server: vLLM's pool and scheduler limits, and its clock.

    The server is one :class:`~kvstab.model.ModelParams` (its ``b̄`` is the
    seconds per step when no batch-time model is given); vLLM's own
    configuration of it, :attr:`vllm`, is derived from it, so that no limit is
    stated twice.
    """

    server: ModelParams = field(
        metadata={"help": "the server: M (a whole number of blocks), ŝ = token budget, B, max_num_seqs, b̄"}
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "longest s + o accepted; None = what the pool can hold"}
    )
    batch_time: BatchTimeModel | None = field(default=None, metadata={"help": "step time from the fitted model"})
    speedup: float = field(default=1.0, metadata={"help": "time runs this many times faster (steps last b/speedup)"})
    model: str = field(default="kvstab-emulator", metadata={"help": "the model name served"})
    honour_min_tokens: bool = field(
        default=True, metadata={"help": "False emulates a server that ignores min_tokens and ignore_eos"}
    )
    eos_after: int = field(default=16, metadata={"help": "where the emulated model emits EOS when allowed to stop"})
    scheduler: str = field(
        default="model", metadata={"help": "'model': kvstab's vllm-v1 rule; 'vllm': vLLM's own scheduler (vLLM extra)"}
    )

    vllm: ReplayConfig = field(init=False, repr=False, compare=False, metadata={"help": "vLLM's configuration of the server"})

    def __post_init__(self) -> None:
        if not isinstance(self.server, ModelParams):
            raise InvalidArgument(f"the emulated server must be ModelParams, got {self.server!r}")
        positive_float("b̄", self.server.bbar, maximum=3600.0)
        object.__setattr__(self, "vllm", ReplayConfig.from_params(self.server, max_model_len=self.max_model_len))
        object.__setattr__(self, "speedup", positive_float("speedup", self.speedup, maximum=1e6))
        if self.scheduler not in ("model", "vllm"):
            raise InvalidArgument(f"scheduler must be 'model' or 'vllm', got {self.scheduler!r}")
        if self.eos_after < 1:
            raise InvalidArgument(f"eos_after must be >= 1, got {self.eos_after}")

    @property
    def model_len(self) -> int:
        """The longest ``s + o`` accepted: the configured one, else what the pool can hold."""
        return self.max_model_len if self.max_model_len is not None else self.vllm.M + 1


@dataclass(eq=False)
class LiveRequest:
    """One request in flight: ``tokens`` receives the number of new output tokens
    after each step that produced some, then ``None`` when the request is done."""

    rid: int
    s: int
    o: int
    arrived: float
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    sent: int = 0
    last_token_at: float = 0.0


@dataclass(slots=True)
class GroundTruth:
    """What the emulator knows about itself (wall-clock seconds)."""

    M: int
    block_size: int
    num_blocks: int
    steps: int = 0
    busy_s: float = 0.0  # Σ step durations (each from its start until its tokens are handed out)
    step_ends: list[float] = field(default_factory=list)
    step_durations: list[float] = field(default_factory=list)
    completion_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    # (s, o, arrival) of every request accepted, o as the emulated model produces it: what a client's
    # own result file should record
    served: list[tuple[int, int, float]] = field(default_factory=list)

    def bbar(self, start: float = 0.0, end: float = float("inf")) -> float:
        """Mean step duration of the steps that ended in ``[start, end]``."""
        d = [x for t, x in zip(self.step_ends, self.step_durations) if start <= t <= end]
        if not d:
            raise InvalidArgument("no step ended in the interval")
        return sum(d) / len(d)

    def completion_rate(self, start: float, end: float) -> float:
        """Completions per second in ``[start, end]``."""
        if not end > start:
            raise InvalidArgument("the interval is empty")
        return sum(1 for t in self.completion_times if start <= t <= end) / (end - start)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one engine step did, in the terms the metrics need."""

    completed: tuple[int, ...]
    preempted: int
    tokens: int
    composition: dict[str, int]  # kvstab.empirical.replay.composition of the step
    running: int
    waiting: int
    kv_tokens: int  # KV held after the step (blocks × B)
    prefix_queries: int = 0  # prompt tokens of the requests first admitted in the step (vLLM's "queries")
    prefix_hits: int = 0  # of them, tokens found in the prefix cache


class Backend(Protocol):
    """The scheduler behind the emulator: kvstab's ``vllm-v1`` model or vLLM's own."""

    name: str

    def arrive(self, s: int, o: int, ids: list[int] | None = None) -> int: ...
    def step(self) -> StepOutcome: ...
    def emitted(self, rid: int) -> int: ...
    def abort(self, rid: int) -> None: ...
    @property
    def idle(self) -> bool: ...
    @property
    def waiting(self) -> int: ...


def prompt_content(ids: list[int], block: int) -> Prompt:
    """A prompt of token ``ids`` as content (:mod:`kvstab.prefix`) whose block-hash chain shares
    block ``k`` with another prompt's exactly when their ids agree up to the end of block ``k``:
    one segment per block of ``block`` ids (the last may be partial), its content id a hash of
    the ids up to its end (chained through the previous segment's), as vLLM chains its block
    hashes.  Python's hash of a tuple of ints is not salted, and the emulator's pool lives in
    one process, so equal ids give equal content."""
    segments: list[tuple[int, int]] = []
    parent = 0
    for a in range(0, len(ids), block):
        piece = tuple(ids[a:a + block])
        parent = hash((parent, piece))
        segments.append((parent, len(piece)))
    return Prompt(tuple(segments))


class ModelBackend:
    """kvstab's ``vllm-v1`` rule in :class:`~kvstab.lifecycles.vllm.VllmEngine` (vLLM's request lifecycle)."""

    name = "vllm-v1 model"

    def __init__(self, config: ReplayConfig) -> None:
        self.block = config.block_size
        self.engine = VllmEngine(SCHEDULER, config.params())
        self.caching = config.enable_prefix_caching
        self._looked_up: set[int] = set()  # requests whose first admission was counted (vLLM counts only that one)

    def arrive(self, s: int, o: int, ids: list[int] | None = None) -> int:
        # without ids (a text prompt) the request's content is its own: it shares nothing
        prompt = prompt_content(ids, self.block) if self.caching and ids is not None else None
        return self.engine.arrive(s, o, prompt)

    @property
    def idle(self) -> bool:
        return self.engine.idle

    @property
    def waiting(self) -> int:
        return len(self.engine.waiting)

    def step(self) -> StepOutcome:
        eng = self.engine
        before = {r.rid: (r.progress, r.s) for r in eng.active}
        rec = eng.step()
        worked = list(eng.active) + [eng.requests[i] for i in rec.completed]
        work: list[tuple[int, int, bool]] = []
        for r in worked:
            p0, s0 = before.get(r.rid, (0, r.s))
            if r.progress > p0:
                work.append((p0, r.progress - p0, p0 < s0))
        # after the step's releases, as vLLM reports its pool between steps
        # with caching, a block several requests share counts once (the pool's referenced blocks)
        held = (eng.cache.used_tokens if eng.cache is not None
                else sum(int(tokens_held(r.progress, self.block)) for r in eng.active))
        queries = hits = 0
        if self.caching:
            # vLLM records a request's lookup at its first admission only (vllm/v1/metrics/stats.py:146-150)
            for r in worked:
                if r.rid not in before and r.rid not in self._looked_up:
                    self._looked_up.add(r.rid)
                    queries += r.s
                    hits += r.cached
        return StepOutcome(rec.completed, len(rec.preempted), rec.tokens, composition(work), len(eng.active),
                           len(eng.waiting), held, queries, hits)

    def emitted(self, rid: int) -> int:
        """Output tokens produced so far (see ``kvstab.lifecycles.vllm``)."""
        r = self.engine.requests[rid]
        folded = r.s - self.engine.vllm_s[rid]  # outputs recomputed as prompt after a preemption
        return folded + (r.progress - r.s + 1 if r.progress >= r.s else 0)

    def abort(self, rid: int) -> None:
        r = self.engine.requests[rid]
        # the engine charges memory from its running list each step, so leaving the lists is freeing
        if r in self.engine.waiting:
            self.engine.waiting.remove(r)
        elif r in self.engine.active:
            self.engine.active.remove(r)
            if self.engine.cache is not None:
                self.engine.cache.free(rid)  # the pool's blocks are not freed by leaving the list


class Emulator:
    """Steps a ``vllm-v1`` engine in real time and exposes vLLM's metrics (see the module docstring)."""

    def __init__(
        self, config: EmulatorConfig, clock: Callable[[], float] = time.perf_counter, backend: Backend | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        if backend is None and config.scheduler == "vllm":
            from kvstab.live.vllm_backend import VllmBackend

            backend = VllmBackend(config.vllm, config.model_len)
        self.backend: Backend = backend if backend is not None else ModelBackend(config.vllm)
        self.live: dict[int, LiveRequest] = {}
        self.truth = GroundTruth(M=config.vllm.M, block_size=config.vllm.block_size, num_blocks=config.vllm.num_blocks)
        self._wake: asyncio.Event | None = None
        self.registry = CollectorRegistry()
        self._metrics()

    # --- metrics under vLLM's names
    def _metrics(self) -> None:
        r, labels, model = self.registry, ["model_name"], self.config.model
        self.m_running = Gauge("vllm:num_requests_running", "Requests in the running batch.", labels, registry=r).labels(model)
        self.m_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels, registry=r).labels(model)
        self.m_kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", labels, registry=r).labels(model)
        self.m_preempt = Counter("vllm:num_preemptions", "Cumulative preemptions.", labels, registry=r).labels(model)
        self.m_prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r).labels(model)
        self.m_gen = Counter("vllm:generation_tokens", "Generation tokens processed.", labels, registry=r).labels(model)
        self.m_success = Counter(
            "vllm:request_success", "Successfully finished requests.", [*labels, "finished_reason"], registry=r
        )
        self.m_iter = Histogram(
            "vllm:iteration_tokens_total", "Tokens per engine step.", labels, buckets=_ITER_BUCKETS, registry=r
        ).labels(model)
        self.m_itl = Histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency.", labels, buckets=_ITL_BUCKETS, registry=r
        ).labels(model)
        self.m_tpot = Histogram(
            "vllm:time_per_output_token_seconds", "Time per output token (deprecated name).", labels,
            buckets=_ITL_BUCKETS, registry=r,
        ).labels(model)
        self.m_step = Histogram(
            "kvstab:step_duration_seconds", "Wall duration of each engine step (emulator only).", labels,
            buckets=_ITL_BUCKETS, registry=r,
        ).labels(model)
        # vLLM's names (vllm/v1/metrics/loggers.py:661-679); exported with caching off too, as vLLM does
        self.m_prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", labels,
            registry=r,
        ).labels(model)
        self.m_prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels, registry=r
        ).labels(model)
        info = Gauge(
            "vllm:cache_config_info", "Information of the KV cache configuration.",
            ["block_size", "num_gpu_blocks", "cache_dtype", "enable_prefix_caching"], registry=r,
        )
        cfg = self.config.vllm
        info.labels(str(cfg.block_size), str(cfg.num_blocks), "auto", str(cfg.enable_prefix_caching)).set(1)

    # --- requests
    def submit(self, s: int, o: int, ids: list[int] | None = None) -> LiveRequest:
        """A request with prompt ``s`` and ``max_tokens = o`` arrives now (``InvalidArgument`` if it never fits);
        ``ids``: its prompt's token ids, when it was sent as ids (what the prefix cache matches)."""
        if s + o > self.config.model_len:
            raise InvalidArgument(
                f"this model's maximum context length is {self.config.model_len} tokens; the request has "
                f"{s} prompt tokens and max_tokens={o}"
            )
        rid = self.backend.arrive(s, o, ids)
        req = LiveRequest(rid=rid, s=s, o=o, arrived=self.clock())
        self.live[rid] = req
        self.truth.served.append((s, o, req.arrived))
        self.m_waiting.set(self.backend.waiting)
        if self._wake is not None:
            self._wake.set()
        return req

    def abort(self, rid: int) -> None:
        """Drop a request whose client went away (vLLM aborts it and frees its blocks)."""
        if self.live.pop(rid, None) is not None:
            self.backend.abort(rid)

    def step_seconds(self, work: dict[str, int]) -> float:
        """Emulated duration of a step of this composition (before ``speedup``)."""
        m = self.config.batch_time
        if m is None:
            return self.config.server.bbar
        # BatchTimeModel's formula, on one step's composition
        return m.a + m.b * work["prefill_tokens"] + m.c * work["decode_tokens"] + m.d * work["kv_attended"]

    # --- the engine loop
    async def run(self) -> None:
        """Step while there is work; sleep until a request arrives otherwise.  Runs until cancelled."""
        self._wake = asyncio.Event()
        while True:
            if self.backend.idle:
                self._wake.clear()
                await self._wake.wait()
                continue
            t0 = self.clock()
            out = self.backend.step()
            wait = self.step_seconds(out.composition) / self.config.speedup - (self.clock() - t0)
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                await asyncio.sleep(0)  # let the server answer even when steps overrun
            end = self.clock()
            self._deliver(out.completed, end)
            # the step lasts until its tokens are handed out, as a server's iteration
            # includes its output processing: the next step cannot start before, so a
            # client measures this period (busy time / steps), and so does the truth
            self._record(out, t0, self.clock())

    def _record(self, out: StepOutcome, t0: float, end: float) -> None:
        t = self.truth
        t.steps += 1
        t.busy_s += end - t0
        t.step_ends.append(end)
        t.step_durations.append(end - t0)
        t.preemptions += out.preempted
        self.m_step.observe(end - t0)
        self.m_iter.observe(out.tokens)
        self.m_prompt.inc(out.composition["prefill_tokens"])
        self.m_gen.inc(out.composition["decode_tokens"])
        if out.preempted:
            self.m_preempt.inc(out.preempted)
        if out.prefix_queries:
            self.m_prefix_queries.inc(out.prefix_queries)
            self.m_prefix_hits.inc(out.prefix_hits)
        self.m_running.set(out.running)
        self.m_waiting.set(out.waiting)
        self.m_kv.set(out.kv_tokens / self.config.vllm.M)

    def _deliver(self, completed: tuple[int, ...], now: float) -> None:
        done = set(completed)
        for rid, req in list(self.live.items()):
            n = self.backend.emitted(rid) if rid not in done else req.o
            if n > req.sent:
                if req.sent > 0:
                    self.m_itl.observe(now - req.last_token_at)
                    self.m_tpot.observe(now - req.last_token_at)
                req.last_token_at = now
                req.tokens.put_nowait(n - req.sent)
                req.sent = n
            if rid in done:
                self.truth.completion_times.append(now)
                self.m_success.labels(self.config.model, "length").inc()
                req.tokens.put_nowait(None)
                del self.live[rid]
