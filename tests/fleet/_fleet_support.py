"""A small heterogeneous fleet shared by the fleet tests: two replicas of one
server, replica 0 stepping twice as fast (``b̄_0 = b̄_1/2``), so ``μ_0 = 2μ_1``
exactly (``E[g]`` does not depend on ``b̄``)."""

from __future__ import annotations

from dataclasses import replace

from kvstab.fleet import Replica
from kvstab.model import ModelParams
from kvstab.workload import parse_workload

WORKLOAD = parse_workload("s=U(1,8),o=U(1,8)")
PARAMS = ModelParams(M=150, chunk=4)
FAST, SLOW = 0.01, 0.02


def two_speed_fleet(scheduler: str = "current-fit") -> list[Replica]:
    """``μ_0 = 2μ_1``."""
    return [
        Replica(replace(PARAMS, bbar=FAST), scheduler, "fast"),
        Replica(replace(PARAMS, bbar=SLOW), scheduler, "slow"),
    ]
