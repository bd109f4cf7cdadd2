"""``kvstab.fleet``: replicas behind a router — simulation, routers, capacity planning.

Start with :func:`simulate_fleet` (a fleet of :class:`Replica` behind a router
from :mod:`kvstab.fleet.routers`), :func:`kvstab.fleet.critical.find_fleet_critical_rate`
(the fleet's critical rate by bisection on the queue growth) and
:func:`kvstab.fleet.plan.solve_plan` / :func:`kvstab.fleet.plan.verify_plan`
(the cheapest fleet from a GPU menu, by a mixed-integer program, verified by
simulation).  The theory these are checked against is :mod:`kvstab.theory.fleet`.
See ``docs/fleet.md``.
"""

from kvstab.fleet.arrivals import FleetArrivals, peak_window, piecewise_poisson, poisson_times, window_rates
from kvstab.fleet.routers import ReplicaInfo, ReplicaState, load_router, register_router, router_names
from kvstab.fleet.simulate import FleetResult, Replica, ReplicaResult, Stats, simulate_fleet

__all__ = [
    "FleetArrivals",
    "poisson_times",
    "piecewise_poisson",
    "window_rates",
    "peak_window",
    "ReplicaInfo",
    "ReplicaState",
    "load_router",
    "register_router",
    "router_names",
    "Replica",
    "ReplicaResult",
    "Stats",
    "FleetResult",
    "simulate_fleet",
]
