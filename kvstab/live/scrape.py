"""Reading a server's Prometheus ``/metrics`` (vLLM's names) and what kvstab derives from it.

A :class:`Snapshot` is one scrape: every sample summed over its label sets
(one value per sample name, e.g. ``vllm:num_preemptions_total``), and the
labels of ``vllm:cache_config_info``.  :func:`server_estimates` turns the
snapshots of a window into the quantities ``μ`` needs:

* ``M = (num_gpu_blocks − 1) · block_size`` — vLLM's pool holds one reserved
  null block (as :class:`kvstab.steplog.ReplayConfig` models it);
* ``b̄`` = busy time / engine steps, the steps counted by the
  ``vllm:iteration_tokens_total`` histogram (one observation per step), the
  busy time given by the caller (the harness: the time some request of its
  own was in flight — a server steps exactly while it holds a request; vLLM
  exports no step durations).  Without it, elapsed time / steps, which counts
  idle time as stepping and is too large below saturation.  The mean
  inter-token latency (``vllm:inter_token_latency_seconds``, or the older
  ``vllm:time_per_output_token_seconds``) is reported beside it (it also
  counts the steps a preempted request waits);
* the queue-length slope: least squares of ``waiting + running`` on time, with
  a 95 % Student-t interval (samples are autocorrelated: read the interval as
  indicative);
* mean KV use (``vllm:kv_cache_usage_perc``, a fraction) and the preemptions
  in the window (``vllm:num_preemptions_total``);
* the prefix cache's hit rate, :func:`prefix_cache_hits`: cached prompt tokens
  over prompt tokens looked up (``vllm:prefix_cache_hits_total`` over
  ``vllm:prefix_cache_queries_total``, both counted when a request is first
  admitted), and whether the server runs with prefix caching
  (``enable_prefix_caching`` of ``vllm:cache_config_info``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from scipy import stats

from kvstab.errors import InvalidArgument
from kvstab.jsonform import JsonRecord

__all__ = [
    "Snapshot",
    "parse_metrics",
    "ServerEstimates",
    "server_estimates",
    "MetricsUnavailable",
    "PrefixCacheHits",
    "prefix_cache_hits",
]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
STEPS = "vllm:iteration_tokens_total_count"
STEP_TOKENS = "vllm:iteration_tokens_total_sum"
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
CACHE_INFO = "vllm:cache_config_info"
# vLLM 0.33 counts, at a request's first admission, its prompt tokens looked up and those found
# cached (vllm/v1/core/kv_cache_manager.py:255-264, called from vllm/v1/core/sched/scheduler.py:1510);
# the counters are vllm/v1/metrics/loggers.py:661-679 ("vllm:prefix_cache_queries", ":prefix_cache_hits"),
# which Prometheus exposes with the suffix _total
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"


class MetricsUnavailable(InvalidArgument):
    """The server has no usable ``/metrics`` (missing, not Prometheus text, or without vLLM's names)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scrape at time ``t`` (seconds, the harness's clock)."""

    t: float
    values: dict[str, float]
    cache_info: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        """The summed value of sample ``name``, or ``None`` if the server does not export it."""
        return self.values.get(name)


def parse_metrics(text: str, t: float) -> Snapshot:
    """Parse Prometheus text; :class:`MetricsUnavailable` if it is not that or has none of vLLM's names."""
    values: dict[str, float] = {}
    info: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == CACHE_INFO:
                    info = dict(sample.labels)
                v = float(sample.value)
                if math.isfinite(v):
                    values[sample.name] = values.get(sample.name, 0.0) + v
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsUnavailable(f"/metrics is not Prometheus text ({exc})") from None
    if not any(k.startswith("vllm:") for k in values):
        raise MetricsUnavailable("/metrics has none of vLLM's metrics (vllm:num_requests_running, …)")
    return Snapshot(t, values, info)


@dataclass(frozen=True, slots=True)
class ServerEstimates(JsonRecord):
    """What the scrapes of one window say about the server (``None``: not exported)."""

    M: int | None
    block_size: int | None
    num_gpu_blocks: int | None
    bbar_steps_s: float | None  # elapsed time / steps: counts idle time, biased up below saturation
    bbar_itl_s: float | None
    steps: int | None
    mean_step_tokens: float | None
    queue_slope_per_s: float | None
    queue_slope_ci95: tuple[float, float] | None
    kv_utilisation: float | None
    preemptions: int | None
    scrapes: int
    busy_s: float | None = None  # of the window's time, how long the server held a request
    bbar_busy_s: float | None = None  # busy time / steps
    window_s: float = 0.0  # the last scrape's time − the first's

    @property
    def busy_fraction(self) -> float | None:
        """The share of the window the server was busy (``None`` if not known)."""
        return None if self.busy_s is None or self.window_s <= 0 else min(1.0, self.busy_s / self.window_s)

    @property
    def bbar_s(self) -> float | None:
        """The b̄ kvstab uses: busy time per step, else elapsed time per step, else the inter-token latency."""
        for x in (self.bbar_busy_s, self.bbar_steps_s, self.bbar_itl_s):
            if x is not None:
                return x
        return None

    def to_json(self) -> dict[str, Any]:
        """The estimates as ``kvstab bench``'s JSON has them (its ``server`` object)."""
        return {
            "M": self.M, "block_size": self.block_size, "num_gpu_blocks": self.num_gpu_blocks,
            "bbar_busy_s": self.bbar_busy_s, "busy_fraction": self.busy_fraction, "bbar_steps_s": self.bbar_steps_s,
            "bbar_itl_s": self.bbar_itl_s, "steps": self.steps, "mean_step_tokens": self.mean_step_tokens,
            "queue_slope_per_s": self.queue_slope_per_s,
            "queue_slope_per_s_ci95": list(self.queue_slope_ci95) if self.queue_slope_ci95 else None,
            "kv_utilisation": self.kv_utilisation, "preemptions": self.preemptions, "scrapes": self.scrapes,
        }


def _delta(a: Snapshot, b: Snapshot, name: str) -> float | None:
    x, y = a.get(name), b.get(name)
    return None if x is None or y is None else y - x


def _slope(t: np.ndarray, y: np.ndarray) -> tuple[float, tuple[float, float]] | None:
    if t.size < 4 or np.ptp(t) <= 0:
        return None
    res = stats.linregress(t, y)
    half = float(stats.t.ppf(0.975, t.size - 2) * res.stderr)
    return float(res.slope), (float(res.slope) - half, float(res.slope) + half)


def server_estimates(snaps: list[Snapshot], busy_s: float | None = None) -> ServerEstimates:
    """Estimates from the scrapes of a window (first and last bound it); ``busy_s``:
    how long within that window the server held a request, for ``b̄`` over busy steps."""
    if len(snaps) < 2:
        raise InvalidArgument(f"need at least 2 scrapes of /metrics in the window, got {len(snaps)}")
    a, b = snaps[0], snaps[-1]
    info = b.cache_info
    block = int(info["block_size"]) if info.get("block_size", "").isdigit() else None
    blocks = int(info["num_gpu_blocks"]) if info.get("num_gpu_blocks", "").isdigit() else None
    M = (blocks - 1) * block if block is not None and blocks is not None and blocks > 1 else None
    steps = _delta(a, b, STEPS)
    bbar_steps = (b.t - a.t) / steps if steps else None
    tokens = _delta(a, b, STEP_TOKENS)
    bbar_itl = None
    for name in ITL:
        d_sum, d_count = _delta(a, b, name + "_sum"), _delta(a, b, name + "_count")
        if d_sum is not None and d_count:
            bbar_itl = d_sum / d_count
            break
    pairs = [(s.t, s.get(WAITING), s.get(RUNNING)) for s in snaps]
    have = [(t, w + r) for t, w, r in pairs if w is not None and r is not None]
    slope = _slope(np.array([p[0] for p in have]), np.array([p[1] for p in have])) if have else None
    kv = [s.get(KV_USAGE) for s in snaps]
    kv_known = [x for x in kv if x is not None]
    pre = _delta(a, b, PREEMPTIONS)
    return ServerEstimates(
        M=M,
        block_size=block,
        num_gpu_blocks=blocks,
        bbar_steps_s=bbar_steps,
        bbar_itl_s=bbar_itl,
        steps=int(steps) if steps is not None else None,
        mean_step_tokens=tokens / steps if tokens is not None and steps else None,
        queue_slope_per_s=slope[0] if slope else None,
        queue_slope_ci95=slope[1] if slope else None,
        kv_utilisation=float(np.mean(kv_known)) if kv_known else None,
        preemptions=int(pre) if pre is not None else None,
        scrapes=len(snaps),
        busy_s=busy_s,
        bbar_busy_s=busy_s / steps if busy_s is not None and steps else None,
        window_s=b.t - a.t,
    )


@dataclass(frozen=True, slots=True)
class PrefixCacheHits(JsonRecord):
    """The prefix cache over a run, from ``/metrics``: prompt tokens looked up, found cached, their ratio."""

    server_caching: bool | None = field(
        metadata={"help": "enable_prefix_caching of vllm:cache_config_info (None: not exported)"}
    )
    queries: int | None = field(metadata={"help": "prompt tokens looked up (vllm:prefix_cache_queries_total)"})
    hits: int | None = field(metadata={"help": "of them, tokens found cached (vllm:prefix_cache_hits_total)"})
    hit_rate: float | None = field(metadata={"help": "hits / queries (None: no counters, or no lookup)"})
    missing: str | None = field(metadata={"help": "why there is no hit rate (None: there is)"})


def prefix_cache_hits(first: Snapshot, last: Snapshot) -> PrefixCacheHits:
    """The prefix cache's hits between two scrapes (a run's first and last)."""
    flag = last.cache_info.get("enable_prefix_caching")
    caching = None if flag is None else flag.strip().lower() == "true"
    queries, hits = _delta(first, last, PREFIX_QUERIES), _delta(first, last, PREFIX_HITS)
    if queries is None or hits is None:
        return PrefixCacheHits(
            caching, None, None, None,
            f"the server's /metrics has no prefix-cache counters ({PREFIX_QUERIES}, {PREFIX_HITS}): no hit rate",
        )
    if queries <= 0:
        why = "the server looked up no prompt tokens in its prefix cache during the run" + (
            " (it runs with prefix caching off)" if caching is False else ""
        )
        return PrefixCacheHits(caching, int(queries), int(hits), None, why)
    return PrefixCacheHits(caching, int(queries), int(hits), hits / queries, None)
