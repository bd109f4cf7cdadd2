"""``kvstab bench --prefix-caching``: the prompts it sends, the hit rate it scrapes, and the
emulator's prefix cache behind ``kvstab serve --emulate --prefix-caching on``.

The unit tests build requests and parse a hand-written ``/metrics``; the end-to-end test sends a
shared-prompt workload over HTTP on localhost to the emulator with caching on, whose ``vllm-v1``
model runs vLLM's block pool: every request after the first finds the shared ``P`` tokens cached
(``P`` a whole number of blocks), so the hits are exactly ``(n − 1)·P``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvstab.cli import main
from kvstab.live.bench import PROMPT_ID_LOW, PROMPT_ID_SPAN, poisson_schedule, prompt_ids, trace_schedule
from kvstab.live.emulator import EmulatorConfig, prompt_content
from kvstab.live.scrape import parse_metrics, prefix_cache_hits
from kvstab.live.server import ServerHandle, start_in_thread
from kvstab.prefix import block_hashes
from kvstab.steplog import ReplayConfig
from kvstab.traces import load_trace
from kvstab.workload import parse_workload

SHARED = "s=U(64,128),o=U(8,16),prefix=shared(48)"

METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",enable_prefix_caching="{caching}",num_gpu_blocks="65"}} 1.0
"""


def test_hit_rate_is_hits_over_queries_between_the_runs_first_and_last_scrape() -> None:
    a = parse_metrics(METRICS.format(queries=1000, hits=100, caching="True"), 0.0)
    b = parse_metrics(METRICS.format(queries=5000, hits=2100, caching="True"), 5.0)
    pc = prefix_cache_hits(a, b)
    assert pc.server_caching is True and pc.queries == 4000 and pc.hits == 2000 and pc.hit_rate == pytest.approx(0.5)
    assert pc.missing is None


def test_no_lookups_with_caching_off_is_said_plainly() -> None:
    a = parse_metrics(METRICS.format(queries=0, hits=0, caching="False"), 0.0)
    b = parse_metrics(METRICS.format(queries=0, hits=0, caching="False"), 5.0)
    pc = prefix_cache_hits(a, b)
    assert pc.hit_rate is None and pc.server_caching is False and "prefix caching off" in str(pc.missing)


def test_a_server_without_the_counters_gets_no_hit_rate_and_no_crash() -> None:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1.0\n'
    pc = prefix_cache_hits(parse_metrics(text, 0.0), parse_metrics(text, 1.0))
    assert pc.hit_rate is None and pc.server_caching is None
    assert "no prefix-cache counters" in str(pc.missing) and "vllm:prefix_cache_hits_total" in str(pc.missing)


def test_with_caching_the_requests_carry_the_workloads_shared_prefix() -> None:
    w = parse_workload(SHARED)
    on = poisson_schedule(w, 10.0, 20, seed=4, prompts=True)
    off = poisson_schedule(w, 10.0, 20, seed=4)
    # the prompts are drawn after the lengths: times and lengths are the same either way
    assert off.prompts is None and on.prompts is not None
    assert np.array_equal(on.t, off.t) and np.array_equal(on.s, off.s) and np.array_equal(on.o, off.o)
    rng = np.random.default_rng(0)
    ids = [prompt_ids(rng, int(on.s[i]), on.prompts, i) for i in range(3)]
    assert [len(x) for x in ids] == [int(x) for x in on.s[:3]]
    assert ids[0][:48] == ids[1][:48] == ids[2][:48]  # the shared system prompt, id for id
    assert ids[0][48:56] != ids[1][48:56]  # then each request's own tokens
    assert all(PROMPT_ID_LOW <= x < PROMPT_ID_LOW + PROMPT_ID_SPAN for x in ids[0])
    # without prompts: random ids of their own
    plain = [prompt_ids(rng, 64) for _ in range(2)]
    assert plain[0][:16] != plain[1][:16]


def test_chat_turns_repeat_the_previous_prompt() -> None:
    w = parse_workload("s=U(20,40),o=U(5,10),prefix=chat(const(3),0.5)")
    sched = poisson_schedule(w, 20.0, 30, seed=1, prompts=True)
    assert sched.prompts is not None and len(sched.t) == 30 and np.all(np.diff(sched.t) >= 0)
    assert np.array_equal(sched.prompts.lengths(), sched.s)
    rng = np.random.default_rng(0)
    ids = [prompt_ids(rng, int(sched.s[i]), sched.prompts, i) for i in range(30)]
    # some turn's prompt starts with an earlier request's whole prompt (its conversation's previous turn)
    assert any(ids[j][: len(ids[i])] == ids[i] for j in range(30) for i in range(j) if len(ids[i]) < len(ids[j]))


def test_a_mooncake_trace_sends_its_hash_blocks(tmp_path: Path) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text("\n".join(
        f'{{"timestamp": {10 * i}, "input_length": {600 + i}, "output_length": 4, "hash_ids": [7, {100 + i}]}}'
        for i in range(3)
    ) + "\n")
    sched = trace_schedule(load_trace(str(trace)), 1.0, 10, prompts=True)
    assert sched.prompts is not None
    rng = np.random.default_rng(0)
    a, b = (prompt_ids(rng, int(sched.s[i]), sched.prompts, i) for i in range(2))
    assert a[:512] == b[:512] and a[512:520] != b[512:520]  # hash id 7 is the same 512-token block
    assert trace_schedule(load_trace(str(trace)), 1.0, 10).prompts is None


def test_emulator_content_shares_exactly_the_equal_leading_blocks() -> None:
    x = list(range(1000, 1100))
    y = x[:40] + [5] * 60  # equal for 2 whole blocks of 16 and 8 tokens into the third
    hx, hy = block_hashes(prompt_content(x, 16), 16), block_hashes(prompt_content(y, 16), 16)
    assert len(hx) == len(hy) == 6 and hx[:2] == hy[:2] and hx[2] != hy[2]


def _caching_server() -> ServerHandle:
    vllm = ReplayConfig.for_capacity(1024, 16, max_num_batched_tokens=256)
    params = replace(vllm.params(), bbar=0.0372, prefix_caching=True)
    return start_in_thread(EmulatorConfig(server=params, speedup=10.0, scheduler="model"))


@pytest.fixture()
def caching_server() -> Iterator[ServerHandle]:
    h = _caching_server()
    yield h
    h.stop()


def _bench(tmp_path: Path, url: str, *extra: str) -> tuple[int, dict[str, object]]:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--url", url, "--workload", SHARED, "--rate", "30", "--requests", "40", "--duration", "10",
               "--chunk", "256", "--no-progress", "--out", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_bench_with_caching_hits_the_shared_prompt_end_to_end(
    caching_server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _bench(tmp_path, caching_server.url)
    printed = capsys.readouterr().out
    assert rc == 0 and doc["prefix_caching"] is True and "no-sharing" in str(doc["mu_formula"])
    run = doc["runs"][0]  # type: ignore[index]
    assert run["completed"] == run["sent"] == 40 and run["prompts_shared"] is True
    pc = run["prefix_cache"]
    # every request after the first finds the 48 shared tokens (3 whole blocks) cached, and nothing more
    assert pc["server_caching"] is True and pc["hits"] == 39 * 48
    # vLLM counts every prompt token of a request at its first admission (the CLI's seed: 0)
    assert pc["queries"] == int(poisson_schedule(parse_workload(SHARED), 30.0, 40, 0, prompts=True).s.sum())
    assert pc["hit_rate"] == pytest.approx(pc["hits"] / pc["queries"])
    assert "prefix cache    hit rate" in printed and "no-sharing formula" in printed and "measured / μ" in printed


def test_bench_with_caching_off_sends_random_ids_and_the_server_finds_nothing(
    caching_server: ServerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _bench(tmp_path, caching_server.url, "--prefix-caching", "off")
    printed = capsys.readouterr().out
    run = doc["runs"][0]  # type: ignore[index]
    assert rc == 0 and run["prompts_shared"] is False and run["prefix_cache"]["hits"] == 0
    assert "enable_prefix_caching=True but bench ran with --prefix-caching off" in printed


def test_chat_api_cannot_carry_prefixes_and_is_refused_with_caching(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--url", "http://127.0.0.1:9", "--workload", SHARED, "--rate", "5", "--api", "chat",
               "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--api completions" in err[0]
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--url", "http://x", "--rate", "1", "--prefix-caching", "maybe"])
    assert exc.value.code == 2


def test_vllms_own_scheduler_with_caching_finds_the_same_hits(tmp_path: Path) -> None:
    from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm

    try:
        load_vllm()
    except VllmUnavailable as exc:
        # as every vLLM test: CI sets KVSTAB_REQUIRE_VLLM=1, where a missing vLLM is a failure, not a skip
        if os.environ.get("KVSTAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVSTAB_REQUIRE_VLLM=1 but {exc}", pytrace=False)
        pytest.skip(f"{exc} (scripts/install-vllm.sh; KVSTAB_REQUIRE_VLLM=1 turns this skip into a failure)")
    vllm = ReplayConfig.for_capacity(1024, 16, max_num_batched_tokens=256)
    params = replace(vllm.params(), bbar=0.0372, prefix_caching=True)
    h = start_in_thread(EmulatorConfig(server=params, speedup=10.0, scheduler="vllm"))
    try:
        assert h.emulator is not None and h.emulator.backend.name == "vLLM scheduler"
        rc, doc = _bench(tmp_path, h.url)
    finally:
        h.stop()
    pc = doc["runs"][0]["prefix_cache"]  # type: ignore[index]
    # vLLM's own counters (make_prefix_cache_stats) agree with the model's pool
    assert rc == 0 and pc["hits"] == 39 * 48
    assert pc["queries"] == int(poisson_schedule(parse_workload(SHARED), 30.0, 40, 0, prompts=True).s.sum())


def test_an_aborted_request_gives_its_blocks_back_to_the_pool() -> None:
    from kvstab.live.emulator import ModelBackend

    vllm = ReplayConfig.for_capacity(256, 16, max_num_batched_tokens=256, enable_prefix_caching=True)
    backend = ModelBackend(vllm)
    shared = list(range(2000, 2064))
    rids = [backend.arrive(96, 40, shared + [3000 + 100 * i + j for j in range(32)]) for i in range(2)]
    out = backend.step()
    # as in vLLM, the second finds the first's shared blocks, cached as the same step allocated them
    assert out.running == 2 and out.prefix_queries == 192 and out.prefix_hits == 64
    assert out.kv_tokens == 64 + 2 * 32  # the shared 4 blocks once, then each one's own 2
    backend.abort(rids[0])
    # the aborted request's blocks are free again: the rest runs to the end within M, and leaves nothing held
    while not backend.idle:
        out = backend.step()
    assert out.kv_tokens == 0
    late = backend.arrive(96, 4, shared + list(range(5000, 5032)))
    out = backend.step()
    assert late == 2 and out.prefix_queries == 96 and out.prefix_hits == 64  # the shared blocks stayed cached
