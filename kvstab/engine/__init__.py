"""The fast engine: the reference model's outcomes, slot for slot, at compiled speed.

Start with :func:`run` (any scheduler; says which engine ran), or the drop-ins
:func:`simulate` (for :func:`kvstab.simulator.simulate`) and
:func:`replay_model` (for :func:`kvstab.empirical.replay.replay_model`).
``docs/engine.md`` explains the design and how to add a fast path.
"""

from typing import Any

from kvstab.engine.driver import Run, fast_rule, run, simulate
from kvstab.engine.stream import Summary

__all__ = ["run", "simulate", "Run", "Summary", "fast_rule", "replay_model"]


def __getattr__(name: str) -> Any:
    # the vLLM replay pulls in kvstab.empirical; import it only when asked
    if name == "replay_model":
        from kvstab.engine.vllm import replay_model

        return replay_model
    raise AttributeError(name)
