"""The public strategies reach the adversarial corners and stay valid.

``hypothesis.find`` searches each strategy for an example of one corner; a
strategy that cannot produce it fails here (with ``NoSuchExample``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan
from kvstab.model import ModelParams, Request, tokens_held
from kvstab.testing.strategies import (
    arrivals,
    largest_total,
    model_params,
    packed_arrivals,
    request_lengths,
    scenarios,
    windows,
    workloads,
)
from kvstab.workload import Geometric, Workload

#: a self-test of the suite: deselected when auditing one scheduler (``--scheduler``)
pytestmark = pytest.mark.kvstab_selftest

PARAMS = ModelParams(M=200, chunk=16)
TOP = largest_total(PARAMS)
SEARCH = settings(max_examples=300, database=None, derandomize=True)


@given(scenario=scenarios(max_M=300, max_num_seqs=True))
def test_every_drawn_request_fits_its_server(scenario: tuple) -> None:
    params, plan = scenario
    assert len(plan) >= 1
    assert np.all(np.diff(plan.slot) >= 0) and plan.slot[0] >= 0
    peaks = [int(tokens_held(int(s + o), params.block)) for s, o in zip(plan.s, plan.o)]
    assert max(peaks) <= params.M and min(plan.s) >= 1 and min(plan.o) >= 1


@given(data=st.data(), lo=st.integers(1, 20), top=st.integers(40, TOP))
def test_request_lengths_respect_their_bounds(data: st.DataObject, lo: int, top: int) -> None:
    r = data.draw(request_lengths(PARAMS, min_value=lo, max_value=top))
    assert r.s >= lo and r.o >= lo and r.s + r.o <= top


def corner(strategy: st.SearchStrategy, condition) -> object:  # noqa: ANN001
    return find(strategy, condition, settings=SEARCH)


def test_request_lengths_reach_the_corners() -> None:
    req = request_lengths(PARAMS)
    corner(req, lambda r: r.s + r.o == TOP)  # one request fills the server
    corner(req, lambda r: TOP - 2 <= r.s + r.o < TOP and r.s > 1 and r.o > 1)
    corner(req, lambda r: r.o == 1 and r.s > PARAMS.chunk)
    corner(req, lambda r: r.s == 1 and r.o > 10)
    corner(req, lambda r: r.s > PARAMS.chunk and r.s % PARAMS.chunk in (1, PARAMS.chunk - 1))
    corner(req, lambda r: r.s >= TOP // 4 and abs(r.o - r.s) <= 1)  # strongly correlated, both long
    # heavy tail: lengths spread over orders of magnitude in one workload
    corner(st.lists(req, min_size=8, max_size=8), lambda rs: min(r.s for r in rs) <= 2 and max(r.s for r in rs) >= 64)


def test_arrivals_reach_bursts_and_gaps() -> None:
    plans = arrivals(PARAMS, max_size=8)
    corner(plans, lambda p: len(p) >= 4 and np.bincount(p.slot).max() >= 4)  # a burst
    corner(plans, lambda p: len(p) >= 2 and np.diff(p.slot).max() >= 20)  # an empty gap
    corner(plans, lambda p: len(p) >= 2 and int((p.s + p.o).max()) == TOP and np.bincount(p.slot).max() >= 2)


def test_workloads_reach_bimodal_heavy_and_correlated_laws() -> None:
    laws = workloads(PARAMS)
    corner(laws, lambda w: isinstance(w.o, Geometric) or isinstance(w.s, Geometric))  # heavy right tail

    def joint(w: Workload) -> tuple[np.ndarray, np.ndarray] | None:
        if w.independent or w.joint_s is None or w.joint_o is None:
            return None
        return np.asarray(w.joint_s, dtype=float), np.asarray(w.joint_o, dtype=float)

    def bimodal(w: Workload) -> bool:
        rows = joint(w)
        return rows is not None and len(set(zip(*rows))) == 2 and rows[0].max() - rows[0].min() >= 50

    corner(laws, bimodal)

    def correlated(w: Workload) -> bool:
        rows = joint(w)
        if rows is None or rows[0].size < 5 or np.std(rows[0]) == 0 or np.std(rows[1]) == 0:
            return False
        return float(np.corrcoef(rows[0], rows[1])[0, 1]) > 0.9

    corner(laws, correlated)


@given(law=workloads(PARAMS))
def test_workload_support_fits_the_server(law: Workload) -> None:
    assert law.max_total <= TOP
    s, o = law.sample(np.random.default_rng(0), 50)
    assert s.min() >= 1 and o.min() >= 1 and int((s + o).max()) <= TOP
    assert all(isinstance(Request(int(a), int(b)), Request) for a, b in zip(s[:3], o[:3]))


def test_packed_arrivals_meet_M_and_finish_together() -> None:
    """Sets whose peaks sum to exactly M + 1 (or M, M − 1) and that finish in one slot;
    with blocks, block-rounded peaks one block over M with a peak one token past a block."""
    def finish_together(p: ArrivalPlan, chunk: int) -> bool:
        return len(set(np.asarray(p.slot) + -(-np.asarray(p.s) // chunk) + np.asarray(p.o))) == 1

    for total in (TOP + 1, TOP, TOP - 1):
        corner(packed_arrivals(PARAMS), lambda p, t=total: len(p) >= 2 and int((p.s + p.o).sum()) == t
               and finish_together(p, PARAMS.chunk))
    blocked = ModelParams(M=64, chunk=8, block=4)

    def over_by_a_block(p: ArrivalPlan) -> bool:
        held = [int(tokens_held(int(a + b), 4)) for a, b in zip(p.s, p.o)]
        return sum(held) == 68 and any(int(a + b) % 4 == 1 for a, b in zip(p.s, p.o)) and finish_together(p, 8)

    corner(packed_arrivals(blocked), over_by_a_block)
    # first chunks that sum to M exactly
    corner(packed_arrivals(ModelParams(M=24, chunk=8)),
           lambda p: len(p) == 3 and int(np.minimum(p.s, 8).sum()) == 24)


def test_windows_reach_short_windows_and_the_default() -> None:
    corner(windows(), lambda w: w == 1)
    corner(windows(), lambda w: w == 8)


@given(data=st.data())
def test_packed_arrivals_fit_their_server(data: st.DataObject) -> None:
    params = data.draw(model_params(max_M=300))
    plan = data.draw(packed_arrivals(params))
    assert 1 <= len(plan) <= 4 and np.all(np.diff(plan.slot) >= 0)
    assert max(int(tokens_held(int(a + b), params.block)) for a, b in zip(plan.s, plan.o)) <= params.M
    assert min(plan.s) >= 1 and min(plan.o) >= 1
