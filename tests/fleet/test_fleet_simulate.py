"""The fleet simulator: both paths agree request by request, routers route as documented."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan
from kvstab.errors import InvalidArgument
from kvstab.fleet import Replica, load_router, poisson_times, simulate_fleet
from kvstab.fleet.routers import ReplicaInfo, register_router
from kvstab.fleet.simulate import replica_infos
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import simulate

sys.path.insert(0, str(Path(__file__).parent))
from _fleet_support import PARAMS, WORKLOAD, two_speed_fleet  # noqa: E402


@pytest.mark.parametrize("router", ["round-robin", "random:0.92,0.08", "weighted-rr"])  # 0.92: the compiled tables grow
def test_static_and_event_paths_agree_request_by_request(router: str) -> None:
    """The fast engine per replica and the event loop over reference engines give
    the same finish time to every request (heterogeneous M, b̄ and schedulers)."""
    fleet = [
        Replica(ModelParams(M=150, chunk=4, bbar=0.01), "current-fit"),
        Replica(ModelParams(M=220, chunk=3, block=2, bbar=0.017), "vllm-v1"),
    ]
    arr = poisson_times(WORKLOAD, 500.0, 8.0, seed=3)
    a = simulate_fleet(fleet, router, WORKLOAD, arr, seed=5)
    b = simulate_fleet(fleet, router, WORKLOAD, arr, seed=5, path="event", compiled=False)
    c = simulate_fleet(fleet, router, WORKLOAD, arr, seed=5, path="event")  # on compiled replicas
    assert a.path == "static" and b.path == c.path == "event"
    assert {r.engine for r in a.replicas} == {"fast"} and {r.engine for r in b.replicas} == {"reference"}
    assert {r.engine for r in c.replicas} == {"fast"} and "compiled replicas" in c.path_text
    for x, y, z in zip(a.replicas, b.replicas, c.replicas):
        assert np.array_equal(x.request_ids, y.request_ids) and np.array_equal(x.request_ids, z.request_ids)
        assert np.array_equal(x.finish_s, y.finish_s, equal_nan=True)
        assert np.array_equal(x.finish_s, z.finish_s, equal_nan=True)
        assert x.stats.as_dict() == y.stats.as_dict() == z.stats.as_dict()
    assert sum(r.stats.arrived for r in a.replicas) == a.fleet.arrived == len(arr)
    assert np.array_equal(a.waiting, b.waiting) and np.array_equal(a.in_system, b.in_system)
    assert np.array_equal(a.waiting, c.waiting) and np.array_equal(a.in_system, c.in_system)
    assert np.all(a.waiting <= a.in_system) and a.waiting.max() > 0


def test_one_replica_is_the_single_server_model() -> None:
    """A fleet of one replica is the reference simulator on the arrivals mapped to slots."""
    rep = Replica(replace(PARAMS, bbar=0.02), "current-fit")
    arr = poisson_times(WORKLOAD, 150.0, 6.0, seed=1)
    res = simulate_fleet([rep], "jsq", WORKLOAD, arr)
    slots = int(np.ceil(6.0 / 0.02))
    plan = ArrivalPlan(np.floor(arr.time / 0.02).astype(np.int64), arr.s, arr.o)
    ref = simulate(load_scheduler("current-fit"), PARAMS, plan, slots)
    fin = np.where(ref.finish >= 0, (ref.finish + 1) * 0.02, np.nan)
    assert np.array_equal(res.replicas[0].finish_s, fin, equal_nan=True)


def test_routers_split_as_documented() -> None:
    infos, _ = replica_infos(two_speed_fleet(), WORKLOAD)
    rng = np.random.default_rng(0)
    n = 30_000
    rr = load_router("round-robin").assign(n, infos, rng)
    assert np.array_equal(rr[:4], [0, 1, 0, 1])
    wrr = load_router("weighted-rr").assign(n, infos, rng)  # ∝ μ: 2/3, 1/3
    assert abs(float(np.mean(wrr == 0)) - 2 / 3) < 1e-4
    # smooth: after k requests replica i has k·p_i within (1 + N·p_i)/2 (the sorted due
    # times (j + ½)/p_i give c_i = ⌊T·p_i + ½⌋ at the k-th due time T, and Σ c_i = k)
    for trial in range(20):
        N = int(rng.integers(2, 7))
        w = rng.uniform(0.05, 1.0, N)
        p = w / w.sum()
        many = [ReplicaInfo(i, 1.0, ModelParams(M=10, chunk=4, bbar=0.1), 1.0) for i in range(N)]
        got = load_router("weighted-rr:" + ",".join(repr(float(x)) for x in w)).assign(3000, many, rng)
        k = np.arange(1, 3001)
        for i in range(N):
            assert np.all(np.abs(np.cumsum(got == i) - k * p[i]) < (1 + N * p[i]) / 2 + 1e-9), (trial, i)
    rnd = load_router("random:1,3").assign(n, infos, rng)
    share = float(np.mean(rnd == 1))
    half = 4 * np.sqrt(0.75 * 0.25 / n)
    assert abs(share - 0.75) < half


def test_state_dependent_routers_choose_from_state() -> None:
    from kvstab.fleet.routers import ReplicaState

    infos, _ = replica_infos(two_speed_fleet(), WORKLOAD)
    rng = np.random.default_rng(0)
    busy = ReplicaState(infos[0], waiting=3, running=4, kv_in_use=140, served_area=0)
    calm = ReplicaState(infos[1], waiting=0, running=4, kv_in_use=20, served_area=0)
    assert load_router("jsq").choose([busy, calm], rng) == 1
    assert load_router("least-kv").choose([busy, calm], rng) == 1
    assert load_router("power-of-d:2").choose([busy, calm], rng) == 1
    # the fast replica (μ_0 = 2μ_1) holding 5 drains sooner than the slow one holding 3
    a = ReplicaState(infos[0], waiting=1, running=4, kv_in_use=0, served_area=0)
    b = ReplicaState(infos[1], waiting=0, running=3, kv_in_use=0, served_area=0)
    assert load_router("kv-aware").choose([a, b], rng) == 0
    assert load_router("jsq").choose([a, b], rng) == 1


def test_bad_routers_and_fleets_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidArgument, match="unknown router"):
        load_router("shortest")
    with pytest.raises(InvalidArgument, match="takes no argument"):
        load_router("jsq:3")
    with pytest.raises(InvalidArgument, match="2 shares for 1 replicas|shares for"):
        load_router("random:1,1").assign(5, [ReplicaInfo(0, 1.0, ModelParams(M=10, chunk=4, bbar=0.1), 5.0)], np.random.default_rng(0))
    with pytest.raises(InvalidArgument, match="already registered"):
        register_router("jsq", lambda arg: None)
    with pytest.raises(InvalidArgument, match="at least one replica"):
        simulate_fleet([], "round-robin", WORKLOAD, poisson_times(WORKLOAD, 1.0, 1.0))
    big = Replica(ModelParams(M=10, chunk=4, bbar=0.01))
    with pytest.raises(InvalidArgument, match="replica 0"):
        simulate_fleet([big], "round-robin", WORKLOAD, poisson_times(WORKLOAD, 1.0, 1.0))
    # a plug-in router by module:attr, and one of the wrong shape
    (tmp_path / "myrouters.py").write_text(
        "from dataclasses import dataclass\n"
        "@dataclass(frozen=True)\n"
        "class First:\n"
        "    name: str = 'first'\n"
        "    state_dependent: bool = True\n"
        "    def choose(self, states, rng):\n"
        "        return 0\n"
        "def make(arg):\n"
        "    return First()\n"
        "def broken(arg):\n"
        "    return object()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    res = simulate_fleet(two_speed_fleet(), load_router("myrouters:make"), WORKLOAD, poisson_times(WORKLOAD, 50.0, 2.0))
    assert res.replicas[1].stats.arrived == 0 and res.path == "event"
    with pytest.raises(InvalidArgument, match="is not a router"):
        load_router("myrouters:broken")


def test_arrivals_on_slot_boundaries_map_alike_on_both_paths() -> None:
    """``t = 1.0`` s with ``b̄ = 0.1`` is slot 10 (``1.0 // 0.1`` is 9.0 in floating point)."""
    from kvstab.fleet.arrivals import FleetArrivals

    times = np.asarray([0.3, 0.7, 1.0, 1.0, 2.3, 2.9], dtype=np.float64)
    arr = FleetArrivals(times, np.full(6, 3, dtype=np.int64), np.full(6, 2, dtype=np.int64), 4.0)
    fleet = [Replica(ModelParams(M=20, chunk=4, bbar=0.1))]
    a = simulate_fleet(fleet, "round-robin", WORKLOAD, arr)
    b = simulate_fleet(fleet, "round-robin", WORKLOAD, arr, path="event")
    assert np.array_equal(a.replicas[0].finish_s, b.replicas[0].finish_s)


def test_entry_point_routers_are_found_and_a_broken_one_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvstab.fleet.routers as routers

    (tmp_path / "eprouters.py").write_text(
        "from kvstab.fleet.routers import RoundRobin\n"
        "def make(arg):\n"
        "    return RoundRobin(name='ep-rr')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    class EP:
        def __init__(self, name: str, value: str) -> None:
            self.name, self.value = name, value

    eps = [EP("ep-rr", "eprouters:make"), EP("jsq", "eprouters:make"), EP("gone", "no_such_module_x:make")]
    monkeypatch.setattr(routers, "entry_points", lambda group: eps if group == routers.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(routers, "_REGISTRY", None)
    assert load_router("ep-rr").name == "ep-rr"
    err = capsys.readouterr().err
    assert "skipped router entry point 'jsq'" in err and "already registered" in err and "'gone'" in err
    with pytest.raises(InvalidArgument, match="no_such_module_x"):
        load_router("gone")
    assert "jsq" in routers.router_names() and load_router("jsq").state_dependent


def test_the_docs_list_every_built_in_router() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "fleet.md").read_text(encoding="utf-8")
    from kvstab.fleet import router_names

    for name in router_names():
        assert f"| `{name}" in text, name


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(1, 3),
    router=st.sampled_from(["round-robin", "random", "weighted-rr:mu", "random:mu"]),
    rate=st.floats(50.0, 600.0),
    seed=st.integers(0, 2**16),
)
def test_both_paths_agree_on_random_fleets(data: st.DataObject, n: int, router: str, rate: float, seed: int) -> None:
    """Any small heterogeneous fleet, any static router: the fast engine per replica and
    the event loop give every request the same finish time."""
    fleet = []
    for _ in range(n):
        M = data.draw(st.integers(16, 200), label="M")
        block = data.draw(st.sampled_from([1, 2, 4]), label="block")
        chunk = data.draw(st.integers(1, 8), label="chunk")
        bbar = data.draw(st.sampled_from([0.005, 0.01, 0.013, 0.02, 0.1]), label="bbar")
        params = ModelParams(M=max(M, 16 + block), chunk=chunk, block=block, bbar=bbar)
        sched = data.draw(st.sampled_from(["current-fit", "vllm-v1", "reserve", "lookahead"]), label="scheduler")
        fleet.append(Replica(params, sched))
    arr = poisson_times(WORKLOAD, rate, 2.0, seed=seed)
    a = simulate_fleet(fleet, router, WORKLOAD, arr, seed=seed)
    compiled = data.draw(st.booleans(), label="compiled event loop")
    b = simulate_fleet(fleet, router, WORKLOAD, arr, seed=seed, path="event", compiled=compiled)
    for x, y in zip(a.replicas, b.replicas):
        assert np.array_equal(x.request_ids, y.request_ids)
        assert np.array_equal(x.finish_s, y.finish_s, equal_nan=True)
    assert np.array_equal(a.waiting, b.waiting)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 4), rate=st.floats(50.0, 900.0), seed=st.integers(0, 2**16))
def test_jsq_on_compiled_replicas_is_the_reference_event_loop(data: st.DataObject, n: int, rate: float,
                                                              seed: int) -> None:
    """JSQ routed inside the compiled loop sends every request where the reference loop does (ties
    broken by the same stream) and every replica finishes it at the same time, overloaded or not."""
    fleet = []
    for _ in range(n):
        block = data.draw(st.sampled_from([1, 2, 4]), label="block")
        sched = data.draw(st.sampled_from(["current-fit", "vllm-v1", "reserve"]), label="scheduler")
        # a token budget only where the rule keeps it (vllm-v1's): the others are caught breaking it
        budget = data.draw(st.sampled_from([None, 6, 12]), label="token budget") if sched == "vllm-v1" else None
        params = ModelParams(M=max(data.draw(st.integers(16, 200), label="M"), 16 + block),
                             chunk=data.draw(st.integers(1, 8), label="chunk"), block=block,
                             bbar=data.draw(st.sampled_from([0.005, 0.01, 0.013, 0.02]), label="bbar"),
                             token_budget=budget)  # fmt: skip
        fleet.append(Replica(params, sched))
    arr = poisson_times(WORKLOAD, rate, 2.0, seed=seed)
    a = simulate_fleet(fleet, "jsq", WORKLOAD, arr, seed=seed)
    b = simulate_fleet(fleet, "jsq", WORKLOAD, arr, seed=seed, compiled=False)
    assert {r.engine for r in a.replicas} == {"fast"} and {r.engine for r in b.replicas} == {"reference"}
    for x, y in zip(a.replicas, b.replicas):
        assert np.array_equal(x.request_ids, y.request_ids)
        assert np.array_equal(x.finish_s, y.finish_s, equal_nan=True)
        assert x.stats.as_dict() == y.stats.as_dict()
    assert np.array_equal(a.waiting, b.waiting) and np.array_equal(a.in_system, b.in_system)
