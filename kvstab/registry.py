"""The scheduler registry: built-ins by name, plug-ins by ``module:attr`` or entry point.

A plug-in is checked when it is registered, not when it first runs: a wrong
shape is rejected with a message naming what is wrong.  Third-party packages
advertise schedulers in the entry-point group ``kvstab.schedulers``; the value
is a ``module:attr`` naming a scheduler object (or a zero-argument factory).
A broken or colliding entry point is skipped with a one-line warning on
stderr, so one bad package cannot disable every command; asking for it by
name raises its error.

Names are unique: a plug-in loaded by ``module:attr`` whose ``name`` is that
of a registered scheduler (``current-fit``) is refused unless it *is* that
scheduler, so no report can pass a plug-in off as a built-in.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

from kvstab.contract import Scheduler, check_scheduler_shape, traits_of
from kvstab.errors import InvalidArgument, InvalidScheduler, KvstabError, import_plugin, plugin_fault

__all__ = ["Registry", "REGISTRY", "get_scheduler", "load_scheduler", "register", "builtin_names"]

ENTRY_POINT_GROUP = "kvstab.schedulers"

_BUILTINS = (
    "kvstab.schedulers.current_fit",
    "kvstab.schedulers.reserve",
    "kvstab.schedulers.lookahead",
    "kvstab.schedulers.no_preempt",
    "kvstab.schedulers.vllm_v1",
    "kvstab.schedulers.sglang",
)


class Registry:
    """Schedulers keyed by name.  Registering a duplicate name raises."""

    def __init__(self) -> None:
        self._by_name: dict[str, Scheduler] = {}
        #: entry points that could not be registered: name -> the one-line reason
        self.broken: dict[str, str] = {}

    def register(self, scheduler: Any) -> Scheduler:
        """Add ``scheduler``; raise :class:`InvalidScheduler` if it has the wrong
        shape or its name is taken."""
        problem = check_scheduler_shape(scheduler)
        if problem is not None:
            raise InvalidScheduler(f"cannot register {scheduler!r} as a scheduler: {problem}")
        name = scheduler.name
        if name in self._by_name:
            raise InvalidScheduler(f"a scheduler named {name!r} is already registered")
        self._by_name[name] = scheduler
        return scheduler

    def get(self, name: str) -> Scheduler:
        """The scheduler registered as ``name``; raise with the known names if none."""
        try:
            return self._by_name[name]
        except KeyError:
            if name in self.broken:
                raise InvalidScheduler(self.broken[name]) from None
            raise InvalidArgument(
                f"unknown scheduler {name!r}; known: {', '.join(sorted(self._by_name))} (or module:attr)"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[Scheduler]:
        return iter(self._by_name[n] for n in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name


def _resolve(spec: str) -> Any:
    """Import ``module:attr``; raise :class:`InvalidArgument` in one line on failure.

    The plug-in's code runs here (its import, a factory, the attributes the shape
    check reads): whatever it raises, ``SystemExit`` included, becomes one line that
    names it.  Only Ctrl-C (``KeyboardInterrupt``) goes on as it is."""
    if ":" not in spec:
        raise InvalidArgument(f"scheduler spec {spec!r} must be a registered name or 'module:attr'")
    mod_name, _, attr = spec.partition(":")
    mod = import_plugin(mod_name, "scheduler")
    try:
        return _built(spec, mod, mod_name, attr)
    except (KeyboardInterrupt, KvstabError):
        raise
    except BaseException as exc:
        raise InvalidArgument(f"scheduler {spec!r}: loading it raised {plugin_fault(exc)}") from None


def _built(spec: str, mod: Any, mod_name: str, attr: str) -> Any:
    """The scheduler ``mod``'s ``attr`` names (built if it is a class or factory), shape-checked."""
    obj: Any = mod
    for part in attr.split("."):
        if not part or not hasattr(obj, part):
            raise InvalidArgument(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "decide")):
        try:
            obj = obj()  # a class or factory: build the scheduler
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # sys:exit is a factory that ends the process: one line too
            raise InvalidArgument(f"cannot build scheduler from {spec!r}: {plugin_fault(exc)}") from None
    problem = check_scheduler_shape(obj)
    if problem is not None:
        raise InvalidScheduler(f"{spec!r} is not a scheduler: {problem}")
    return obj


def _build_default() -> Registry:
    reg = Registry()
    for mod in _BUILTINS:
        reg.register(importlib.import_module(mod).SCHEDULER)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            reg.register(_resolve(ep.value))
        except Exception as exc:  # a third party's bug must not take the built-ins down with it
            reason = f"scheduler entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP!r}: {exc}"
            reg.broken[ep.name] = reason
            sys.stderr.write(f"kvstab: warning: skipped {reason}\n")
    return reg


_REGISTRY: Registry | None = None


def registry() -> Registry:
    """The process-wide registry (built-ins and entry-point plug-ins), built on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _build_default()
    return _REGISTRY


def register(scheduler: Any) -> Scheduler:
    """Register ``scheduler`` in the process-wide registry."""
    return registry().register(scheduler)


def load_scheduler(spec: str) -> Scheduler:
    """A scheduler by registered name or ``module:attr`` (a name wins).

    A ``module:attr`` plug-in may not take the name of a registered scheduler
    unless it is that scheduler (equal to it): reports name schedulers, and a
    plug-in called ``current-fit`` must not be mistaken for the built-in.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(f"scheduler spec must be a registered name or 'module:attr', got {spec!r}")
    reg = registry()
    if spec in reg:
        return reg.get(spec)
    if ":" in spec:
        obj = _resolve(spec)
        name = obj.name
        if name in reg and reg.get(name) is not obj and reg.get(name) != obj:
            raise InvalidScheduler(
                f"{spec!r} calls itself {name!r}, the name of a registered scheduler it is not; "
                "give the plug-in a name of its own"
            )
        return obj
    return reg.get(spec)  # raises with the known names


get_scheduler = load_scheduler


def builtin_names(include_negative: bool = False) -> list[str]:
    """Names of registered schedulers; negative controls only if asked."""
    return [s.name for s in registry() if include_negative or not traits_of(s).negative_control]


REGISTRY = registry
