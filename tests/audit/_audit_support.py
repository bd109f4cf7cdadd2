"""Helpers of the audit tests: a lean profile, a small server, a policy that idles at 3M/4."""

from __future__ import annotations

import dataclasses

from kvstab.audit.profiles import PROFILES, AuditProfile
from kvstab.contract import Decision, Traits, View
from kvstab.ops import Ops
from kvstab.schedulers.current_fit import CurrentFit

#: the dev profile without the curves around λ*: the estimator tests need only λ*
LEAN: AuditProfile = dataclasses.replace(PROFILES["dev"], grid=())

#: a small server and workload: peaks ≤ 32 tokens, M = 240
SMALL = ["--M", "240", "--chunk", "8", "--bbar", "0.05", "--workload", "s=U(1,16),o=U(1,16)"]


@dataclasses.dataclass(frozen=True, slots=True)
class IdlesAtThreeQuarters:
    """Current fit on three quarters of ``M``: a quarter of the memory always idles,
    so no rate above ``μ(3M/4) = 0.75·μ`` can be sustained."""

    name: str = "idles-at-three-quarters"
    description: str = "current fit, admitting and preempting as if M were 3M/4"
    traits: Traits = Traits(fcfs=True, work_conserving=False, clairvoyant=False, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        return CurrentFit().decide(dataclasses.replace(view, M=view.M * 3 // 4), ops)


