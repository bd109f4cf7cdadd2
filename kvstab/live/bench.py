"""``kvstab bench``: load an OpenAI-compatible server and compare its saturated rate with ``μ``.

One run per offered rate: requests with exact lengths (prompt as token ids on
``/v1/completions``, or text calibrated with ``/tokenize`` on
``/v1/chat/completions``; ``max_tokens = min_tokens = o`` and ``ignore_eos``)
arrive by a Poisson process or at a trace's own times, until ``max_requests``
have been sent or ``duration`` seconds have passed; the run then stops (an
overloaded server never drains, and is not waited for).  ``/metrics`` is
scraped every ``scrape_interval`` seconds.

The steady-state window is the run after its first ``warmup`` fraction;
throughput there is completions per second (batch means over equal bins give
its interval), and ``μ = M/(b̄·E[g])`` comes from :func:`kvstab.theory.stability_report`
with ``M`` and ``b̄`` measured by the scrapes (:mod:`kvstab.live.scrape`) and
``E[g]`` from the workload that was sent.  ``b̄`` is the time the server was
busy (some request of the run in flight) over the steps it took; a run whose
queue did not grow, or whose server sat idle, is flagged below saturation
(``saturated``, ``saturation_warning``): its throughput is the offered rate,
and ``b̄`` comes from smaller batches than a saturated server runs.

With prefix caching on (``--prefix-caching on``, the default, as vLLM's
server runs), a workload with prefix structure (``prefix=…`` laws, Mooncake
``hash_ids``) sends each request's real prompt content as token ids
(:meth:`kvstab.prefix.PromptSet.token_ids`, mapped into ``[1000, 20000)``, ids
every tokenizer has), so requests that share a prefix in the workload share
it on the wire and a server with prefix caching hits it; ``/metrics`` then
gives the hit rate (:func:`kvstab.live.scrape.prefix_cache_hits`).  ``μ``
stays the no-sharing formula.  With caching off, or a workload without prefix
structure, every prompt is random ids of its own.

Errors that make the measurement meaningless — the URL does not answer, the
server is not OpenAI-compatible, it returns fewer tokens than ``min_tokens``
— end the run with one line (:class:`BenchError`), and what was measured up
to then is kept in the result.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from kvstab.errors import InvalidArgument, KvstabError
from kvstab.jsonform import JsonRecord
from kvstab.live.scrape import (
    MetricsUnavailable,
    PrefixCacheHits,
    ServerEstimates,
    Snapshot,
    parse_metrics,
    prefix_cache_hits,
    server_estimates,
)
from kvstab.metrics import batch_means
from kvstab.model import ModelParams
from kvstab.prefix import PromptSet
from kvstab.prefix_laws import Conversation
from kvstab.traces import Trace
from kvstab.workload import Workload

__all__ = ["BenchConfig", "BenchError", "RequestRecord", "RunResult", "run_bench", "Schedule", "poisson_schedule",
           "trace_schedule", "server_max_model_len", "BenchSummary", "ServerFigures", "prompt_ids",
           "PROMPT_ID_LOW", "PROMPT_ID_SPAN"]


@dataclass(frozen=True, slots=True)
class ServerFigures(JsonRecord):
    """What the server's ``/metrics`` said over a run's window (its JSON: ``metrics_error``, then the estimates)."""

    metrics_error: str | None = field(metadata={"help": "why /metrics gave nothing usable (None: it did)"})
    estimates: ServerEstimates | None = field(
        default=None, metadata={"json": False, "help": "the window's estimates (None: fewer than two scrapes)"}
    )

    def to_json(self) -> dict[str, Any]:
        """``metrics_error``, then the estimates' own fields where there are some."""
        return {"metrics_error": self.metrics_error, **({} if self.estimates is None else self.estimates.to_json())}


@dataclass(frozen=True, slots=True)
class BenchSummary(JsonRecord):
    """One run's figures (an entry of ``kvstab bench``'s ``runs``): what was sent and came back, the
    throughput, the server's figures and ``μ`` from them."""

    offered_rate_per_s: float | None = field(metadata={"help": "λ offered (None: a trace's own times)"})
    elapsed_s: float = field(metadata={"help": "the run's length, seconds"})
    stopped_by: str = field(metadata={"help": "duration, requests, error or interrupted"})
    error: str | None = field(metadata={"help": "what stopped the run early"})
    sent: int = field(metadata={"help": "requests sent"})
    dropped_oversize: int = field(metadata={"help": "requests left out: s + o above max_model_len"})
    completed: int = field(metadata={"help": "requests that finished without error"})
    failed: int = field(metadata={"help": "requests that failed"})
    unfinished: int = field(metadata={"help": "requests still in flight at the end"})
    warmup_fraction: float = field(metadata={"help": "warm-up fraction excluded"})
    window_s: tuple[float, float] = field(metadata={"help": "the steady window, seconds after the start"})
    throughput_per_s: float | None = field(metadata={"json": "optional", "help": "completions per second (batch means)"})
    throughput_per_s_ci95: tuple[float, float] | None = field(metadata={"json": "optional", "help": "its 95 % interval"})
    mean_ttft_s: float | None = field(metadata={"help": "mean time to first token"})
    server: ServerFigures = field(metadata={"help": "what /metrics said"})
    M: int | None = field(metadata={"help": "KV capacity, tokens (given or scraped)"})
    bbar_s: float | None = field(metadata={"help": "b̄, seconds (given or scraped)"})
    saturated: bool | None = field(metadata={"help": "the queue grew and the server was never idle"})
    saturation_warning: str | None = field(metadata={"help": "why the numbers that assume saturation are biased"})
    E_g_tokens_slots: float | None = field(metadata={"json": "optional", "help": "E[g] (with M and b̄)"})
    mu_per_s: float | None = field(metadata={"help": "μ = M/(b̄·E[g]) (None: M or b̄ unknown)"})
    measured_over_mu: float | None = field(metadata={"help": "throughput / μ"})
    mu_missing: str | None = field(default=None, metadata={"json": "optional", "help": "why μ is unknown"})
    prefix_caching: bool = field(
        default=False, metadata={"help": "--prefix-caching: the workload's shared prefixes were sent (when it has some)"}
    )
    prompts_shared: bool = field(
        default=False, metadata={"help": "prompts carried the workload's prefix structure (else random ids)"}
    )
    prefix_cache: PrefixCacheHits | None = field(
        default=None, metadata={"help": "the server's prefix-cache hits over the run (None: no scrapes)"}
    )


#: the error of a request still in flight when the run ended (not a failure: the run stops an overloaded server)
UNFINISHED = "unfinished at the end of the run"


class BenchError(KvstabError):
    """The server cannot be measured (unreachable, not OpenAI-compatible, ignores ``min_tokens``)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """Requests to send: offsets in seconds from the start, and lengths (vLLM's terms: ``o = max_tokens``)."""

    t: np.ndarray
    s: np.ndarray
    o: np.ndarray
    rate: float | None  # the offered rate, None for a trace's own times
    dropped: int = 0  # requests left out because s + o exceeds the server's max_model_len
    prompts: PromptSet | None = None  # the requests' prompt content (None: random ids of their own)

    def fitting(self, max_total: int) -> Schedule:
        """The requests with ``s + o ≤ max_total``, at their own times (the rest counted in ``dropped``)."""
        keep = self.s + self.o <= max_total
        prompts = None if self.prompts is None else self.prompts.take(keep)
        return Schedule(self.t[keep], self.s[keep], self.o[keep], self.rate, self.dropped + int((~keep).sum()), prompts)


def poisson_schedule(workload: Workload, rate: float, n: int, seed: int, *, prompts: bool = False) -> Schedule:
    """``n`` requests of ``workload`` with exponential gaps of mean ``1/rate``; with ``prompts``
    and a workload with a prefix law, their prompt content too (drawn after the lengths, so the
    times and lengths are those without it; a ``chat`` law: :func:`conversation_schedule`)."""
    if prompts and isinstance(workload.prefix, Conversation):
        return conversation_schedule(workload.prefix, rate, n, seed)
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    s, o = workload.sample(rng, n)
    s = np.asarray(s)
    content = workload.prefix.prompts(rng, s.astype(np.int64)) if prompts and workload.prefix is not None else None
    return Schedule(t, s, np.asarray(o), rate, prompts=content)


def conversation_schedule(law: Conversation, rate: float, n: int, seed: int) -> Schedule:
    """``n`` requests of multi-turn conversations, ``rate`` requests per second on average:
    conversations start as a Poisson process of rate ``rate / E[K]`` and each turn arrives an
    exponential think time after the previous turn's arrival (open loop, as
    :func:`kvstab.arrivals.conversation_arrivals` in continuous time); the first ``n`` by time."""
    rng = np.random.default_rng(seed)
    conversations = max(1, math.ceil(n / max(law.mean_turns, 1.0)))
    start = np.cumsum(rng.exponential(law.mean_turns / rate, size=conversations))
    d = law.draw(rng, conversations)
    when = law.turn_times(rng, d, start)
    order = np.argsort(when, kind="stable")[:n]
    return Schedule(when[order], d.s[order], d.o[order], rate, prompts=d.prompts.take(order))


def trace_schedule(trace: Trace, time_scale: float, n: int, *, prompts: bool = False) -> Schedule:
    """The first ``n`` rows of ``trace`` at their own times (× ``time_scale``); with ``prompts``,
    their content (a Mooncake trace's ``hash_ids``) when the trace has it."""
    if trace.arrival is None:
        raise InvalidArgument(f"trace {trace.path} records no arrival times; give --rate for Poisson arrivals")
    k = min(n, len(trace))
    content = trace.prompts.take(np.arange(k)) if prompts and trace.prompts is not None else None
    return Schedule(trace.arrival[:k] * time_scale, trace.s[:k], trace.o[:k], None, prompts=content)


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """How to load the server."""

    url: str
    api: str = "completions"  # or "chat"
    model: str | None = None  # None: the first of /v1/models
    stream: bool = True
    duration: float = 60.0
    warmup: float = 0.25
    scrape_interval: float = 0.5
    timeout: float = 10.0  # connecting and each response's first byte
    chunk: int = 512  # ŝ for μ (vLLM: max_num_batched_tokens), not in /metrics
    seed: int = 0
    prefix_caching: bool = False  # --prefix-caching: send the schedule's prompts (when it has some)


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it (seconds from the run's start)."""

    s: int
    o: int
    sent: float
    index: int = -1  # the request's row in its schedule (its prompt in Schedule.prompts)
    first_token: float | None = None
    done: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass(slots=True)
class RunResult:
    """One run (one offered rate): what was sent, what came back, the scrapes and the verdict numbers."""

    rate: float | None
    origin: float = 0.0  # time.perf_counter() at the run's start: record times are seconds after it
    records: list[RequestRecord] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    elapsed: float = 0.0
    stopped_by: str = "duration"
    error: str | None = None
    metrics_error: str | None = None
    dropped: int = 0  # requests of the schedule left out: s + o above the server's max_model_len
    prompts_shared: bool = False  # the prompts carried the schedule's prefix structure

    def busy_time(self, start: float, end: float) -> float:
        """How long within ``[start, end]`` some request of this run was in flight (sent, not yet done).

        A server steps exactly while it holds a request, so this is its busy
        time, up to the network's latency at the ends of each busy period (the
        harness is its only client)."""
        spans = []
        for r in self.records:
            if r.error is not None and r.error != UNFINISHED:
                continue  # refused or broken: it held the server for no step
            hi = min(end, r.done if r.done is not None else self.elapsed)
            lo = max(start, r.sent)
            if hi > lo:
                spans.append((lo, hi))
        return _union_length(spans)

    @staticmethod
    def _saturation(est: Any, *, measured_bbar: bool) -> tuple[bool | None, str | None]:
        """Whether the run was saturated (the queue grew and the server was never idle), and if not, why the
        numbers that assume it are biased; ``None`` when the scrapes cannot tell."""
        if est is None:
            return None, None
        ci, idle = est.queue_slope_ci95, (None if est.busy_fraction is None else 1.0 - est.busy_fraction)
        if ci is None and idle is None:
            return None, None
        reasons = []
        if ci is not None and ci[0] <= 0:
            reasons.append(f"the queue did not grow (slope interval [{ci[0]:.3g}, {ci[1]:.3g}] req/s is not above 0)")
        if idle is not None and idle > IDLE_TOLERANCE:
            reasons.append(f"the server was idle {100 * idle:.0f} % of the window")
        if not reasons:
            return True, None
        bias = (
            "b̄ is measured over busy steps only, but a real server's steps are shorter on the smaller batches of "
            "an unsaturated run, so b̄ may be biased low and μ from it high" if measured_bbar
            else "μ was computed from the given --bbar"
        )
        return False, (
            f"below saturation: {' and '.join(reasons)}; the throughput is the offered rate, not the saturated "
            f"rate, and {bias}: offer more than μ to measure it"
        )

    def summary(self, workload: Workload, cfg: BenchConfig, *, M: int | None = None, bbar: float | None = None) -> BenchSummary:
        """The run's figures (kvstab's JSON); ``M``/``bbar`` override what the scrapes measured."""
        from kvstab.theory import stability_report

        bbar_given = bbar is not None
        start = self.elapsed * cfg.warmup
        done = np.array([r.done for r in self.records if r.done is not None and r.error is None], dtype=float)
        thr = thr_ci = None
        if self.elapsed - start > 0 and done.size:
            bins = 20
            edges = np.linspace(start, self.elapsed, bins + 1)
            counts, _ = np.histogram(done, bins=edges)
            width = (self.elapsed - start) / bins
            est = batch_means(counts / width, batches=bins)
            thr, thr_ci = est.value, (est.low, est.high)
        ttft = [r.first_token - r.sent for r in self.records if r.first_token is not None]
        metrics_error = self.metrics_error
        win = [s for s in self.snapshots if s.t >= start]
        est_s = None
        if len(win) >= 2:
            est_s = server_estimates(win, busy_s=self.busy_time(win[0].t, win[-1].t))
            M = M if M is not None else est_s.M
            bbar = bbar if bbar is not None else est_s.bbar_s
        elif metrics_error is None:
            metrics_error = f"only {len(win)} scrape(s) in the window; lengthen the run"
        saturated, warning = self._saturation(est_s, measured_bbar=not bbar_given)
        e_g = mu = missing = None
        if M is not None and bbar is not None and bbar > 0:
            block = (est_s.block_size if est_s is not None else None) or 1
            params = ModelParams(M=M, chunk=cfg.chunk, block=min(block, M), bbar=bbar)
            rep = stability_report(workload, params)
            e_g, mu = rep.E_g, rep.mu_per_s
        else:
            missing = "μ needs M and b̄: /metrics did not give them; pass --M and --bbar"
        caching = prefix_cache_hits(self.snapshots[0], self.snapshots[-1]) if len(self.snapshots) >= 2 else None
        return BenchSummary(
            offered_rate_per_s=self.rate,
            elapsed_s=self.elapsed,
            stopped_by=self.stopped_by,
            error=self.error,
            sent=len(self.records),
            dropped_oversize=self.dropped,
            completed=int(done.size),
            failed=sum(1 for r in self.records if r.error is not None and r.error != UNFINISHED),
            unfinished=sum(1 for r in self.records if r.error == UNFINISHED),
            warmup_fraction=cfg.warmup,
            window_s=(start, self.elapsed),
            throughput_per_s=thr,
            throughput_per_s_ci95=thr_ci,
            mean_ttft_s=float(np.mean(ttft)) if ttft else None,
            server=ServerFigures(metrics_error, est_s),
            M=M,
            bbar_s=bbar,
            saturated=saturated,
            saturation_warning=warning,
            E_g_tokens_slots=e_g,
            mu_per_s=mu,
            measured_over_mu=thr / mu if thr is not None and mu is not None else None,
            mu_missing=missing,
            prefix_caching=cfg.prefix_caching,
            prompts_shared=self.prompts_shared,
            prefix_cache=caching,
        )


#: the idle share of the window above which a run is called unsaturated (scrape timing and HTTP latency
#: make a saturated server look idle for well under 1 %)
IDLE_TOLERANCE = 0.02


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """The total length of the union of closed intervals."""
    total, end = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


#: prompt token ids lie in [PROMPT_ID_LOW, PROMPT_ID_LOW + PROMPT_ID_SPAN): ids every tokenizer has, above
#: the special tokens at the bottom of most vocabularies
PROMPT_ID_LOW = 1000
PROMPT_ID_SPAN = 19_000


def prompt_ids(rng: np.random.Generator, s: int, prompts: PromptSet | None = None, index: int = -1) -> list[int]:
    """The token ids bench sends as request ``index``'s prompt of ``s`` tokens: its content in
    ``prompts`` (equal content, equal ids: a shared prefix is shared on the wire), else random ids
    of its own (which share no block with any other prompt)."""
    if prompts is not None:
        ids = prompts.token_ids(index, PROMPT_ID_SPAN) + PROMPT_ID_LOW
        if ids.size != s:
            raise InvalidArgument(f"request {index}: its prompt content has {ids.size} tokens, but s={s}")
        return [int(x) for x in ids]
    return [int(x) for x in rng.integers(PROMPT_ID_LOW, PROMPT_ID_LOW + PROMPT_ID_SPAN, size=s)]


class _Client:
    def __init__(self, cfg: BenchConfig, session: aiohttp.ClientSession) -> None:
        self.cfg = cfg
        self.session = session
        self.base = cfg.url.rstrip("/")
        self.model = cfg.model or ""
        self.max_model_len: int | None = None
        self._word_tokens: float | None = None

    async def preflight(self) -> None:
        """The server answers, speaks OpenAI's API, and names a model."""
        try:
            async with self.session.get(f"{self.base}/v1/models") as r:
                text = await r.text()
                status = r.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise BenchError(f"cannot reach {self.base}: {exc.__class__.__name__}: {exc}") from None
        try:
            data = json.loads(text)
            ids = [m["id"] for m in data["data"]]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise BenchError(
                f"{self.base} is not an OpenAI-compatible server: GET /v1/models answered {status} "
                f"without a model list"
            ) from None
        if not ids:
            raise BenchError(f"{self.base}/v1/models lists no model")
        if not self.model:
            self.model = ids[0]
        # vLLM's model card carries max_model_len: the longest s + o it accepts (longer: HTTP 400)
        card = next((m for m in data["data"] if m["id"] == self.model), None)
        mml = card.get("max_model_len") if isinstance(card, dict) else None
        self.max_model_len = mml if isinstance(mml, int) and not isinstance(mml, bool) and mml > 0 else None

    async def scrape(self, t: float) -> Snapshot:
        try:
            async with self.session.get(f"{self.base}/metrics") as r:
                if r.status != 200:
                    raise MetricsUnavailable(f"GET /metrics answered {r.status}")
                text = await r.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise MetricsUnavailable(f"GET /metrics failed ({exc.__class__.__name__})") from None
        return parse_metrics(text, t)

    async def chat_text(self, s: int) -> str:
        """Text of exactly ``s`` tokens by the server's tokenizer (``/tokenize``)."""
        async def count(k: int) -> int:
            body = {"model": self.model, "messages": [{"role": "user", "content": " ".join(["hello"] * k)}]}
            async with self.session.post(f"{self.base}/tokenize", json=body) as r:
                if r.status != 200:
                    raise BenchError(f"{self.base}/tokenize answered {r.status}: cannot calibrate text prompts")
                return int((await r.json())["count"])

        k = s
        for _ in range(6):
            n = await count(k)
            if n == s:
                return " ".join(["hello"] * k)
            k = max(1, k - (n - s))
        raise BenchError(f"cannot build a chat prompt of exactly {s} tokens with the server's tokenizer")

    async def send(
        self, rec: RequestRecord, rng: np.random.Generator, t0: float, prompts: PromptSet | None = None
    ) -> None:
        cfg = self.cfg
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": rec.o, "min_tokens": rec.o, "ignore_eos": True,
            "stream": cfg.stream, "temperature": 0.0,
        }
        if cfg.api == "chat":
            body["messages"] = [{"role": "user", "content": await self.chat_text(rec.s)}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt_ids(rng, rec.s, prompts, rec.index)
            path = "/v1/completions"
        if cfg.stream:
            body["stream_options"] = {"include_usage": True}
        try:
            async with self.session.post(self.base + path, json=body) as r:
                if r.status != 200:
                    rec.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                    return
                if cfg.stream:
                    await self._read_stream(r, rec, t0)
                else:
                    data = await r.json()
                    rec.first_token = rec.done = time.perf_counter() - t0
                    rec.tokens = int(data["usage"]["completion_tokens"])
        except (TimeoutError, aiohttp.ClientError, OSError, KeyError, TypeError, ValueError) as exc:
            rec.error = f"{exc.__class__.__name__}: {exc}"[:200]

    async def _read_stream(self, r: aiohttp.ClientResponse, rec: RequestRecord, t0: float) -> None:
        usage_tokens: int | None = None
        chunks = 0
        async for raw in r.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            if event.get("usage"):
                usage_tokens = int(event["usage"]["completion_tokens"])
            if event.get("choices"):
                if rec.first_token is None:
                    rec.first_token = time.perf_counter() - t0
                chunks += 1
        rec.done = time.perf_counter() - t0
        # servers batch tokens into chunks; the usage chunk is the count, the chunk count a lower bound
        rec.tokens = usage_tokens if usage_tokens is not None else chunks


async def server_max_model_len(cfg: BenchConfig) -> int | None:
    """The server's ``max_model_len`` from ``GET /v1/models`` (``None`` if it does not say);
    :class:`BenchError` if the server cannot be reached or is not OpenAI-compatible."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.timeout, sock_read=cfg.timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = _Client(cfg, session)
        await client.preflight()
        return client.max_model_len


async def run_bench(
    cfg: BenchConfig,
    schedule: Schedule,
    *,
    progress: Callable[[int, int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> RunResult:
    """Send ``schedule`` to the server; returns what was measured even when the run ends early."""
    # the workload's prompts go out only with caching on and on the completions API (token ids)
    prompts = schedule.prompts if cfg.prefix_caching and cfg.api == "completions" else None
    res = RunResult(rate=schedule.rate, dropped=schedule.dropped, prompts_shared=prompts is not None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.timeout, sock_read=max(cfg.timeout, 60.0))
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C ends the run; what was measured is kept
        sigint = True
    except (NotImplementedError, RuntimeError, ValueError):
        sigint = False
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            client = _Client(cfg, session)
            await client.preflight()
            t0 = res.origin = time.perf_counter()
            rng = np.random.default_rng(cfg.seed)
            tasks: set[asyncio.Task[None]] = set()
            checked = asyncio.Event()

            async def scraper() -> None:
                while True:
                    try:
                        res.snapshots.append(await client.scrape(time.perf_counter() - t0))
                    except MetricsUnavailable as exc:
                        res.metrics_error = str(exc)
                        return
                    await asyncio.sleep(cfg.scrape_interval)

            async def one(rec: RequestRecord) -> None:
                await client.send(rec, rng, t0, prompts)
                if rec.error is None and rec.tokens != rec.o and res.error is None:
                    res.error = (
                        f"the server returned {rec.tokens} tokens for max_tokens = min_tokens = {rec.o} with "
                        "ignore_eos: it does not honour min_tokens/ignore_eos, so output lengths are not controlled"
                    )
                    stop.set()
                elif rec.error is None:
                    checked.set()
                if progress is not None:
                    progress(sum(1 for r in res.records if r.done is not None), len(schedule.t))

            scrape_task = asyncio.create_task(scraper())
            deadline = cfg.duration
            res.stopped_by = "requests"
            for i in range(len(schedule.t)):
                at = float(schedule.t[i])
                if at >= deadline:
                    res.stopped_by = "duration"
                    break
                delay = at - (time.perf_counter() - t0)
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                    except TimeoutError:
                        pass
                if stop.is_set():
                    break
                rec = RequestRecord(int(schedule.s[i]), int(schedule.o[i]), time.perf_counter() - t0, index=i)
                res.records.append(rec)
                task = asyncio.create_task(one(rec))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            # the run lasts `duration` (an overloaded server never drains), or until every request is back
            while tasks and not stop.is_set() and time.perf_counter() - t0 < deadline:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=min(0.05, max(1e-3, deadline - (time.perf_counter() - t0))))
                except TimeoutError:
                    pass
            if res.error is None and stop.is_set():
                res.stopped_by = "interrupted"
            elif res.error is not None:
                res.stopped_by = "error"
            elif not tasks and res.stopped_by == "requests":
                res.stopped_by = "all requests done"
            res.elapsed = time.perf_counter() - t0
            # a last scrape closes the window
            if res.metrics_error is None:
                try:
                    res.snapshots.append(await client.scrape(res.elapsed))
                except MetricsUnavailable as exc:
                    res.metrics_error = str(exc)
            scrape_task.cancel()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(scrape_task, *tasks, return_exceptions=True)
            for r in res.records:
                if r.done is None and r.error is None:
                    r.error = UNFINISHED
    except BenchError as exc:
        res.error = str(exc)
        res.stopped_by = "error"
    finally:
        if sigint:
            loop.remove_signal_handler(signal.SIGINT)
    if res.error is None and res.records and not any(r.error is None and r.done is not None for r in res.records):
        first = next((r.error for r in res.records if r.error), None)
        res.error = f"no request completed{f' (first error: {first})' if first else ''}"
    res.elapsed = res.elapsed or 0.0
    if math.isnan(res.elapsed):
        res.elapsed = 0.0
    return res
