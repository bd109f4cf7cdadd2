"""The exceptions kvstab raises.

One base class, :class:`KvstabError`, with a few meaningful children.  Every
message quotes the offending argument and its value and says what would be
valid, so that the CLI can print it as one line and exit non-zero.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

__all__ = [
    "KvstabError",
    "InvalidArgument",
    "InvalidScheduler",
    "InvariantViolation",
    "TraceError",
    "plugin_fault",
    "import_plugin",
]


class KvstabError(Exception):
    """Base class of every error kvstab raises on purpose."""


class InvalidArgument(KvstabError, ValueError):
    """A value given by the user (CLI flag, parameter, workload spec) is invalid."""


class TraceError(InvalidArgument):
    """A trace file could not be read: names the file, the line and the reason."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class InvalidScheduler(KvstabError, TypeError):
    """A scheduler does not fit the contract (wrong shape, bad decision, or it
    branches with Python control flow on a symbolic value)."""


class InvariantViolation(KvstabError):
    """A scheduler's decision made the memory in use exceed ``M`` (or broke
    another per-slot invariant the engine checks).

    Attributes carry what a test or a replay needs: the slot, the memory used,
    the capacity and the ids of the requests active in that slot.
    """

    def __init__(
        self,
        message: str,
        *,
        slot: int,
        memory: int,
        capacity: int,
        requests: tuple[int, ...] = (),
        record: object | None = None,
    ) -> None:
        super().__init__(message)
        self.slot = slot
        self.memory = memory
        self.capacity = capacity
        self.requests = requests
        #: the engine's :class:`~kvstab.simulator.SlotRecord` of the breaking slot, when it has one
        self.record = record

    def __reduce__(self) -> tuple[object, ...]:
        # keyword-only attributes: the default exception pickling (args only) cannot rebuild it,
        # and a violation must cross process pools (sweeps, the audit's workers) intact
        return (_rebuild_violation, (type(self), str(self), self.slot, self.memory, self.capacity, self.requests,
                                     self.record))


def _rebuild_violation(
    cls: type[InvariantViolation], message: str, slot: int, memory: int, capacity: int,
    requests: tuple[int, ...], record: object | None,
) -> InvariantViolation:
    """Unpickle an :class:`InvariantViolation` with every attribute."""
    return cls(message, slot=slot, memory=memory, capacity=capacity, requests=requests, record=record)


def plugin_fault(exc: BaseException) -> str:
    """One line describing what a plug-in raised, for the message that names the plug-in.

    A plug-in's ``SystemExit`` (``sys.exit`` at import, a ``module:attr`` naming
    ``sys:exit``) or any other ``BaseException`` would otherwise end kvstab with no
    output and a status the plug-in chose; the loaders and the engine turn it into
    an error whose text this is."""
    text = " ".join(str(exc).split("\n"))
    if isinstance(exc, SystemExit):
        return f"{exc!r}: a plug-in may not end kvstab (it called sys.exit or raised SystemExit)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def import_plugin(mod_name: str, what: str) -> ModuleType:
    """Import the module of a ``module:attr`` plug-in (``what``: "scheduler", "router"), looking
    where ``python -m`` would: the installed packages, then the current folder.

    A console script's ``sys.path`` starts at its own ``bin/``, not at the folder it is run
    from, so ``kvstab audit --scheduler skf:SCHEDULER`` beside ``skf.py`` would not find what
    ``pytest`` and ``python -m`` find; the folder is appended (after every installed package,
    so it never shadows one) only when the module is missing and stands there.  Any failure is
    one :class:`InvalidArgument` line naming the module, what it raised, and where kvstab looked."""
    try:
        try:
            return importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            top = mod_name.partition(".")[0]
            here = os.getcwd()
            there = os.path.isfile(os.path.join(here, f"{top}.py")) or os.path.isdir(os.path.join(here, top))
            if exc.name != top or not there or here in sys.path:
                raise
            sys.path.append(here)
            return importlib.import_module(mod_name)
    except KeyboardInterrupt:
        raise
    except ModuleNotFoundError as exc:
        where = ""
        if exc.name == mod_name.partition(".")[0]:
            where = " (kvstab looked in the installed packages and the current folder: run it from the folder that " \
                    "holds the module, or put that folder on PYTHONPATH)"
        raise InvalidArgument(f"cannot import {what} module {mod_name!r}: {plugin_fault(exc)}{where}") from None
    except BaseException as exc:  # any import-time failure of user code is one line, SystemExit too
        raise InvalidArgument(f"cannot import {what} module {mod_name!r}: {plugin_fault(exc)}") from None
