"""The fast engine's streamed statistics, batching, progress callback, vLLM replay
and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

import kvstab.engine.driver as engine_driver
from kvstab.arrivals import fixed_arrivals, poisson_arrivals
from kvstab.empirical.replay import ReplayConfig
from kvstab.empirical.replay import replay_model as reference_replay
from kvstab.engine import replay_model, run, simulate
from kvstab.engine._kernel import held
from kvstab.errors import InvalidArgument
from kvstab.metrics import queue_slope, throughput, utilisation
from kvstab.model import ModelParams, tokens_held
from kvstab.registry import load_scheduler
from kvstab.simulator import simulate as reference_simulate
from kvstab.workload import parse_workload

WORKLOAD = parse_workload("s=U(1,60),o=U(1,60)")
PARAMS = ModelParams(M=600, chunk=16, block=4)


def test_kernel_memory_accounting_is_tokens_held() -> None:
    """The compiled loop's block rounding is the model's one accounting function."""
    for B in range(1, 18):
        for p in range(0, 200):
            assert held(p, B) == tokens_held(p, B)


@pytest.mark.parametrize("rule", ["current-fit", "lookahead", "vllm-v1"])
def test_batch_boundaries_change_nothing(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cutting the run into batches of 37 slots gives the reference engine's result."""
    plan = poisson_arrivals(WORKLOAD, 0.4, ModelParams(bbar=1.0), 400, seed=3)
    ref = reference_simulate(load_scheduler(rule), PARAMS, plan, 400)
    monkeypatch.setattr(engine_driver, "BATCH", 37)
    fast = simulate(load_scheduler(rule), PARAMS, plan, 400)
    for f in ("memory", "queue", "completed", "finish", "served", "request_wasted"):
        assert np.array_equal(getattr(ref, f), getattr(fast, f)), f


def test_streamed_summary_is_the_metrics_of_the_recorded_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """record=False keeps no per-slot series, yet its summary is kvstab.metrics' on the recorded run."""
    monkeypatch.setattr(engine_driver, "BATCH", 1000)  # many batches, boundaries inside the batch-means batches
    plan = poisson_arrivals(WORKLOAD, 0.6, ModelParams(bbar=1.0), 20_000, seed=5)
    sched = load_scheduler("current-fit")
    seen: list[tuple[int, int | None]] = []
    streamed = run(sched, PARAMS, plan, 20_000, record=False, progress=lambda t, n: seen.append((t, n)))
    recorded = run(sched, PARAMS, plan, 20_000)
    assert streamed.result is None and recorded.result is not None
    res = recorded.result
    s = streamed.summary
    for est, ref in ((s.throughput, throughput(res)), (s.queue_slope, queue_slope(res))):
        assert est is not None
        assert est.value == pytest.approx(ref.value, rel=1e-9, abs=1e-12)
        assert est.low == pytest.approx(ref.low, rel=1e-9, abs=1e-12)
        assert est.high == pytest.approx(ref.high, rel=1e-9, abs=1e-12)
    assert s.utilisation == pytest.approx(utilisation(res), rel=1e-12)
    assert s.completed == int(res.completed.sum()) == recorded.summary.completed
    assert s.wasted == int(res.request_wasted.sum()) and s.preemptions == int(res.preemptions.sum())
    assert s.latency == recorded.summary.latency and s.latency["p50"] <= s.latency["p99"]
    assert [t for t, _ in seen] == sorted(t for t, _ in seen) and seen[-1] == (20_000, 20_000)


def test_drained_stream_matches_recorded() -> None:
    plan = poisson_arrivals(WORKLOAD, 0.3, ModelParams(bbar=1.0), 3000, seed=2)
    sched = load_scheduler("reserve")
    a = run(sched, PARAMS, plan, drain=True, record=False)
    b = run(sched, PARAMS, plan, drain=True)
    assert b.result is not None and a.summary.slots == b.result.slots
    assert a.summary.throughput == b.summary.throughput and a.summary.utilisation == b.summary.utilisation


@pytest.mark.parametrize("checkpoint", [None, 0, 77, 400])
def test_vllm_replay_matches_the_reference_model(checkpoint: int | None) -> None:
    """The vLLM-matched model on the fast engine: every StepLog column of the reference model."""
    cfg = ReplayConfig.for_capacity(320, 16, max_num_batched_tokens=32, max_num_seqs=4)
    plan = poisson_arrivals(parse_workload("s=U(1,90),o=U(1,60)"), 0.3, ModelParams(bbar=1.0), 400, seed=7)
    ref = reference_replay(plan, cfg, 400, checkpoint=checkpoint)
    fast = replay_model(plan, cfg, 400, checkpoint=checkpoint)
    assert ref.first_difference(fast) is None
    assert int(ref.preempted.sum()) > 0  # the plan reaches preemption, so recompute is exercised


def test_bad_arguments_are_one_line_errors() -> None:
    plan = fixed_arrivals([(0, 4, 4)])
    sched = load_scheduler("current-fit")
    with pytest.raises(InvalidArgument, match="engine must be"):
        run(sched, PARAMS, plan, 10, engine="turbo")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="lifecycle must be"):
        run(sched, PARAMS, plan, 10, lifecycle="sglang")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="slots must be a positive integer"):
        run(sched, PARAMS, plan, 0)
    with pytest.raises(InvalidArgument, match="needs a number of slots"):
        run(sched, PARAMS, plan)
    with pytest.raises(InvalidArgument, match="no scheduler can ever serve it"):
        run(sched, ModelParams(M=6, chunk=4), plan, 10)


@pytest.mark.parametrize("rule", ["current-fit", "plugins.sample_plugins:ADMIT_NOTHING"])
def test_simulate_drop_in_calls_on_slot_for_every_slot(rule: str) -> None:
    """``kvstab.engine.simulate`` calls ``on_slot`` once per slot, in order, on any engine."""
    plan = fixed_arrivals([(0, 4, 4), (3, 5, 2)])
    seen: list[int] = []
    res = simulate(load_scheduler(rule), PARAMS, plan, 5000, on_slot=seen.append)
    assert seen == list(range(res.slots)) and res.slots == 5000
