"""Affinity routing (issue 27): the prefix routers route as documented, and a hot tenant's replica
makes an affinity-routed fleet unstable below Σμ exactly where ``kvstab.fleet.affinity`` says.

The example (docs/fleet.md, "Affinity and the hot tenant"): two replicas of one small server, two
tenants whose prompts start with their own 8-token system prompt, Zipf(log₂3) popularity, so the hot
tenant sends 3/4 of the requests.  A router that keeps each tenant on one replica loads that replica
with ``λ·3/4``: the fleet's critical rate is ``μ/(3/4) = 1.33μ``, a third below ``Σμ = 2μ``, and JSQ
at the same load is stable.  Claims are signs of the queue growth with its 95 % interval against a
fraction of λ (3 % on long static runs, 10 % on the event loop's short ones), never golden numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import sympy as sp

from kvstab.errors import InvalidArgument
from kvstab.fleet.affinity import (
    affinity_condition,
    affinity_critical,
    affinity_critical_rate,
    affinity_symbols,
    class_loads,
    hot_class_loss,
)
from kvstab.fleet.arrivals import poisson_times, trace_rows_poisson
from kvstab.fleet.routers import PromptChains, ReplicaInfo, ReplicaState, RoutedRequest, load_router
from kvstab.fleet.simulate import Replica, replica_infos, simulate_fleet
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, PromptSet
from kvstab.prefix_laws import zipf_weights
from kvstab.traces import Trace
from kvstab.workload import parse_workload

HOT = math.log2(3)  # Zipf exponent giving two tenants the shares 3/4 and 1/4
W = parse_workload(f"s=U(40,48),o=U(4,8),prefix=tenants(2,8,{HOT!r})")
SERVER = ModelParams(M=480, chunk=16, block=4, bbar=0.05)


def _fleet(caching: bool) -> list[Replica]:
    return [Replica(replace(SERVER, prefix_caching=caching), "vllm-v1") for _ in range(2)]


def _growth(res: object, lam: float, frac: float) -> list[str]:
    """Each replica's verdict: 'up' (growth interval above ``frac·λ``), 'flat' (below it) or 'unsure'."""
    out = []
    for r in res.replicas:  # type: ignore[attr-defined]
        e = r.stats.queue_slope
        out.append("up" if e.low > frac * lam else "flat" if e.high < frac * lam else "unsure")
    return out


def test_the_affinity_condition_in_sympy() -> None:
    lam, (mu0, mu1), (L0, L1) = affinity_symbols(2)
    cond = affinity_condition(2)
    at = {lam: 12, mu0: 8, mu1: 8}  # 12 < Σμ = 16
    assert cond.subs({**at, L0: sp.Rational(1, 2), L1: sp.Rational(1, 2)}) == sp.true  # an even split: 6 < 8
    assert cond.subs({**at, L0: sp.Rational(3, 4), L1: sp.Rational(1, 4)}) == sp.false  # the hot replica: 9 > 8
    crit = affinity_critical(2).subs({mu0: 8, mu1: 8, L0: sp.Rational(3, 4), L1: sp.Rational(1, 4)})
    assert crit == sp.Rational(32, 3)
    # below Σμ unless the loads follow the rates
    assert affinity_critical(2).subs({mu0: 8, mu1: 4, L0: sp.Rational(2, 3), L1: sp.Rational(1, 3)}) == 12
    q = sp.Symbol("q", positive=True)
    assert sp.simplify(hot_class_loss(2) - (1 - 1 / (2 * q))) == 0
    assert hot_class_loss(4).subs(q, sp.Rational(1, 4)) == 0
    assert affinity_critical_rate([8.0, 8.0], class_loads([0.75, 0.25], [0, 1], 2)) == pytest.approx(32 / 3)
    assert affinity_critical_rate([8.0, 8.0], class_loads([0.75, 0.25], [1, 1], 2)) == pytest.approx(8.0)
    with pytest.raises(InvalidArgument):
        class_loads([0.5, 0.4], [0, 1], 2)


def test_consistent_hashing_on_a_hot_tenant_is_unstable_below_sum_mu_where_the_theory_says() -> None:
    infos, _ = replica_infos(_fleet(False), W)
    mus = [i.mu for i in infos]
    router = "consistent-hash:block=4"
    # where each tenant goes: every request of a tenant meets on one replica
    probe = poisson_times(W, 50.0, 40.0, seed=9, prompts=True)
    assert probe.prompts is not None
    where = load_router(router).assign(len(probe), infos, np.random.default_rng(0), PromptChains(probe.prompts, len(probe)))
    tenant_of = probe.prompts.content[probe.prompts.offsets[:-1]]
    tenants = np.unique(tenant_of)
    placement = []
    for t in tenants:
        got = np.unique(where[tenant_of == t])
        assert got.size == 1
        placement.append(int(got[0]))
    shares = zipf_weights(2, HOT)
    counts = np.asarray([np.mean(tenant_of == t) for t in tenants])
    order = np.argsort(-counts)  # the hot tenant first, as the Zipf shares are
    loads = class_loads(shares, [placement[i] for i in order], 2)
    lam_star = affinity_critical_rate(mus, loads)
    assert sorted(loads.tolist()) == pytest.approx([0.25, 0.75])  # the tenants sit on different replicas
    assert lam_star == pytest.approx(mus[0] / 0.75) and lam_star < 0.7 * sum(mus)
    hot = int(np.argmax(loads))
    # the static path on the fast engine: long runs are cheap (the small server saturates near 0.9μ, not μ)
    low = simulate_fleet(_fleet(False), router, W, poisson_times(W, 0.7 * lam_star, 400.0, seed=0, prompts=True))
    assert _growth(low, 0.7 * lam_star, 0.03) == ["flat", "flat"]
    lam = 1.2 * lam_star  # 0.8 Σμ
    high = simulate_fleet(_fleet(False), router, W, poisson_times(W, lam, 400.0, seed=0, prompts=True))
    verdict = _growth(high, lam, 0.03)
    assert verdict[hot] == "up" and verdict[1 - hot] == "flat"
    # JSQ at the same load (the event loop: a shorter run, a wider margin)
    jsq = simulate_fleet(_fleet(False), "jsq", W, poisson_times(W, lam, 40.0, seed=0))
    assert jsq.fleet.queue_slope is not None and jsq.fleet.queue_slope.high < 0.1 * lam


def test_pure_prefix_affinity_saturates_the_hot_tenants_replica_and_its_scorers_do_not() -> None:
    infos, _ = replica_infos(_fleet(True), W)
    lam = 0.9 * sum(i.mu for i in infos)
    arr = poisson_times(W, lam, 30.0, seed=0, prompts=True)
    pure = simulate_fleet(_fleet(True), "prefix-affinity:queue=0,kv=0,cap=inf", W, arr)
    assert sorted(_growth(pure, lam, 0.1)) == ["flat", "up"]
    scored = simulate_fleet(_fleet(True), "prefix-affinity", W, arr)
    assert _growth(scored, lam, 0.1) == ["flat", "flat"]


def _states(q: list[int], cached: list[int], M: int = 100) -> list[ReplicaState]:
    p = ModelParams(M=M, chunk=4, bbar=0.1)
    return [ReplicaState(ReplicaInfo(i, 1.0, p, 1.0), qi, 0, 0, 0, c) for i, (qi, c) in enumerate(zip(q, cached))]


def _request(segments: list[tuple[int, int]]) -> RoutedRequest:
    prompt = Prompt(tuple(segments))
    return RoutedRequest(0, prompt.s, PromptChains(PromptSet.from_prompts([prompt]), 1))


def test_the_prefix_routers_route_as_documented() -> None:
    rng = np.random.default_rng(0)
    req = _request([(7, 64), (8, 16)])
    aff = load_router("prefix-affinity")
    assert aff.choose(_states([3, 3, 3], [0, 48, 0]), rng, req) == 1  # the longest cached prefix
    assert aff.choose(_states([70, 3, 3], [48, 0, 0]), rng, req) != 0  # past the load cap of 64
    pure = load_router("prefix-affinity:queue=0,kv=0,cap=inf")
    assert pure.choose(_states([500, 0, 0], [48, 0, 0]), rng, req) == 0
    with pytest.raises(InvalidArgument, match="KEY=VALUE"):
        load_router("prefix-affinity:weight=3")
    # the SGLang router: a new prefix goes to the smallest tree, the next with it follows, imbalance → least loaded
    sg = load_router("sglang-router").bind([s.info for s in _states([0, 0], [0, 0])])
    first = sg.choose(_states([0, 0], [0, 0]), rng, req)
    assert sg.choose(_states([1, 0], [0, 0]), rng, _request([(7, 64), (9, 16)])) == first
    other = sg.choose(_states([1, 1], [0, 0]), rng, _request([(11, 80)]))
    assert other != first  # a prompt the trees do not hold: the smaller tree
    assert sg.choose(_states([40, 0], [0, 0]), rng, req) == 1  # imbalanced: least loaded, whatever the trees
    # consistent hashing: the same first block meets on one replica, and a bad argument is refused
    ch = load_router("consistent-hash:k=1")
    chains = PromptChains(PromptSet.from_prompts([Prompt(((5, 16), (i, 20))) for i in range(100, 140)]), 40)
    infos = [s.info for s in _states([0] * 4, [0] * 4)]
    assert np.unique(ch.assign(40, infos, rng, chains)).size == 1
    with pytest.raises(InvalidArgument, match="positive integer"):
        load_router("consistent-hash:k=0")


def test_trace_rows_keep_their_order_and_prompts() -> None:
    prompts = PromptSet.from_prompts([Prompt(((i, 8),)) for i in range(5)])
    tr = Trace(np.arange(1, 6, dtype=np.int64) * 8, np.ones(5, dtype=np.int64), None, "t", "test", prompts)
    arr = trace_rows_poisson(tr, 2.0, 10.0, seed=1, prompts=True)
    assert arr.prompts is not None and np.all(np.diff(arr.time) >= 0)
    rows = arr.s // 8 - 1
    assert np.all(np.diff(rows) % 5 == 1)  # consecutive rows, wrapping round
    assert [arr.prompts.prompt(i).segments[0][0] for i in range(len(arr))] == rows.tolist()


def test_fleet_critical_takes_a_mooncake_traces_rows_and_hash_ids(tmp_path: object,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from pathlib import Path

    from kvstab.cli import main

    # a Mooncake-format trace: two 512-token blocks shared by every other row, one block of its own
    rows = [{"timestamp": 10 * i, "input_length": 1100, "output_length": 1 + i % 3,
             "hash_ids": [0, 1, 2 + i] if i % 2 else [100 + i, 200 + i, 300 + i]} for i in range(40)]
    path = Path(str(tmp_path)) / "mini.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    args = ["fleet", "critical", "--replica", "count=2,M=1200,chunk=512,block=16,bbar=0.01,scheduler=vllm-v1",
            "--trace", str(path), "--router", "consistent-hash", "--horizon", "2", "--seeds", "2",
            "--tolerance", "0.45", "--quiet", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    # the shared rows meet on one replica: consistent hashing's own critical rate is below Σμ
    assert data["theory_critical_per_s"] < 0.8 * data["mu_total_per_s"]
    assert data["critical_rate_per_s"] > 0
