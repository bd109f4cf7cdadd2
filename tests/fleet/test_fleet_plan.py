"""`kvstab plan`'s program: small MILPs against brute force, verification by simulation, menus."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvstab.errors import InvalidArgument
from kvstab.fleet.plan import SLO, GpuType, example_menu_path, load_menu, solve_plan, verify_plan
from kvstab.workload import parse_workload

W = parse_workload("s=U(1,8),o=U(1,8)")


def _menu(rng: np.random.Generator, k: int) -> list[GpuType]:
    return [
        GpuType(f"g{i}", M=int(rng.integers(60, 400)), bbar=float(rng.uniform(0.005, 0.05)),
                cost_per_hour=float(rng.integers(1, 9)), available=int(rng.integers(0, 5)), chunk=4)
        for i in range(k)
    ]  # fmt: skip


def _brute(menu: list[GpuType], rates: list[float], lam: float, rho: float) -> float | None:
    best = None
    for counts in itertools.product(*(range(g.available + 1) for g in menu)):
        if rho * sum(n * r for n, r in zip(counts, rates)) >= lam * (1 - 1e-9):
            cost = sum(n * g.cost_per_hour for n, g in zip(counts, menu))
            best = cost if best is None or cost < best else best
    return best


@pytest.mark.parametrize("seed", range(12))
def test_small_milps_match_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    menu = _menu(rng, int(rng.integers(1, 4)))
    rho = float(rng.choice([0.5, 0.8, 1.0]))
    probe = solve_plan(menu, W, 1.0, 1.0) if sum(g.available for g in menu) else None
    if probe is None:
        with pytest.raises(InvalidArgument, match="available"):
            solve_plan(menu, W, 1.0, rho)
        return
    total = sum(g.available * m for g, m in zip(menu, probe.mus))
    lam = float(rng.uniform(0.05, 1.2)) * rho * total
    best = _brute(menu, list(probe.mus), lam, rho)
    if best is None:
        with pytest.raises(InvalidArgument, match="available"):
            solve_plan(menu, W, lam, rho)
        return
    plan = solve_plan(menu, W, lam, rho)
    assert plan.cost_per_hour == pytest.approx(best)
    # the plan keeps every replica at or below ρ·μ and routes all of λ
    assert sum(plan.flows) == pytest.approx(lam)
    for n, x, m, g in zip(plan.counts, plan.flows, plan.mus, menu):
        assert 0 <= n <= g.available
        assert x <= rho * m * n * (1 + 1e-9)
    assert sum(plan.replica_split()) == pytest.approx(1.0)


def test_a_known_optimum() -> None:
    """Two types, one twice the other's μ at 1.5× the price: the cheap mix is known."""
    small = GpuType("small", M=150, bbar=0.02, cost_per_hour=2.0, available=10, chunk=4)
    big = replace(small, name="big", bbar=0.01, cost_per_hour=3.0, available=1)
    plan = solve_plan([small, big], W, 1.0, 1.0)
    mu = plan.mus[0]
    assert plan.mus[1] == pytest.approx(2 * mu)
    # λ = 3.5 μ: the big one (2 μ for 3) and two small (2 μ for 4) — 7; four small would cost 8
    plan = solve_plan([small, big], W, 3.5 * mu, 1.0)
    assert plan.counts == (2, 1) and plan.cost_per_hour == pytest.approx(7.0)


CERTIFIED = """
from dataclasses import dataclass
from kvstab.contract import Decision, Traits


@dataclass(frozen=True)
class Certified:
    name: str = "certified-double"
    description: str = "a test double: declares a margin, never runs"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=False)

    def margin(self, params, max_s, max_o):
        return 15

    def decide(self, view, ops):
        return Decision(admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active))


SCHEDULER = Certified()
"""


def test_guarantee_plans_on_certified_rates_and_refuses_when_none_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = GpuType("g", M=150, bbar=0.02, cost_per_hour=1.0, available=50, chunk=4)
    mu = solve_plan([g], W, 1.0, 1.0).mus[0]
    lam = 4 * mu  # exactly 4 replicas by μ
    assert solve_plan([g], W, lam, 1.0).counts == (4,)
    # current-fit preempts: nothing is certified, and --guarantee says so instead of planning
    with pytest.raises(InvalidArgument, match="no GPU type of the menu has a certified stable rate.*preempts"):
        solve_plan([g], W, lam, 1.0, guarantee=True)
    # a scheduler certified at μ(1 − Δ/M) = μ·(1 − 15/150): ⌈4/0.9⌉ = 5 replicas
    (tmp_path / "certified_double.py").write_text(CERTIFIED)
    monkeypatch.syspath_prepend(str(tmp_path))
    c = replace(g, scheduler="certified_double:SCHEDULER")
    q = solve_plan([c, g], W, lam, 1.0, guarantee=True)
    assert q.counts == (math.ceil(4 / 0.9), 0)


def test_infeasible_names_the_binding_constraint() -> None:
    g = GpuType("A100-80GB", M=150, bbar=0.02, cost_per_hour=1.0, available=8, chunk=4)
    mu = solve_plan([g], W, 1.0, 1.0).mus[0]
    with pytest.raises(InvalidArgument) as err:
        solve_plan([g], W, 13.5 * mu, 1.0)
    msg = str(err.value)
    assert "\n" not in msg and "14 A100-80GB alone (8 available)" in msg


def test_a_plan_is_verified_by_simulation_and_an_overloaded_one_is_not() -> None:
    small = GpuType("small", M=150, bbar=0.02, cost_per_hour=2.0, available=4, chunk=4)
    big = replace(small, name="big", bbar=0.01, cost_per_hour=3.0, available=2)
    plan = solve_plan([small, big], W, 400.0, 0.8)
    v = verify_plan(plan, W, horizon_s=20.0, slos=[SLO("e2e", "p99", 5.0)])
    assert v.stable and v.passed, v.as_dict()
    # the measured margin sits near the planned 1 − ρ (current-fit saturates a few % below μ)
    assert 0.1 < v.margin < 0.3, v.margin
    # the same fleet at a load above its capacity: the verification fails
    over = replace(plan, lam=1.15 * plan.capacity, flows=tuple(x * 1.15 * plan.capacity / 400.0 for x in plan.flows))
    bad = verify_plan(over, W, horizon_s=20.0)
    assert not bad.stable and not bad.passed
    # an SLO it cannot meet is reported as missed
    tight = verify_plan(plan, W, horizon_s=20.0, slos=[SLO("ttft", "p50", 1e-6)])
    assert tight.stable and not tight.passed and not tight.slo[0][3]


def test_menus_load_from_toml_and_json_and_refuse_bad_entries(tmp_path: Path) -> None:
    menu = load_menu(example_menu_path())
    assert [g.name for g in menu][:1] == ["A100-40GB"] and menu[0].M == 131_000
    # M from memory by vLLM's accounting (kvstab.kv_capacity, as kvstab tune): ⌈80 GiB·0.9⌉ − 15 GiB − the
    # activation/CUDA-graph reserve, in blocks of 1 token of 128 KiB, one of them vLLM's null block
    from kvstab.kv_capacity import ModelShape, vllm_reserve

    reserve = vllm_reserve(ModelShape(131072), 2048, 256)
    assert menu[1].M == (int(80 * 0.9 * 2**30) - 15 * 2**30 - reserve) // 131072 - 1
    j = tmp_path / "m.json"
    j.write_text(json.dumps([{"name": "x", "M": 500, "bbar": 0.02, "cost_per_hour": 1, "available": 2}]))
    assert load_menu(j)[0].available == 2
    cases = {
        '[[gpu]]\nname = "x"\nM = 500\nbbar = 0.02\ncost_per_hour = 1\navailable = 2\ncolour = "red"\n': "unknown key",
        '[[gpu]]\nname = "x"\nM = -5\nbbar = 0.02\ncost_per_hour = 1\navailable = 2\n': "M must be a positive",
        '[[gpu]]\nname = "x"\nbbar = 0.02\ncost_per_hour = 1\navailable = 2\n': "needs M",
        '[[gpu]]\nname = "x"\nM = 500\ncost_per_hour = 1\navailable = 2\n': "bbar",
        '[[gpu]]\nname = "x"\ngpu_memory_gib = 16\nmodel_gib = 15\nkv_bytes_per_token = 131072\nbbar = 0.02\n'
        'cost_per_hour = 1\navailable = 2\n': "does not fit",
        "not toml at all [": "does not parse",
        "": "lists no GPU types",
    }
    for text, why in cases.items():
        p = tmp_path / "bad.toml"
        p.write_text(text)
        with pytest.raises(InvalidArgument, match=why) as err:
            load_menu(p)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("lam", [0.05, 1e-3, 1.0])
def test_a_tiny_load_on_fast_replicas_is_one_cheapest_gpu(lam: float) -> None:
    """μ ~ 10⁵ req/s against λ ~ 10⁻³: the program is scaled so the solver sees it is feasible
    (unscaled, the MILP solver called it infeasible)."""
    menu = load_menu(example_menu_path())
    w = parse_workload("s=U(1,8),o=U(1,8)")
    plan = solve_plan(menu, w, lam, 0.8)
    assert sum(plan.counts) == 1
    assert plan.cost_per_hour == min(g.cost_per_hour for g in menu)
    assert math.isclose(sum(plan.flows), lam)
