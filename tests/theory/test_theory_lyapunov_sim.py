"""The per-slot Lyapunov identity against the reference simulator.

V(t) = Σ_{arrived by t} g − Σ_{slots ≤ t} used + Σ_{slots ≤ t} wasted is the
telescoped identity V′ = V + Σ_arrivals g − used + wasted from V(0) = 0; it
must stay ≥ 0 (it is a remaining area) and return to 0 when the system drains,
and each request's served area must be its g plus what its preemptions wasted.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstab.arrivals import fixed_arrivals
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import simulate
from kvstab.theory.area import g_blocks

requests = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 60), st.integers(1, 40)),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("scheduler", ["current-fit", "reserve"])
@given(reqs=requests, chunk=st.integers(1, 32), block=st.sampled_from([1, 4]))
def test_identity_against_simulator(scheduler: str, reqs: list[tuple[int, int, int]], chunk: int, block: int) -> None:
    params = ModelParams(M=160, chunk=chunk, block=block)  # small M: current-fit preempts
    plan = fixed_arrivals(reqs).fit_to(params, drop_oversize=True)
    if len(plan) == 0:
        return
    res = simulate(load_scheduler(scheduler), params, plan, drain=True)
    g = g_blocks(res.s, res.o, chunk, block)
    assert np.all(res.finish >= 0), "the run must drain"
    # per request: served area = g + wasted area
    np.testing.assert_array_equal(res.served, g + res.request_wasted)
    # per slot: the telescoped identity from V(0) = 0
    arrived_g = np.zeros(res.slots)
    np.add.at(arrived_g, res.arrival, g)
    V = np.cumsum(arrived_g) - np.cumsum(res.memory) + np.cumsum(res.wasted)
    assert V.min() >= 0
    assert V[-1] == 0


def test_identity_with_preemptions() -> None:
    # four requests whose peaks cannot all fit: current-fit admits them on
    # their first chunk and must preempt as decode grows, so area is wasted
    params = ModelParams(M=160, chunk=16, block=1)
    plan = fixed_arrivals([(0, 30, 40)] * 4)
    res = simulate(load_scheduler("current-fit"), params, plan, drain=True)
    assert res.wasted.sum() > 0
    g = g_blocks(res.s, res.o, 16, 1)
    assert res.memory.sum() == g.sum() + res.wasted.sum()
