"""Request lifecycles of real servers, written as kvstab's reference engine with its extension points.

kvstab's own lifecycle is :class:`kvstab.simulator.Engine` (a preempted request
restarts from scratch); :mod:`kvstab.lifecycles.vllm` gives vLLM v1's
(:class:`~kvstab.lifecycles.vllm.VllmEngine`) and :mod:`kvstab.lifecycles.sglang`
SGLang's (:class:`~kvstab.lifecycles.sglang.SglangEngine`).  They sit in the
core so that both the fast engine (:mod:`kvstab.engine`), which reproduces
them, and the cross-checks against the real schedulers (:mod:`kvstab.empirical`)
can import them.
"""

from kvstab.lifecycles.sglang import SglangEngine
from kvstab.lifecycles.vllm import VllmEngine

__all__ = ["VllmEngine", "SglangEngine"]
