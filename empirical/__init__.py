"""``kvstab.empirical``: cross-checks against vLLM's and SGLang's real schedulers, and batch-time calibration.

Optional extras: vLLM is imported only by :mod:`kvstab.empirical.vllm_driver`,
SGLang only by :mod:`kvstab.empirical.sglang_driver`, each only when a replay
on it is asked for (``scripts/install-vllm.sh``, ``scripts/install-sglang.sh``).
Names are loaded on first use, so that ``kvstab --help`` stays cheap.

Start reading at :mod:`kvstab.empirical.replay`; ``docs/empirical.md`` explains
the mapping between vLLM's semantics and kvstab's model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors (nothing is imported at run time)
    from kvstab.empirical.batchtime import BatchTimeModel, fit_batch_time, load_profile
    from kvstab.empirical.decompose import decompose_gap
    from kvstab.empirical.estimators import bbar_estimates, queue_growth, saturated_rate
    from kvstab.empirical.replay import ReplayConfig, StepLog, replay_model, replay_vllm
    from kvstab.empirical.semantics import VllmEngine
    from kvstab.empirical.sglang_driver import SglangUnavailable, replay_sglang
    from kvstab.empirical.sglang_semantics import SglangModelLog, replay_sglang_model
    from kvstab.empirical.vllm_driver import VllmUnavailable

__all__ = [
    "ReplayConfig",
    "StepLog",
    "replay_model",
    "replay_vllm",
    "VllmEngine",
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
    "SglangModelLog",
    "SglangUnavailable",
]

_WHERE = {
    "ReplayConfig": "replay",
    "StepLog": "replay",
    "replay_model": "replay",
    "replay_vllm": "replay",
    "VllmEngine": "semantics",
    "saturated_rate": "estimators",
    "queue_growth": "estimators",
    "bbar_estimates": "estimators",
    "decompose_gap": "decompose",
    "load_profile": "batchtime",
    "fit_batch_time": "batchtime",
    "BatchTimeModel": "batchtime",
    "VllmUnavailable": "vllm_driver",
    "replay_sglang": "sglang_driver",
    "replay_sglang_model": "sglang_semantics",
    "SglangModelLog": "sglang_semantics",
    "SglangUnavailable": "sglang_driver",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"kvstab.empirical.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kvstab.empirical' has no attribute {name!r}")
