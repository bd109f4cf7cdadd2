"""Built-in schedulers, one module each: ``current-fit``, ``reserve``,
``lookahead``, ``vllm-v1`` (vLLM 0.33's v1 scheduling rule), ``sglang``
(SGLang 0.5.23's, stateful) and the negative control ``current-fit-no-preempt``."""

from kvstab.schedulers.current_fit import CurrentFit
from kvstab.schedulers.lookahead import Lookahead
from kvstab.schedulers.no_preempt import CurrentFitNoPreempt
from kvstab.schedulers.reserve import Reserve
from kvstab.schedulers.sglang import Sglang
from kvstab.schedulers.vllm_v1 import VllmV1

__all__ = ["CurrentFit", "Reserve", "Lookahead", "CurrentFitNoPreempt", "VllmV1", "Sglang"]
