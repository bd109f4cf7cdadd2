"""Benchmark results users already have, in; llm-d benchmark reports, out.

Read (the fields relied on; everything else is ignored):

* ``vllm bench serve --save-result`` JSON: ``request_throughput`` (req/s),
  ``completed``, ``duration`` (s), and, when present, ``input_lens`` /
  ``output_lens`` (per request, paired by index; an output of 0 marks a
  failed request, left out) — the workload whose ``E[g]`` gives ``μ``;
  ``output_throughput`` and ``total_input_tokens``/``total_output_tokens`` are
  carried along.
* AIPerf ``profile_export_aiperf.json``: metric entries holding a stats block
  (``{"unit": …, "avg": …}``) at the top level (or under ``records`` in older
  exports): ``request_throughput`` (requests/sec, required), ``request_count``,
  ``input_sequence_length`` / ``output_sequence_length`` (their ``avg``),
  ``benchmark_duration``.  The per-request lengths, the workload for
  ``E[g]``, come from AIPerf's record export beside it (``profile_export.jsonl``
  for ``profile_export_aiperf.json``: ``input_sequence_length`` and
  ``output_sequence_length`` of each profiled request that did not fail);
  without that file ``μ`` needs the workload (``--workload``).

* GuideLLM ``benchmarks.json`` (``guidellm run --output kind=json``): under
  ``benchmarks``, one benchmark per profile rate, each with ``duration`` (s),
  ``metrics.request_totals`` (``successful``, ``errored``) and
  ``requests.successful`` (per request: ``prompt_tokens``, ``output_tokens``,
  the workload).  The throughput is successful requests over ``duration``; of
  several benchmarks (a sweep) the one with the highest throughput is taken,
  its index in ``extra.benchmark``.

Written: the llm-d benchmark report, schema version 0.2
(``llm-d-benchmark/benchmark_report/schema_v0_2.py``): ``version``, ``run``
(``uid``, ``time.start/end/duration``), ``scenario.load`` (``metadata``,
``standardized``: ``tool``, ``tool_version``, ``source``, ``input_seq_len``,
``output_seq_len``, ``rate_qps``; ``native.args``) and
``results.request_performance.aggregate`` (``requests``, ``throughput``,
``latency``); kvstab's own figures (``μ``, ``M``, ``b̄``, queue slope) go under
``results.observability.kvstab``, the one place the schema leaves open.
JSON is valid YAML, so the report is written as JSON.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from kvstab.errors import InvalidArgument
from kvstab.workload import Workload

if TYPE_CHECKING:
    from kvstab.live.bench import BenchSummary

__all__ = ["ExternalResult", "load_result", "llmd_report"]


@dataclass(frozen=True, slots=True)
class ExternalResult:
    """Another tool's measured throughput, and the workload it ran when the file records it."""

    tool: str
    path: str
    throughput_per_s: float
    completed: int | None
    duration_s: float | None
    workload: Workload | None
    extra: dict[str, Any]


def _number(path: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{path}: {name} must be a finite non-negative number, got {value!r}")
    return float(value)


def _lengths(path: str, ins: object, outs: object) -> Workload | None:
    """The joint law of the requests that completed: ``input_lens[i]`` with ``output_lens[i]``.

    vLLM writes ``output_lens[i] = 0`` for a request that failed (it produced
    nothing), so those rows are left out; the two lists must pair up one to
    one, or the law would pair one request's prompt with another's output."""
    if not isinstance(ins, list) or not isinstance(outs, list) or not ins:
        return None
    if len(ins) != len(outs):
        raise InvalidArgument(
            f"{path}: input_lens has {len(ins)} entries but output_lens has {len(outs)}; they must pair up one per "
            "request (is the file cut or edited?)"
        )
    pairs: list[tuple[int, int]] = []
    for k, (i, o) in enumerate(zip(ins, outs)):
        ok_i = isinstance(i, int) and not isinstance(i, bool) and i >= 1
        ok_o = isinstance(o, int) and not isinstance(o, bool) and o >= 0
        if not (ok_i and ok_o):
            raise InvalidArgument(
                f"{path}: request {k} has input_lens {i!r}, output_lens {o!r}; valid: an integer >= 1 and an "
                "integer >= 0 (0: a failed request)"
            )
        if o > 0:
            pairs.append((i, o))
    return _joint_law(path, pairs)


def _joint_law(path: str, pairs: list[tuple[int, int]]) -> Workload | None:
    """The joint law of the requests a result file lists as ``(s, o)`` pairs; ``None`` when it lists none."""
    if not pairs:
        return None
    s, o = np.array(pairs, dtype=np.int64).T
    return Workload.joint(s, o, name=f"lengths of {path}")


def _vllm(path: str, data: dict[str, Any]) -> ExternalResult:
    thr = _number(path, "request_throughput", data["request_throughput"])
    workload = _lengths(path, data.get("input_lens"), data.get("output_lens"))
    completed = data.get("completed")
    duration = data.get("duration")
    return ExternalResult(
        tool="vllm bench serve",
        path=path,
        throughput_per_s=thr,
        completed=int(completed) if isinstance(completed, int) else None,
        duration_s=_number(path, "duration", duration) if duration is not None else None,
        workload=workload,
        extra={k: data[k] for k in ("output_throughput", "total_input_tokens", "total_output_tokens",
                                    "request_rate", "model_id", "failed") if k in data},
    )


def _aiperf(path: str, data: dict[str, Any]) -> ExternalResult:
    metrics = data["records"] if isinstance(data.get("records"), dict) else data

    def avg(name: str) -> float | None:
        entry = metrics.get(name)
        if isinstance(entry, dict) and "avg" in entry:
            return _number(path, f"{name}.avg", entry["avg"])
        return None

    thr = avg("request_throughput")
    if thr is None:
        raise InvalidArgument(f"{path}: no request_throughput.avg (is it profile_export_aiperf.json?)")
    count = avg("request_count")
    extra = {k: v for k in ("input_sequence_length", "output_sequence_length", "output_token_throughput")
             if (v := avg(k)) is not None}
    records = _aiperf_records_path(path)
    return ExternalResult(
        tool="aiperf", path=path, throughput_per_s=thr, completed=int(count) if count is not None else None,
        duration_s=avg("benchmark_duration"), workload=_aiperf_lengths(records) if records else None, extra=extra,
    )


def _aiperf_records_path(path: str) -> str | None:
    """AIPerf's per-request export beside its summary: ``X.jsonl`` for ``X_aiperf.json``, if it is there."""
    base = os.path.basename(path)
    if not base.endswith(_AIPERF_SUFFIX):
        return None
    records = os.path.join(os.path.dirname(path), base[: -len(_AIPERF_SUFFIX)] + ".jsonl")
    return records if os.path.isfile(records) else None


#: AIPerf names its summary PREFIX_aiperf.json and its per-request records PREFIX.jsonl (default PREFIX: profile_export)
_AIPERF_SUFFIX = "_aiperf.json"


def _aiperf_lengths(path: str) -> Workload | None:
    """The joint law of the profiled requests in AIPerf's per-request export (one JSON record a line:
    ``metadata.benchmark_phase``, ``metrics.input_sequence_length.value``, ``metrics.output_sequence_length.value``);
    warm-up, cancelled and failed requests are left out.  ``None`` when no record has both lengths."""
    pairs: list[tuple[int, int]] = []
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                meta, metrics = rec.get("metadata") or {}, rec.get("metrics") or {}
            except (json.JSONDecodeError, AttributeError):
                raise InvalidArgument(f"{path}: line {k} is not an AIPerf record (a JSON object)") from None
            if meta.get("benchmark_phase", "profiling") != "profiling" or meta.get("was_cancelled") or rec.get("error"):
                continue
            s, o = (metrics.get(name, {}).get("value") if isinstance(metrics.get(name), dict) else None
                    for name in ("input_sequence_length", "output_sequence_length"))
            if s is None or o is None:
                continue
            if not (isinstance(s, int) and isinstance(o, int) and s >= 1 and o >= 1):
                raise InvalidArgument(
                    f"{path}: line {k} has input_sequence_length {s!r}, output_sequence_length {o!r}; valid: integers >= 1"
                )
            pairs.append((s, o))
    return _joint_law(path, pairs)


def _guidellm(path: str, data: dict[str, Any]) -> ExternalResult:
    """GuideLLM's ``benchmarks.json``: one benchmark per profile rate; the one with the highest throughput is
    compared (a sweep's saturated end), its per-request lengths the workload."""
    runs = [b for b in data["benchmarks"] if isinstance(b, dict)]
    rated: list[tuple[float, int, int, float, dict[str, Any]]] = []
    for k, b in enumerate(runs):
        try:
            totals = b["metrics"]["request_totals"]
            done, failed = int(totals["successful"]), int(totals.get("errored", 0))
        except (KeyError, TypeError, ValueError):
            raise InvalidArgument(f"{path}: benchmark {k} has no metrics.request_totals.successful") from None
        duration = _number(path, f"benchmarks[{k}].duration", b.get("duration"))
        rated.append((done / duration if duration > 0 else 0.0, done, failed, duration, b))
    if not rated:
        raise InvalidArgument(f"{path}: a GuideLLM report without benchmarks")
    thr, done, failed, duration, best = max(rated, key=lambda r: r[0])
    reqs = best.get("requests")
    ok = reqs.get("successful") if isinstance(reqs, dict) else None
    pairs: list[tuple[int, int]] = []
    for k, r in enumerate(ok if isinstance(ok, list) else []):
        s, o = (r.get("prompt_tokens"), r.get("output_tokens")) if isinstance(r, dict) else (None, None)
        if not (isinstance(s, int) and isinstance(o, int) and s >= 1 and o >= 1):
            raise InvalidArgument(
                f"{path}: successful request {k} has prompt_tokens {s!r}, output_tokens {o!r}; valid: integers >= 1"
            )
        pairs.append((s, o))
    workload = _joint_law(path, pairs)
    strategy = best.get("config", {}).get("strategy", {}) if isinstance(best.get("config"), dict) else {}
    extra: dict[str, Any] = {"failed": failed, "benchmarks": len(rated), "benchmark": runs.index(best)}
    if isinstance(strategy, dict) and strategy.get("type_"):
        extra["strategy"] = strategy.get("type_")
    return ExternalResult(
        tool="guidellm", path=path, throughput_per_s=thr, completed=done, duration_s=duration,
        workload=workload, extra=extra,
    )


def load_result(path: str) -> ExternalResult:
    """Read a ``vllm bench serve`` result, an AIPerf summary or a GuideLLM report (detected by their keys)."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise InvalidArgument(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{path}: is a directory; give the result JSON file") from None
    except PermissionError:
        raise InvalidArgument(f"{path}: permission denied") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path}: expected a JSON object")
    if "request_throughput" in data and not isinstance(data["request_throughput"], dict):
        return _vllm(path, data)
    if isinstance(data.get("request_throughput"), dict) or isinstance(data.get("records"), dict):
        return _aiperf(path, data)
    if isinstance(data.get("benchmarks"), list):
        return _guidellm(path, data)
    raise InvalidArgument(
        f"{path}: neither a 'vllm bench serve' result (request_throughput: number), an AIPerf "
        "profile_export_aiperf.json (request_throughput: {unit, avg}) nor a GuideLLM report (benchmarks: [...])"
    )


def _stats(values: list[float], units: str) -> dict[str, Any] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    out: dict[str, Any] = {"units": units, "mean": float(a.mean()), "min": float(a.min()), "max": float(a.max())}
    for q, key in ((50, "p50"), (90, "p90"), (99, "p99")):
        out[key] = float(np.percentile(a, q))
    if a.size > 1:
        out["stddev"] = float(a.std(ddof=1))
    return out


def llmd_report(
    run: BenchSummary,
    *,
    started: datetime,
    sent_s: list[int],
    sent_o: list[int],
    ttft_s: list[float],
    latency_s: list[float],
    args: dict[str, Any],
) -> dict[str, Any]:
    """One run of ``kvstab bench`` (its kvstab summary ``run``) as an llm-d v0.2 benchmark report.

    ``sent_s``/``sent_o``: lengths of the requests that completed in the run;
    ``ttft_s``/``latency_s``: their times to first token and end-to-end latencies.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        tool_version = version("kvstab")
    except PackageNotFoundError:
        tool_version = "unknown"
    elapsed = float(run.elapsed_s or 0.0)
    kvstab = run.to_json()

    def seq(values: list[int]) -> dict[str, Any]:
        if not values:
            return {"distribution": "other", "value": 1}
        a = np.asarray(values)
        fixed = bool(a.min() == a.max())
        return {"distribution": "fixed" if fixed else "other", "value": float(a.mean()),
                "min": int(a.min()), "max": int(a.max())}

    thr = run.throughput_per_s
    throughput: dict[str, Any] = {}
    if thr is not None:
        lo, hi = run.throughput_per_s_ci95 or (None, None)
        throughput["requests_rate"] = {"units": "queries/s", "mean": thr, "min": lo, "max": hi}
    window = run.window_s or (0.0, elapsed)
    span = max(window[1] - window[0], 1e-9)
    if thr is not None and sent_o:  # every completed request returned its o tokens (the run checks)
        throughput["output_token_rate"] = {"units": "tokens/s", "mean": thr * float(np.mean(sent_o))}
        throughput["input_token_rate"] = {"units": "tokens/s", "mean": thr * float(np.mean(sent_s))}
    latency = {k: v for k, v in (("time_to_first_token", _stats(ttft_s, "s")),
                                 ("request_latency", _stats(latency_s, "s"))) if v is not None}
    load_std: dict[str, Any] = {
        "tool": "kvstab bench",
        "tool_version": tool_version,
        "source": "random",
        "input_seq_len": seq(sent_s),
        "output_seq_len": seq(sent_o),
    }
    if run.offered_rate_per_s:
        load_std["rate_qps"] = run.offered_rate_per_s
    return {
        "version": "0.2",
        "run": {
            "uid": uuid.uuid4().hex,
            "time": {
                "start": started.astimezone(UTC).isoformat(),
                "end": (started + timedelta(seconds=elapsed)).astimezone(UTC).isoformat(),
                "duration": f"PT{elapsed:.6f}S",
            },
        },
        "scenario": {
            "load": {
                "metadata": {"schema_version": "0.0.1", "description": "kvstab bench: exact lengths, Poisson or trace"},
                "standardized": load_std,
                "native": {"args": args},
            }
        },
        "results": {
            "request_performance": {
                "aggregate": {
                    "requests": {
                        "total": int(run.sent),
                        "failures": int(run.failed),
                        "incomplete": int(run.unfinished),
                        "input_length": _stats([float(x) for x in sent_s], "count"),
                        "output_length": _stats([float(x) for x in sent_o], "count"),
                    },
                    "throughput": throughput,
                    "latency": latency,
                }
            },
            "observability": {
                "kvstab": {k: kvstab.get(k) for k in ("M", "bbar_s", "mu_per_s", "measured_over_mu", "E_g_tokens_slots",
                                                      "server", "window_s", "prefix_caching", "prefix_cache")},
                "window_s": span,
            },
        },
    }
