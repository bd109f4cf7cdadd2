"""``kvstab.empirical``: cross-checks against vLLM's and SGLang's real schedulers, and batch-time calibration.

Optional extras: vLLM is imported only by :mod:`kvstab.empirical.vllm_driver`,
SGLang only by :mod:`kvstab.empirical.sglang_driver`, each only when a replay
on it is asked for (``scripts/install-vllm.sh``, ``scripts/install-sglang.sh``).
Names are loaded on first use, so that ``kvstab --help`` stays cheap.

Start reading at :mod:`kvstab.empirical.replay`; ``docs/empirical.md`` explains
the mapping between vLLM's semantics and kvstab's model.  The servers' request
lifecycles (:mod:`kvstab.lifecycles`) and what a replay records
(:mod:`kvstab.steplog`: ``ReplayConfig``, ``StepLog``, ``SglangModelLog``) are
in the core, which the fast engine shares.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors (nothing is imported at run time)
    from kvstab.empirical.batchtime import BatchTimeModel, fit_batch_time, load_profile
    from kvstab.empirical.decompose import decompose_gap
    from kvstab.empirical.estimators import bbar_estimates, queue_growth, saturated_rate
    from kvstab.empirical.replay import replay_model, replay_vllm
    from kvstab.empirical.sglang_driver import SglangUnavailable, replay_sglang
    from kvstab.empirical.sglang_replay import replay_sglang_model
    from kvstab.empirical.vllm_driver import VllmUnavailable

__all__ = [
    "replay_model",
    "replay_vllm",
    "saturated_rate",
    "queue_growth",
    "bbar_estimates",
    "decompose_gap",
    "load_profile",
    "fit_batch_time",
    "BatchTimeModel",
    "VllmUnavailable",
    "replay_sglang",
    "replay_sglang_model",
    "SglangUnavailable",
]

_WHERE = {
    "replay_model": "replay",
    "replay_vllm": "replay",
    "saturated_rate": "estimators",
    "queue_growth": "estimators",
    "bbar_estimates": "estimators",
    "decompose_gap": "decompose",
    "load_profile": "batchtime",
    "fit_batch_time": "batchtime",
    "BatchTimeModel": "batchtime",
    "VllmUnavailable": "vllm_driver",
    "replay_sglang": "sglang_driver",
    "replay_sglang_model": "sglang_replay",
    "SglangUnavailable": "sglang_driver",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"kvstab.empirical.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kvstab.empirical' has no attribute {name!r}")
