"""Fleets with prefix caching (issues 25 and 27): each replica is a server with its own block pool on
both paths (the static path's compiled cache engine, the event loop's reference engines), the
arrivals carry the prefix law's prompts, and every output says μ is the no-sharing formula with
measured/μ beside it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvstab.arrivals import ArrivalPlan
from kvstab.cli import main
from kvstab.engine import run
from kvstab.errors import InvalidArgument
from kvstab.fleet.arrivals import piecewise_poisson, poisson_times
from kvstab.fleet.plan import GpuType, solve_plan, verify_plan
from kvstab.fleet.simulate import Replica, simulate_fleet
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.workload import parse_workload

SHARED = "s=U(40,48),o=U(4,8),prefix=shared(32)"
W = parse_workload(SHARED)
SERVER = ModelParams(M=480, chunk=16, block=4, bbar=0.05)
REPLICA = "count=2,M=480,chunk=16,block=4,bbar=0.05,scheduler=vllm-v1"


def _fleet(caching: bool) -> list[Replica]:
    return [Replica(replace(SERVER, prefix_caching=caching), "vllm-v1") for _ in range(2)]


def test_arrivals_carry_the_prefix_laws_prompts_without_changing_times_or_lengths() -> None:
    plain = poisson_times(W, 40.0, 30.0, seed=3)
    with_prompts = poisson_times(W, 40.0, 30.0, seed=3, prompts=True)
    assert plain.prompts is None and with_prompts.prompts is not None and len(with_prompts.prompts) == len(plain)
    assert np.array_equal(plain.time, with_prompts.time) and np.array_equal(plain.s, with_prompts.s)
    assert np.array_equal(with_prompts.prompts.lengths(), with_prompts.s)
    pw = piecewise_poisson(W, [20.0, 40.0], 10.0, seed=1, prompts=True)
    assert pw.prompts is not None and len(pw.prompts) == len(pw)
    with pytest.raises(InvalidArgument, match="prefix=chat"):
        poisson_times(parse_workload("s=U(20,40),o=U(5,10),prefix=chat(U(1,3),5)"), 5.0, 10.0, prompts=True)


def test_each_replica_caches_on_its_own_pool_and_serves_more_than_without() -> None:
    # twice the fleet's no-sharing Σμ: without caching the queue grows, with it the fleet keeps up
    arr = poisson_times(W, 2 * 2 * 24.7, 60.0, seed=0, prompts=True)
    on = simulate_fleet(_fleet(True), "round-robin", W, arr)
    off = simulate_fleet(_fleet(False), "round-robin", W, arr)
    assert on.path == "static" and off.path == "static"
    assert on.fleet.throughput is not None and off.fleet.throughput is not None
    assert on.fleet.throughput.low > 1.3 * off.fleet.throughput.high
    assert on.fleet.in_system_end < off.fleet.in_system_end
    # a replica's pool is its own: replica 1 run alone on its round-robin share (with that share's prompts)
    # finishes every request exactly when it does in the fleet, on the compiled cache path
    r1 = on.replicas[1]
    assert r1.engine == "fast" and np.array_equal(r1.request_ids, np.arange(1, len(arr), 2))
    ids = r1.request_ids
    params = replace(SERVER, prefix_caching=True)
    slots = int(np.ceil(arr.horizon_s / params.bbar))
    assert arr.prompts is not None
    plan = ArrivalPlan(np.floor(arr.time[ids] / params.bbar).astype(np.int64), arr.s[ids], arr.o[ids],
                       prompts=arr.prompts.take(ids))
    res = run(load_scheduler("vllm-v1"), params, plan, slots, record=True).result
    assert res is not None
    alone = np.where(res.finish >= 0, (res.finish + 1) * params.bbar, np.nan)
    assert np.array_equal(alone, r1.finish_s, equal_nan=True)


def test_the_event_loop_carries_each_replicas_pool() -> None:
    # the event loop's reference engines with their own pools finish every request when the static
    # path's compiled cache engine does (round-robin on both paths)
    arr = poisson_times(W, 60.0, 6.0, seed=0, prompts=True)
    a = simulate_fleet(_fleet(True), "round-robin", W, arr)
    b = simulate_fleet(_fleet(True), "round-robin", W, arr, path="event")
    assert a.path == "static" and b.path == "event"
    for x, y in zip(a.replicas, b.replicas):
        assert np.array_equal(x.request_ids, y.request_ids)
        assert np.array_equal(x.finish_s, y.finish_s, equal_nan=True)
        assert x.stats.as_dict() == y.stats.as_dict()
    # a state-dependent router runs with caching, and caching serves more than without
    on = simulate_fleet(_fleet(True), "jsq", W, poisson_times(W, 80.0, 6.0, seed=1, prompts=True))
    off = simulate_fleet(_fleet(False), "jsq", W, poisson_times(W, 80.0, 6.0, seed=1))
    assert on.path == "event" and on.fleet.in_system_end < off.fleet.in_system_end
    # arrivals without the prompts of a workload with a prefix law would share nothing: refused
    with pytest.raises(InvalidArgument, match="carry no prompts"):
        simulate_fleet(_fleet(True), "round-robin", W, poisson_times(W, 20.0, 10.0, seed=0))
    with pytest.raises(InvalidArgument, match="routes by the prompts' content"):
        simulate_fleet(_fleet(False), "prefix-affinity", W, poisson_times(W, 20.0, 10.0, seed=0))


def test_fleet_simulate_defaults_as_each_replicas_engine_and_says_mu_is_no_sharing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["fleet", "simulate", "--workload", SHARED, "--lambda", "80", "--horizon", "30"]
    assert main([*base, "--replica", REPLICA, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prefix_caching_replicas"] == ["0:vllm-v1", "1:vllm-v1"]  # vllm-v1 caches, as vLLM by default
    assert data["measured_over_mu"] > 1 and "no-sharing formula" in data["prefix_caching_note"]
    assert main([*base, "--replica", REPLICA.replace("vllm-v1", "current-fit"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prefix_caching_replicas"] == [] and data["prefix_caching_note"] is None
    assert main([*base, "--replica", REPLICA]) == 0
    text = capsys.readouterr().out
    assert "each on its own block pool" in text and "no-sharing formula" in text and "measured/Σμ" in text
    # a state-dependent router with caching runs on the event loop
    assert main([*base, "--replica", REPLICA, "--router", "jsq", "--horizon", "10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["path"] == "event" and data["prefix_caching_replicas"] == ["0:vllm-v1", "1:vllm-v1"]
    assert main([*base, "--replica", REPLICA.replace("vllm-v1", "sglang"), "--prefix-caching", "on"]) == 2
    # an sglang replica's cache is SGLang's radix cache, which the replicas do not run: refused, never run on
    # vLLM's pool in its place (the static path and the event loop alike)
    capsys.readouterr()
    for router in ("round-robin", "jsq"):
        argv = [*base, "--replica", REPLICA.replace("vllm-v1", "sglang").replace("block=4", "block=1"),
                "--router", router, "--prefix-caching", "on"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "radix cache" in err and "--prefix-caching off" in err and len(err.splitlines()) == 1, err


def test_a_plan_is_verified_with_caching_and_measures_above_its_no_sharing_capacity() -> None:
    gpu = GpuType("small", M=480, bbar=0.05, cost_per_hour=1.0, available=4, chunk=16, block=4, scheduler="vllm-v1")
    plan = solve_plan([gpu], W, 60.0, 0.8)
    ver = verify_plan(plan, W, horizon_s=30.0, caching=lambda _spec: True)
    assert ver.prefix_caching and ver.measured_over_planned > 1.3, ver.as_dict()
    assert ver.as_dict()["prefix_caching_replicas"] == list(ver.prefix_caching)
    plain = verify_plan(plan, W, horizon_s=30.0)
    assert not plain.prefix_caching and plain.measured_over_planned < 1.05


def test_kvstab_plan_takes_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--lambda", "30", "--workload", "paper-1:1", "--no-verify", "--prefix-caching", "on"]) == 0
    assert "kvstab plan" in capsys.readouterr().out


def test_fleet_critical_with_caching_overloads_past_the_no_sharing_theory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "critical", "--replica", REPLICA, "--workload", SHARED, "--horizon", "30", "--seeds", "2",
                 "--tolerance", "0.1", "--quiet", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # shared blocks serve about 3× the no-sharing Σμ, and the saturated run is taken above what the fleet kept up with
    assert data["critical_rate_per_s"] > 2 * data["theory_critical_per_s"]
    assert data["measured_over_mu"] > 2
    assert any("no-sharing μ" in n for n in data["notes"])


def test_a_plan_with_caching_sizes_with_mu_with_sharing_and_the_fleet_carries_it() -> None:
    gpu = GpuType("small", M=480, bbar=0.05, cost_per_hour=1.0, available=6, chunk=16, block=4, scheduler="vllm-v1")
    paper = solve_plan([gpu], W, 60.0, 0.8)
    shared = solve_plan([gpu], W, 60.0, 0.8, caching=lambda _spec: True)
    assert shared.sharing == (True,) and paper.sharing == (False,)
    assert shared.mus[0] > 1.3 * paper.mus[0] and sum(shared.counts) < sum(paper.counts)
    assert shared.as_dict()["types"][0]["mu_basis"] == "sharing"
    # fewer replicas, sized on μ with sharing, still carry λ with a positive measured margin
    ver = verify_plan(shared, W, horizon_s=30.0, caching=lambda _spec: True)
    assert ver.stable and ver.margin > 0, ver.as_dict()
    assert 0.85 < ver.measured_over_planned < 1.25, ver.as_dict()
