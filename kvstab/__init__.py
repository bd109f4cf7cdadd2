"""kvstab: verify the stability of LLM inference under KV-cache memory limits.

The shared core — model types, the scheduler contract, the built-in
schedulers, the registry and the reference simulator — lives here; the
sub-packages ``kvstab.theory``, ``kvstab.proofs`` and ``kvstab.empirical``
build on it.  Start reading at ``docs/ARCHITECTURE.md``.
"""

from kvstab.contract import (
    ActiveEntry,
    Decision,
    Scheduler,
    StateVar,
    Traits,
    View,
    WaitingEntry,
    traits_of,
    visible_view,
)
from kvstab.errors import InvalidArgument, InvalidScheduler, InvariantViolation, KvstabError, TraceError
from kvstab.model import ModelParams, Request, tokens_held
from kvstab.ops import CONCRETE, Ops
from kvstab.registry import load_scheduler, register
from kvstab.simulator import Engine, SimResult, simulate

__version__ = "0.1.0"

__all__ = [
    "ActiveEntry",
    "CONCRETE",
    "Decision",
    "Engine",
    "InvalidArgument",
    "InvalidScheduler",
    "InvariantViolation",
    "KvstabError",
    "ModelParams",
    "Ops",
    "Request",
    "Scheduler",
    "SimResult",
    "StateVar",
    "TraceError",
    "Traits",
    "View",
    "WaitingEntry",
    "load_scheduler",
    "register",
    "simulate",
    "tokens_held",
    "traits_of",
    "visible_view",
]
