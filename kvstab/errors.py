"""The exceptions kvstab raises.

One base class, :class:`KvstabError`, with a few meaningful children.  Every
message quotes the offending argument and its value and says what would be
valid, so that the CLI can print it as one line and exit non-zero.
"""

from __future__ import annotations

__all__ = [
    "KvstabError",
    "InvalidArgument",
    "InvalidScheduler",
    "InvariantViolation",
    "TraceError",
    "plugin_fault",
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
