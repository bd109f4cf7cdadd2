"""The arrival rate a scheduler is *certified* stable below, and why.

The paper's guarantee ``μ(1 − δ)`` rests on a drift argument whose premise is
a policy that never preempts and keeps memory at least ``M − Δ`` busy whenever
requests wait.  This module says, per scheduler, whether that premise holds and
which rate it certifies (``μ(1 − Δ/M)`` with the scheduler's margin ``Δ``), so
no command prints the paper's rate as a guarantee for a policy it does not
cover.
"""

from __future__ import annotations

from typing import Any

from kvstab.contract import traits_of

__all__ = ["policy_guarantee"]


def policy_guarantee(scheduler: Any, params: Any, workload: Any, mu_per_s: float) -> tuple[float | None, str]:
    """The arrival rate below which *this* scheduler is certified stable, and why
    (or ``None`` and why not).

    The drift argument gives ``μ(1 − Δ/M)`` for a policy that does not preempt
    and keeps memory at least ``M − Δ`` busy whenever requests wait (its margin
    ``Δ``).  It certifies nothing for a policy that preempts (the wasted area
    enters the drift), under a running cap or token budget (they can leave
    memory idle), or for a policy whose declared margin is trivial.
    """
    name = getattr(scheduler, "name", "the scheduler")
    traits = traits_of(scheduler)
    if traits.negative_control:
        return None, f"none: {name} is a negative control (it breaks the memory invariant)"
    if traits.preempts:
        return None, f"none certified for {name}: it preempts, and the wasted area enters the drift"
    if params.max_num_seqs is not None or params.token_budget is not None:
        return None, "none certified: a running cap or token budget can leave memory idle while requests wait"
    margin = getattr(scheduler, "margin", None)
    if margin is None:
        return None, f"none certified: {name} declares no margin Δ (kvstab prove --margin establishes one)"
    delta_tokens = int(margin(params, workload.max_s, workload.max_o))
    if delta_tokens >= params.M - 1:
        return None, (
            f"none certified: {name}'s margin is Δ = {delta_tokens} (it admits on future memory, so little "
            "memory may be busy while requests wait)"
        )
    return mu_per_s * (1 - delta_tokens / params.M), f"μ(1 − Δ/M) with {name}'s margin Δ = {delta_tokens}"
