"""What the mutants share: current-fit's declared attributes and margin."""

from __future__ import annotations

from kvstab.contract import Traits
from kvstab.model import ModelParams
from kvstab.schedulers.current_fit import CurrentFit


class CurrentFitClaims:
    """The claims of ``current-fit`` (FCFS, work-conserving, preempting, its
    margin ``Δ``), which a buggy port of it would still make."""

    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """``current-fit``'s declared margin."""
        return CurrentFit().margin(params, max_s, max_o)
