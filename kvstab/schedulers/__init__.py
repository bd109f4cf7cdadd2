"""Built-in schedulers, one module each: ``current-fit``, ``reserve``,
``lookahead`` and the negative control ``current-fit-no-preempt``."""

from kvstab.schedulers.current_fit import CurrentFit
from kvstab.schedulers.lookahead import Lookahead
from kvstab.schedulers.no_preempt import CurrentFitNoPreempt
from kvstab.schedulers.reserve import Reserve

__all__ = ["CurrentFit", "Reserve", "Lookahead", "CurrentFitNoPreempt"]
