"""The arrival rate a scheduler is *certified* stable below, and why.

The paper's guarantee ``μ(1 − δ)`` rests on a drift argument whose premise is
a policy that never preempts and keeps memory at least ``M − Δ`` busy whenever
requests wait.  This module says, per scheduler, whether that premise holds and
which rate it certifies (``μ(1 − Δ/M)`` with the scheduler's margin ``Δ``), so
no command prints the paper's rate as a guarantee for a policy it does not
cover.  It is the one place the certified rate is computed: ``kvstab
simulate`` and ``kvstab prove`` both call :func:`policy_guarantee`.
"""

from __future__ import annotations

from typing import Protocol

from kvstab.contract import Scheduler, traits_of
from kvstab.model import ModelParams
from kvstab.workload import Workload

__all__ = ["policy_guarantee", "Margin"]


class Margin(Protocol):
    """A scheduler's declared work-conservation margin ``Δ`` (tokens)."""

    def __call__(self, params: ModelParams, max_s: int, max_o: int) -> int: ...


def policy_guarantee(
    scheduler: Scheduler,
    params: ModelParams,
    workload: Workload,
    mu_per_s: float,
    *,
    proved_margin: int | None = None,
) -> tuple[float | None, str]:
    """The arrival rate below which *this* scheduler is certified stable, and why
    (or ``None`` and why not).

    The drift argument gives ``μ(1 − Δ/M)`` for a policy that does not preempt
    and keeps memory at least ``M − Δ`` busy whenever requests wait (its margin
    ``Δ``).  It certifies nothing for a policy that preempts (the wasted area
    enters the drift), under a running cap or token budget (they can leave
    memory idle), or for a policy whose margin is trivial (``Δ ≥ M − 1``).

    ``proved_margin`` (``kvstab prove --margin``'s ``Δ``) is used instead of the
    declared margin when given; a declared margin *smaller* than the proved
    one is a claim the proof contradicts, and the reason says so.
    """
    name = scheduler.name
    traits = traits_of(scheduler)
    if traits.negative_control:
        return None, f"none: {name} is a negative control (it breaks the memory invariant)"
    if traits.preempts:
        return None, f"none certified for {name}: it preempts, and the wasted area enters the drift"
    if params.max_num_seqs is not None or params.token_budget is not None:
        return None, "none certified: a running cap or token budget can leave memory idle while requests wait"
    margin: Margin | None = getattr(scheduler, "margin", None)  # optional by the contract (see Scheduler)
    declared = None if margin is None else int(margin(params, workload.max_s, workload.max_o))
    if proved_margin is not None:
        delta_tokens, source = int(proved_margin), "proved"
    elif declared is not None:
        delta_tokens, source = declared, "declared"
    else:
        return None, f"none certified: {name} declares no margin Δ (kvstab prove --margin establishes one)"
    contradiction = ""
    if proved_margin is not None and declared is not None and declared < proved_margin:
        contradiction = f"; its declared Δ = {declared} is smaller than the proved one, so the declaration is wrong"
    if delta_tokens >= params.M - 1:
        return None, (
            f"none certified: {name}'s {source} margin is Δ = {delta_tokens} (it admits on future memory, so little "
            f"memory may be busy while requests wait){contradiction}"
        )
    return (
        mu_per_s * (1 - delta_tokens / params.M),
        f"μ(1 − Δ/M) with {name}'s {source} margin Δ = {delta_tokens}{contradiction}",
    )
