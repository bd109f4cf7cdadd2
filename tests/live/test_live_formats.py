"""Results users have (``vllm bench serve``, AIPerf) compared with μ; /metrics parsing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvstab.cli import main
from kvstab.errors import InvalidArgument
from kvstab.live.formats import load_result
from kvstab.live.scrape import MetricsUnavailable, parse_metrics, server_estimates
from kvstab.model import ModelParams
from kvstab.theory import stability_report
from kvstab.workload import Workload, parse_workload

VLLM_RESULT = {
    "date": "20251201-061500", "backend": "vllm", "model_id": "Qwen/Qwen3-0.6B", "request_rate": 40.0,
    "duration": 60.0, "completed": 300, "failed": 0, "total_input_tokens": 3000, "total_output_tokens": 6000,
    "request_throughput": 5.0, "output_throughput": 100.0,
    "input_lens": [10, 20, 30], "output_lens": [20, 20, 20],
}


def test_vllm_bench_serve_result_uses_its_own_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "vllm-40qps.json"
    f.write_text(json.dumps(VLLM_RESULT))
    res = load_result(str(f))
    assert res.tool == "vllm bench serve" and res.throughput_per_s == 5.0 and res.completed == 300
    assert res.workload is not None and res.workload.max_total == 50
    out = tmp_path / "cmp.json"
    assert main(["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--chunk", "512", "--block", "16",
                 "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    mu = stability_report(Workload.joint([10, 20, 30], [20, 20, 20]), ModelParams(M=4096, chunk=512, block=16, bbar=0.03))
    assert got["mu_per_s"] == pytest.approx(mu.mu_per_s) and got["measured_over_mu"] == pytest.approx(5.0 / mu.mu_per_s)
    assert "measured/μ" in capsys.readouterr().out


@pytest.mark.parametrize("nested", [False, True])
def test_aiperf_summary_needs_the_workload(tmp_path: Path, nested: bool, capsys: pytest.CaptureFixture[str]) -> None:
    metrics = {
        "request_throughput": {"unit": "requests/sec", "avg": 7.5},
        "request_count": {"unit": "requests", "avg": 450},
        "output_sequence_length": {"unit": "tokens", "avg": 100.0, "p50": 100.0},
        "benchmark_duration": {"unit": "sec", "avg": 60.0},
    }
    f = tmp_path / "profile_export_aiperf.json"
    f.write_text(json.dumps({"records": metrics, "input_config": {}} if nested else metrics))
    res = load_result(str(f))
    assert res.tool == "aiperf" and res.throughput_per_s == 7.5 and res.completed == 450 and res.workload is None
    assert main(["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--out", ""]) == 2
    assert "records no per-request lengths" in capsys.readouterr().err
    assert main(["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--workload", "s=U(10,30),o=const(100)",
                 "--out", ""]) == 0
    mu = stability_report(parse_workload("s=U(10,30),o=const(100)"), ModelParams(M=4096, chunk=512, block=16, bbar=0.03))
    assert f"{mu.mu_per_s:.4f}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text,reason",
    [
        ("[1, 2]", "expected a JSON object"),
        ("{", "not JSON"),
        ('{"foo": 1}', "neither a 'vllm bench serve' result"),
        ('{"request_throughput": NaN}', "finite non-negative number"),
        ('{"request_throughput": {"unit": "requests/sec"}}', "no request_throughput.avg"),
    ],
)
def test_bad_result_files_are_one_line(tmp_path: Path, text: str, reason: str) -> None:
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(InvalidArgument, match=reason):
        load_result(str(f))
    with pytest.raises(InvalidArgument, match="is a directory"):
        load_result(str(tmp_path))


METRICS = """# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {run}
vllm:num_requests_waiting{{model_name="m"}} {wait}
vllm:kv_cache_usage_perc{{model_name="m"}} 0.9
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{model_name="m"}} {pre}
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{{le="+Inf",model_name="m"}} {steps}
vllm:iteration_tokens_total_count{{model_name="m"}} {steps}
vllm:iteration_tokens_total_sum{{model_name="m"}} {tokens}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="1001"}} 1.0
"""


def test_server_estimates_from_scrapes() -> None:
    snaps = [
        parse_metrics(METRICS.format(run=8, wait=2 * k, pre=3 * k, steps=100 * k, tokens=5000 * k), float(k))
        for k in range(6)
    ]
    est = server_estimates(snaps)
    assert est.M == 16_000 and est.block_size == 16 and est.num_gpu_blocks == 1001
    assert est.bbar_s == pytest.approx(0.01) and est.mean_step_tokens == pytest.approx(50.0)
    assert est.queue_slope_per_s == pytest.approx(2.0) and est.preemptions == 15
    assert est.kv_utilisation == pytest.approx(0.9)


def test_bbar_over_busy_time_leaves_idle_time_out() -> None:
    from kvstab.live.bench import RequestRecord, RunResult

    snaps = [
        parse_metrics(METRICS.format(run=1, wait=0, pre=0, steps=50 * k, tokens=500 * k), float(k)) for k in range(5)
    ]
    run = RunResult(rate=1.0, elapsed=4.0)
    # in flight [0.5, 1.5] ∪ [1.0, 2.0] ∪ [3.0, 3.5] ∪ [3.9, end): 1.5 + 0.5 + 0.1 = 2.1 s busy of 4
    run.records = [RequestRecord(1, 1, 0.5, done=1.5), RequestRecord(1, 1, 1.0, done=2.0),
                   RequestRecord(1, 1, 3.0, done=3.5), RequestRecord(1, 1, 3.9, error="unfinished at the end of the run"),
                   RequestRecord(1, 1, 2.5, done=2.5, error="HTTP 400: too long")]  # fmt: skip
    busy = run.busy_time(0.0, 4.0)
    assert busy == pytest.approx(2.1)
    est = server_estimates(snaps, busy_s=busy)
    assert est.bbar_busy_s == pytest.approx(2.1 / 200) and est.bbar_s == est.bbar_busy_s
    assert est.bbar_steps_s == pytest.approx(4.0 / 200) and est.busy_fraction == pytest.approx(2.1 / 4)


@pytest.mark.parametrize("text", ["<html>not found</html>", "process_cpu_seconds_total 1.0\n"])
def test_metrics_that_are_not_vllms(text: str) -> None:
    with pytest.raises(MetricsUnavailable):
        parse_metrics(text, 0.0)


def test_emulated_step_time_follows_the_batch_time_model() -> None:
    from kvstab.empirical.batchtime import BatchTimeModel
    from kvstab.live.emulator import Emulator, EmulatorConfig
    from kvstab.steplog import ReplayConfig

    model = BatchTimeModel(a=0.005, b=1e-5, c=2e-5, d=1e-8)
    server = ReplayConfig.for_capacity(1024, 16).params()
    emu = Emulator(EmulatorConfig(server=server, batch_time=model))
    work = {"prefill_tokens": 100, "decode_tokens": 10, "kv_attended": 1000}
    assert emu.step_seconds(work) == pytest.approx(0.005 + 100e-5 + 10 * 2e-5 + 1000e-8)
    assert Emulator(EmulatorConfig(server=replace(server, bbar=0.02))).step_seconds(work) == 0.02


@pytest.mark.parametrize("value", ["1,2,3", "0,0,0,0", "0.01,nan,0,0", "a,b,c,d"])
def test_serve_refuses_a_bad_batch_time(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--emulate", "--batch-time", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --batch-time" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "ins,outs,reason",
    [
        ([10, 20, 30], [20, 20], "input_lens has 3 entries but output_lens has 2"),
        ([10, 20], [20, 20, 20], "input_lens has 2 entries but output_lens has 3"),
        ([10, "x"], [20, 20], "request 1 has input_lens 'x'"),
        ([10, 20], [20, -1], "request 1 has input_lens 20, output_lens -1"),
        ([0, 20], [20, 20], "request 0 has input_lens 0"),
    ],
)
def test_vllm_lengths_that_do_not_pair_up_are_one_line(
    tmp_path: Path, ins: list[object], outs: list[object], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**VLLM_RESULT, "input_lens": ins, "output_lens": outs}))
    assert main(["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0]


def test_vllm_failed_requests_are_left_out_of_the_law(tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**VLLM_RESULT, "input_lens": [10, 5000, 30], "output_lens": [20, 0, 20]}))
    res = load_result(str(f))
    assert res.workload is not None and res.workload.max_total == 50 and res.workload.max_s == 30


def test_imported_requests_that_do_not_fit_M_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps(VLLM_RESULT))  # s + o up to 50
    assert main(["bench", "--import", str(f), "--M", "40", "--bbar", "0.03", "--block", "1", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need up to 50 KV tokens" in err[0] and "--M is 40" in err[0]
    assert main(["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--workload", "s=U(10,3000),o=const(2000)",
                 "--out", ""]) == 2
    assert "need up to 5008 KV tokens" in capsys.readouterr().err


def test_imported_requests_longer_than_max_model_len_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "r.json"
    f.write_text(json.dumps(VLLM_RESULT))  # s + o up to 50
    args = ["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--out", ""]
    assert main([*args, "--max-model-len", "49"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s + o up to 50" in err[0] and "--max-model-len is 49" in err[0]
    assert main([*args, "--max-model-len", "50"]) == 0
    # against a live server max_model_len is the server's: the flag would do nothing, so it is refused
    capsys.readouterr()
    assert main(["bench", "--url", "http://127.0.0.1:9", "--rate", "1", "--max-model-len", "50", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GET /v1/models" in err[0]


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"{name} in kvstab's JSON")

    return json.loads(text, parse_constant=refuse)


def test_no_nan_in_kvstabs_json_but_null_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Python's json reads NaN, so a result file may carry one into what kvstab writes
    f = tmp_path / "r.json"
    f.write_text(json.dumps({**VLLM_RESULT, "output_throughput": float("nan"), "failed": float("inf")}))
    out_file = tmp_path / "out.json"
    assert main(["bench", "--import", str(f), "--M", "4096", "--bbar", "0.03", "--json", "--out", str(out_file)]) == 0
    for text in (capsys.readouterr().out, out_file.read_text()):
        extra = _strict(text)["extra"]  # type: ignore[index]
        assert extra["output_throughput"] is None and extra["failed"] is None
        assert "NaN" in extra["undefined"]["output_throughput"] and "infinite" in extra["undefined"]["failed"]


def test_finite_json_nests_and_keeps_finite_values() -> None:
    from kvstab.jsonform import dumps

    doc = _strict(dumps({"a": 1.5, "b": [1.0, float("-inf")], "c": {"d": float("nan")}, "undefined": {"x": "kept"}}))
    assert doc == {"a": 1.5, "b": [1.0, None], "c": {"d": None, "undefined": {"d": doc["c"]["undefined"]["d"]}},  # type: ignore[index]
                   "undefined": {"x": "kept", "b": doc["undefined"]["b"]}}  # type: ignore[index]
