"""kvstab: verify the stability of LLM inference under KV-cache memory limits.

The shared core — model types, the scheduler contract, the built-in
schedulers, the registry and the reference simulator — lives here; the
sub-packages ``kvstab.theory``, ``kvstab.proofs`` and ``kvstab.empirical``
build on it.  Start reading at ``docs/ARCHITECTURE.md``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
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

#: where each public name lives: importing ``kvstab`` (as every ``kvstab.X`` import does
#: first) loads none of them, so ``kvstab --help`` answers without numpy or the registry
_HOME = {
    **dict.fromkeys(
        ("ActiveEntry", "Decision", "Scheduler", "StateVar", "Traits", "View", "WaitingEntry", "traits_of",
         "visible_view"),
        "kvstab.contract",
    ),
    **dict.fromkeys(
        ("InvalidArgument", "InvalidScheduler", "InvariantViolation", "KvstabError", "TraceError"), "kvstab.errors"
    ),
    **dict.fromkeys(("ModelParams", "Request", "tokens_held"), "kvstab.model"),
    **dict.fromkeys(("CONCRETE", "Ops"), "kvstab.ops"),
    **dict.fromkeys(("load_scheduler", "register"), "kvstab.registry"),
    **dict.fromkeys(("Engine", "SimResult", "simulate"), "kvstab.simulator"),
}


def __getattr__(name: str) -> Any:
    """Load a public name from its module on first use (PEP 562)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'kvstab' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


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
