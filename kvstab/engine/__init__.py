"""The fast engine: the reference model's outcomes, slot for slot, at compiled speed.

Start with :func:`run` (any scheduler; says which engine ran), or the drop-ins
:func:`simulate` (for :func:`kvstab.simulator.simulate`) and
:func:`replay_model` (for :func:`kvstab.empirical.replay.replay_model`).
``docs/engine.md`` explains the design and how to add a fast path.
"""

from kvstab.engine.driver import Run, fast_rule, run, simulate
from kvstab.engine.stream import Summary
from kvstab.engine.vllm import replay_model

__all__ = ["run", "simulate", "Run", "Summary", "fast_rule", "replay_model"]
