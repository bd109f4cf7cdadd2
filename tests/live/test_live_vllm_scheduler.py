"""``kvstab serve --emulate`` batching with vLLM's own scheduler (the vLLM extra).

Where vLLM 0.33.0 is installed (CI installs it with ``scripts/install-vllm.sh``)
the harness must recover this emulator's ground truth as it does the model's;
where it is not, asking for it is one clear line naming the install script.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from kvstab.cli import main
from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
from kvstab.live.bench import BenchConfig, poisson_schedule, run_bench
from kvstab.live.emulator import EmulatorConfig
from kvstab.live.server import start_in_thread
from kvstab.steplog import ReplayConfig
from kvstab.workload import parse_workload


def _have_vllm() -> bool:
    try:
        load_vllm()
    except VllmUnavailable:
        return False
    return True


def test_vllm_scheduler_behind_the_emulator(capsys: pytest.CaptureFixture[str]) -> None:
    if not _have_vllm():
        assert main(["serve", "--emulate", "--scheduler", "vllm", "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert "install-vllm.sh" in err and len(err.strip().splitlines()) == 1
        return
    vllm = ReplayConfig.for_capacity(1024, 16, max_num_batched_tokens=256)
    h = start_in_thread(EmulatorConfig(server=replace(vllm.params(), bbar=0.0372), speedup=10.0, scheduler="vllm"))
    try:
        assert h.emulator is not None and h.emulator.backend.name == "vLLM scheduler"
        w = parse_workload("s=U(32,128),o=U(32,128)")
        cfg = BenchConfig(url=h.url, stream=True, duration=5.0, chunk=256, scrape_interval=0.25)
        res = asyncio.run(run_bench(cfg, poisson_schedule(w, 40.0, 400, seed=3)))
        assert res.error is None and res.metrics_error is None  # every response had exactly o tokens
        out = res.summary(w, cfg).to_json()  # the run's JSON form (kvstab bench --json's runs)
        truth = h.emulator.truth
        lo, hi = res.origin + res.elapsed * cfg.warmup, res.origin + res.elapsed
        assert out["M"] == truth.M == 1024
        assert out["bbar_s"] == pytest.approx(truth.bbar(lo, hi), rel=0.10)
        assert out["completed"] >= 20
        assert out["throughput_per_s"] == pytest.approx(truth.completion_rate(lo, hi), rel=0.15)
        assert 0.75 <= out["measured_over_mu"] <= 1.35
    finally:
        h.stop()
