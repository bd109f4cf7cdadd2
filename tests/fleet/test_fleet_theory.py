"""The fleet theory (``kvstab.theory.fleet``) against simulation.

Two replicas with ``μ_0 = 2μ_1``.  Each claim is checked on the sign of the
queue growth with its batch-means 95 % interval, against a threshold of 3 % of
the arrival rate — never a golden number.  Above a critical rate the growth is
``λ − λ*`` (here ≥ 8 % of λ at the loads chosen); below it, zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvstab.fleet import poisson_times, simulate_fleet
from kvstab.fleet.simulate import replica_infos
from kvstab.metrics import Estimate
from kvstab.theory import critical_rate, optimal_split

sys.path.insert(0, str(Path(__file__).parent))
from _fleet_support import WORKLOAD, two_speed_fleet  # noqa: E402

#: growth above this fraction of λ (interval entirely above) reads as unstable
THRESHOLD = 0.03
#: seconds simulated per run (~15 000–20 000 requests)
HORIZON = 30.0


def _mu_slow() -> float:
    infos, _ = replica_infos(two_speed_fleet(), WORKLOAD)
    assert infos[0].mu == pytest.approx(2 * infos[1].mu, rel=1e-12)
    return infos[1].mu


def _growth(router: str, load: float, seed: int = 0) -> tuple[float, Estimate, list[Estimate]]:
    lam = load * _mu_slow()
    res = simulate_fleet(two_speed_fleet(), router, WORKLOAD, poisson_times(WORKLOAD, lam, HORIZON, seed=seed), seed=seed)
    assert res.fleet.queue_slope is not None
    per = [r.stats.queue_slope for r in res.replicas]
    assert all(p is not None for p in per)
    return lam, res.fleet.queue_slope, per  # type: ignore[return-value]


def _unstable(lam: float, e: Estimate) -> bool:
    return e.low > THRESHOLD * lam


def _stable(lam: float, e: Estimate) -> bool:
    return e.high < THRESHOLD * lam


def test_theory_says_round_robin_is_critical_at_2mu2_and_the_ideal_router_at_3mu2() -> None:
    mu2 = _mu_slow()
    assert critical_rate([2 * mu2, mu2]) == pytest.approx(2 * mu2)
    assert critical_rate([2 * mu2, mu2], optimal_split([2 * mu2, mu2])) == pytest.approx(3 * mu2)


def test_round_robin_turns_unstable_between_below_and_above_2mu2() -> None:
    lam, below, _ = _growth("round-robin", 1.6)
    assert _stable(lam, below), below
    lam, above, per = _growth("round-robin", 2.4)
    assert _unstable(lam, above), above
    # the slow replica is the one that grows (it gets 1.2 μ_1), the fast one does not (0.6 μ_0)
    assert _unstable(lam, per[1]) and _stable(lam, per[0]), per


def test_jsq_stays_stable_past_2mu2_and_turns_unstable_above_3mu2() -> None:
    lam, mid, _ = _growth("jsq", 2.4)
    assert _stable(lam, mid), mid
    lam, above, _ = _growth("jsq", 3.3)
    assert _unstable(lam, above), above


def test_kv_aware_router_is_stable_where_round_robin_is_not() -> None:
    lam, kv, _ = _growth("kv-aware", 2.4)
    assert _stable(lam, kv), kv


@pytest.mark.parametrize(
    ("split", "load", "slow_unstable"),
    [
        # λ·p = (1.6 μ_1, 0.4 μ_1) against (μ_0, μ_1) = (2 μ_1, μ_1): both below, stable
        ("0.8,0.2", 2.0, False),
        # λ·p = (0.8 μ_1, 1.2 μ_1): the slow replica is above its μ_1, the fast one is not
        ("0.4,0.6", 2.0, True),
    ],
)
def test_a_random_split_is_stable_iff_every_lambda_p_i_is_below_mu_i(split: str, load: float, slow_unstable: bool) -> None:
    mu2 = _mu_slow()
    shares = [float(x) for x in split.split(",")]
    theory = critical_rate([2 * mu2, mu2], shares)
    assert (load * mu2 > theory) == slow_unstable
    lam, _, per = _growth(f"random:{split}", load)
    assert _stable(lam, per[0]), per
    assert (_unstable(lam, per[1]) if slow_unstable else _stable(lam, per[1])), per


@pytest.mark.parametrize("router", ["weighted-rr:mu", "random:mu"])
def test_the_split_proportional_to_mu_beats_round_robin(router: str) -> None:
    lam, rr, _ = _growth("round-robin", 2.4, seed=1)
    _, opt, _ = _growth(router, 2.4, seed=1)
    assert _unstable(lam, rr) and _stable(lam, opt), (rr, opt)


def test_the_critical_rate_search_brackets_round_robins_2mu2() -> None:
    """Bisection on the growth finds round-robin's λ* a few % under 2μ_1 (current-fit
    saturates a little below μ), and the saturated throughput agrees with it."""
    from kvstab.fleet.critical import find_fleet_critical_rate

    mu2 = _mu_slow()
    cr = find_fleet_critical_rate(two_speed_fleet(), "round-robin", WORKLOAD, horizon_s=20.0, tolerance=0.02, seeds=3)
    assert cr.theory_rate == pytest.approx(2 * mu2)
    assert cr.resolved and cr.low <= cr.critical <= cr.high
    assert 0.9 * 2 * mu2 < cr.critical < 2 * mu2, (cr.critical / mu2, cr.notes)
    # at the overload 1.2·2μ_1 the fast replica serves all of its λ/2 = 1.2 μ_1 and the
    # slow one its saturated rate, which is λ*/2
    sat = cr.saturated
    assert sat is not None
    assert 1.2 * mu2 + cr.low / 2 - 0.02 * mu2 < sat.value < 1.2 * mu2 + cr.high / 2 + 0.02 * mu2, (sat, cr)
    bad = [e for e in cr.evaluations if e.verdict == "stable" and e.rate > cr.high + cr.threshold]
    assert not bad, bad
