"""``kvstab bench`` against ``kvstab serve --emulate`` over real HTTP on localhost.

The emulator keeps its own ground truth (its step durations, its completions,
its ``M``); the harness only sees HTTP responses and ``/metrics``.  Tolerances:

* ``M`` exactly (it is read from ``vllm:cache_config_info``);
* ``b̄`` within 10 %: the harness divides the time some request of its own was
  in flight in the window by the steps the ``vllm:iteration_tokens_total``
  histogram counted; the emulator averages the steps that ended in the window
  (they differ by the steps straddling the window's edges, the scrape times
  and the HTTP latency at the ends of each busy period);
* the saturated rate within 15 % of the emulator's own completions per second
  in the same window (the same events, seen by the client when each response
  ends: the difference is the completions near the window's edges);
* ``measured/μ`` in ``[0.75, 1.35]``: kvstab's ``vllm-v1`` model with vLLM's
  lifecycle (``o − 1`` decode units, recompute keeps outputs) against
  ``μ = M/(b̄·E[g])`` at small ``M`` — a sanity band, the cross-check proper
  is ``kvstab empirical compare``.

Every run is bounded in requests and seconds and stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from kvstab.cli import main
from kvstab.live.bench import BenchConfig, poisson_schedule, run_bench
from kvstab.live.emulator import EmulatorConfig
from kvstab.live.server import ServerHandle, build_app, start_in_thread
from kvstab.steplog import ReplayConfig
from kvstab.workload import parse_workload

WORKLOAD = "s=U(32,128),o=U(32,128)"


def _config(**kw: object) -> EmulatorConfig:
    # M = 1024 tokens: about ten requests of WORKLOAD fit, so a few seconds hold hundreds of steps
    vllm = ReplayConfig.for_capacity(1024, 16, max_num_batched_tokens=256)
    kw.setdefault("scheduler", "model")
    return EmulatorConfig(server=replace(vllm.params(), bbar=0.0372), speedup=10.0, **kw)  # type: ignore[arg-type]


@pytest.fixture()
def server() -> Iterator[ServerHandle]:
    h = start_in_thread(_config())
    yield h
    h.stop()


def test_harness_recovers_the_emulators_ground_truth(server: ServerHandle) -> None:
    w = parse_workload(WORKLOAD)
    cfg = BenchConfig(url=server.url, stream=False, duration=5.0, chunk=256, scrape_interval=0.25)
    # 40 req/s is about twice μ: the queue grows and the run measures the saturated rate
    res = asyncio.run(run_bench(cfg, poisson_schedule(w, 40.0, 400, seed=1)))
    assert res.error is None and res.metrics_error is None and res.stopped_by == "duration"
    out = res.summary(w, cfg).to_json()  # the run's JSON form (kvstab bench --json's runs)
    assert server.emulator is not None
    truth = server.emulator.truth
    lo, hi = res.origin + res.elapsed * cfg.warmup, res.origin + res.elapsed
    assert out["M"] == truth.M == 1024
    assert out["bbar_s"] == pytest.approx(truth.bbar(lo, hi), rel=0.10)
    assert out["completed"] >= 20  # enough that one completion at a window edge is within the 10 %
    assert out["throughput_per_s"] == pytest.approx(truth.completion_rate(lo, hi), rel=0.15)
    assert 0.75 <= out["measured_over_mu"] <= 1.35
    slope_low = out["server"]["queue_slope_per_s_ci95"][0]
    assert slope_low > 0  # overloaded: the number in system grows
    assert 0.5 < out["server"]["kv_utilisation"] <= 1.0
    assert out["saturated"] is True and out["saturation_warning"] is None
    assert out["server"]["busy_fraction"] > 0.98


def test_below_saturation_bbar_counts_busy_steps_only_and_the_run_is_flagged(server: ServerHandle) -> None:
    w = parse_workload(WORKLOAD)
    cfg = BenchConfig(url=server.url, stream=False, duration=6.0, chunk=256, scrape_interval=0.25)
    # 2 req/s against μ ≈ 20: the server is idle about half the time
    res = asyncio.run(run_bench(cfg, poisson_schedule(w, 2.0, 400, seed=3)))
    assert res.error is None and res.metrics_error is None
    out = res.summary(w, cfg).to_json()  # the run's JSON form (kvstab bench --json's runs)
    assert server.emulator is not None
    lo, hi = res.origin + res.elapsed * cfg.warmup, res.origin + res.elapsed
    truth = server.emulator.truth.bbar(lo, hi)
    assert out["bbar_s"] == pytest.approx(truth, rel=0.10)
    # elapsed time over steps counts the idle half as stepping
    assert out["server"]["bbar_steps_s"] > 1.5 * truth and out["server"]["busy_fraction"] < 0.8
    assert out["saturated"] is False and "below saturation" in out["saturation_warning"]
    assert "idle" in out["saturation_warning"] and "biased" in out["saturation_warning"]


def test_streaming_chat_with_calibrated_text_returns_exact_lengths(server: ServerHandle) -> None:
    w = parse_workload("s=U(4,40),o=U(2,20)")
    cfg = BenchConfig(url=server.url, api="chat", stream=True, duration=20.0, chunk=256)
    res = asyncio.run(run_bench(cfg, poisson_schedule(w, 20.0, 12, seed=2)))
    assert res.error is None and res.stopped_by == "all requests done"
    assert len(res.records) == 12
    for r in res.records:
        assert r.error is None and r.tokens == r.o and r.first_token is not None and r.done is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bench(tmp_path: Path, url: str, *extra: str) -> tuple[int, dict[str, object]]:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--url", url, "--workload", WORKLOAD, "--rate", "30", "--requests", "60", "--duration", "3",
               "--chunk", "256", "--no-progress", "--out", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_unreachable_url_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _bench(tmp_path, f"http://127.0.0.1:{_free_port()}", "--timeout", "2")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 2 and "cannot reach" in err[0]
    assert doc["runs"][0]["error"].startswith("cannot reach")  # type: ignore[index]


class _PlainServer:
    """A web server that is not OpenAI's API (every path 404)."""

    def __init__(self) -> None:
        self.handle = ServerHandle(web.Application(), "127.0.0.1", 0)
        self.url = self.handle.url


def test_non_openai_server_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = _PlainServer()
    try:
        rc, _ = _bench(tmp_path, plain.url)
    finally:
        plain.handle.stop()
    err = capsys.readouterr().err
    assert rc == 2 and "is not an OpenAI-compatible server" in err


def test_server_ignoring_min_tokens_stops_the_run_and_keeps_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = start_in_thread(_config(honour_min_tokens=False, eos_after=8))
    try:
        rc, doc = _bench(tmp_path, h.url)
    finally:
        h.stop()
    err = capsys.readouterr().err
    assert rc == 2 and "does not honour min_tokens" in err
    run = doc["runs"][0]  # type: ignore[index]
    assert run["sent"] >= 1 and "min_tokens" in run["error"]


def test_missing_metrics_keeps_the_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = build_app(_config())

    @web.middleware
    async def no_metrics(request: web.Request, handler: object) -> web.StreamResponse:
        if request.path == "/metrics":
            raise web.HTTPNotFound()
        return await handler(request)  # type: ignore[operator]

    app.middlewares.append(no_metrics)
    h = ServerHandle(app, "127.0.0.1", 0)
    try:
        rc, doc = _bench(tmp_path, h.url)
    finally:
        h.stop()
    err = capsys.readouterr().err
    assert rc == 2 and "/metrics answered 404" in err
    run = doc["runs"][0]  # type: ignore[index]
    assert run["completed"] > 0 and run["throughput_per_s"] is not None and run["mu_per_s"] is None


def test_missing_metrics_with_given_M_and_bbar_computes_mu(tmp_path: Path) -> None:
    app = build_app(_config())

    @web.middleware
    async def no_metrics(request: web.Request, handler: object) -> web.StreamResponse:
        if request.path == "/metrics":
            raise web.HTTPNotFound()
        return await handler(request)  # type: ignore[operator]

    app.middlewares.append(no_metrics)
    h = ServerHandle(app, "127.0.0.1", 0)
    try:
        rc, doc = _bench(tmp_path, h.url, "--M", "1024", "--bbar", "0.00372", "--llmd-report",
                         str(tmp_path / "report.json"))
    finally:
        h.stop()
    assert rc == 0
    run = doc["runs"][0]  # type: ignore[index]
    assert run["mu_per_s"] > 0 and run["M"] == 1024
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["version"] == "0.2"
    agg = report["results"]["request_performance"]["aggregate"]
    assert agg["requests"]["total"] == run["sent"]
    assert agg["throughput"]["requests_rate"]["units"] == "queries/s"
    assert report["results"]["observability"]["kvstab"]["mu_per_s"] == run["mu_per_s"]


def test_bench_refuses_bad_flags_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", "localhost:8000", "--rate", "1", "--out", str(tmp_path / "x.json")]) == 2
    assert "http://" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--url", "http://x", "--rate", "nan"])
    assert exc.value.code == 2
    assert main(["bench", "--url", "http://x", "--rate", "1", "--out", str(tmp_path / "no" / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", "--port", "0"]) == 2
    assert "--emulate" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--rate", "5"], ["--rate", "5", "--trace", "TRACE"]])
def test_time_scale_without_trace_times_is_refused(
    tmp_path: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("s,o,arrival\n10,5,0.0\n12,6,0.5\n")
    argv = ["bench", "--url", "http://127.0.0.1:9", "--time-scale", "2", "--out", "",
            *[str(trace) if a == "TRACE" else a for a in extra]]
    assert main(argv) == 2  # before any request: port 9 is never contacted
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--time-scale stretches a --trace's own arrival times" in err[0]


def test_default_workload_longer_than_the_servers_context_is_refused_before_sending(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b.json"
    # paper-1:1 (s + o up to 3200) against max_model_len 1025: every request would be answered HTTP 400
    rc = main(["bench", "--url", server.url, "--rate", "5", "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "max_model_len is 1025" in err[0] and "--drop-oversize" in err[0]
    assert server.emulator is not None and server.emulator.truth.steps == 0 and not out.exists()


def test_drop_oversize_sends_only_what_fits_and_takes_mu_of_it(
    server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvstab.model import ModelParams
    from kvstab.theory import stability_report

    spec = "s=U(32,700),o=U(32,700)"
    out = tmp_path / "b.json"
    rc = main(["bench", "--url", server.url, "--workload", spec, "--rate", "30", "--requests", "40", "--duration", "3",
               "--chunk", "256", "--no-progress", "--drop-oversize", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    doc = json.loads(out.read_text())
    run = doc["runs"][0]
    assert run["dropped_oversize"] > 0 and run["sent"] + run["dropped_oversize"] == 40 and run["failed"] == 0
    law, p = parse_workload(spec).conditioned(1025)
    assert doc["fit_probability"] == pytest.approx(p) and doc["max_model_len"] == 1025
    rep = stability_report(law, ModelParams(M=run["M"], chunk=256, block=16, bbar=run["bbar_s"]))
    assert run["mu_per_s"] == pytest.approx(rep.mu_per_s)
    assert f"left out {run['dropped_oversize']} request(s)" in err


def test_server_refuses_requests_that_never_fit(server: ServerHandle) -> None:
    import urllib.error
    import urllib.request

    body = json.dumps({"prompt": list(range(2000)), "max_tokens": 10}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    assert exc.value.code == 400
    assert "maximum context length" in json.loads(exc.value.read())["error"]["message"]


def test_trace_arrivals_from_a_mooncake_file(server: ServerHandle, tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    rows = [f'{{"timestamp": {100 * i}, "input_length": {20 + i}, "output_length": {5 + i}, "hash_ids": [{i}]}}'
            for i in range(8)]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "t.json"
    rc = main(["bench", "--url", server.url, "--trace", str(trace), "--duration", "20", "--chunk", "256",
               "--no-progress", "--out", str(out), "--M", "1024", "--bbar", "0.00372"])
    run = json.loads(out.read_text())["runs"][0]
    assert rc == 0 and run["sent"] == run["completed"] == 8 and run["stopped_by"] == "all requests done"
    assert run["offered_rate_per_s"] is None


def test_ctrl_c_ends_the_run_and_keeps_the_measurements(server: ServerHandle, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "int.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstab.cli", "bench", "--url", server.url, "--workload", WORKLOAD, "--rate", "30",
         "--duration", "60", "--chunk", "256", "--no-progress", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    assert server.emulator is not None
    while server.emulator.truth.steps < 200 and time.monotonic() < deadline:  # requests are flowing
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted; the measurements so far are kept" in err and "Traceback" not in err
    run = json.loads(out.read_text())["runs"][0]
    assert run["stopped_by"] == "interrupted" and run["sent"] > 0 and run["elapsed_s"] < 60


def test_what_clients_send_and_read_max_completion_tokens_running_usage_and_vllms_error_shape(
    server: ServerHandle,
) -> None:
    """The fields real clients use: GuideLLM's chat requests carry max_completion_tokens and ask for
    continuous_usage_stats; every client reads error.message of vLLM's error shape."""
    import aiohttp

    async def go() -> tuple[list[dict[str, object]], dict[str, object]]:
        async with aiohttp.ClientSession() as s:
            body = {"model": "kvstab-emulator", "messages": [{"role": "user", "content": "a b c"}],
                    "max_completion_tokens": 5, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            events = []
            async with s.post(server.url + "/v1/chat/completions", json=body) as r:
                async for raw in r.content:
                    line = raw.decode().strip()
                    if line.startswith("data:") and line != "data: [DONE]":
                        events.append(json.loads(line[5:]))
            async with s.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 0}) as r:
                assert r.status == 400
                err = await r.json()
        return events, err

    events, err = asyncio.run(go())
    with_tokens = [e for e in events if e["choices"]]
    assert sum(len(e["choices"][0]["delta"]["content"].split()) for e in with_tokens) == 5  # type: ignore[index]
    assert all(e["usage"]["prompt_tokens"] == 3 for e in with_tokens)  # type: ignore[index]
    assert events[-1]["usage"]["completion_tokens"] == 5  # type: ignore[index]
    assert set(err["error"]) == {"message", "type", "param", "code"} and "max_tokens" in err["error"]["message"]  # type: ignore[index]
