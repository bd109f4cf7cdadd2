"""What a scheduler claims about itself: :class:`Traits`, read with :func:`traits_of`.

The claims are declared once (``traits = Traits(...)`` on the scheduler) and
checked by kvstab where it can: the audit's properties, the proofs' claims, and
:func:`kvstab.contract.visible_view`, which never shows ``o`` to a rule that
declares ``clairvoyant=False``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields

from kvstab.errors import InvalidScheduler

__all__ = ["Traits", "TRAIT_NAMES", "NO_TRAITS", "traits_of"]


@dataclass(frozen=True, slots=True)
class Traits:
    """What a scheduler claims about itself; kvstab checks each claim it can.

    Declared once, as ``traits = Traits(...)`` on the scheduler.  A misspelled
    trait is a ``TypeError`` where it is written, and the registry rejects a
    scheduler that sets a trait-like attribute outside ``traits`` (a flat
    ``work_conserving = True`` would otherwise be silently ignored).
    """

    fcfs: bool = field(default=False, metadata={"help": "first admissions follow arrival order"})
    work_conserving: bool = field(
        default=False, metadata={"help": "never leaves a request waiting that its own admission test would accept"}
    )
    clairvoyant: bool = field(
        default=True, metadata={"help": "reads output lengths o (False: the rule is never shown o)"}
    )
    preempts: bool = field(default=False, metadata={"help": "may preempt running requests"})
    negative_control: bool = field(
        default=False, metadata={"help": "deliberately broken (excluded from default audits, expected to fail)"}
    )
    stalls_running: bool = field(
        default=False,
        metadata={
            "help": "may give running requests no work in a slot that no token budget forces "
            "(SGLang's prefill-only steps); liveness is then bounded by total work, not by n(s) + o"
        },
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, bool):
                raise InvalidScheduler(f"trait {f.name} must be True or False, got {v!r}")

    def tags(self) -> list[str]:
        """The traits that hold, as short tags (for listings)."""
        names = ("fcfs", "clairvoyant", "preempts", "work_conserving", "stalls_running", "negative_control")
        return [
            n if n in ("fcfs", "clairvoyant", "preempts", "work_conserving") else n.replace("_", "-")
            for n in names
            if getattr(self, n)
        ]


TRAIT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Traits))

#: a scheduler that declares nothing: may read ``o``, claims no order, no conservation, no preemption
NO_TRAITS = Traits()


def traits_of(scheduler: object) -> Traits:
    """The :class:`Traits` a scheduler declares (``Traits()`` if it declares none).

    Raises :class:`InvalidScheduler` when ``traits`` is not a ``Traits``, or
    when a trait is set as a plain attribute (``fcfs = True``) or a near miss
    of one (``work_conservng``), which would otherwise be ignored.
    """
    who = getattr(scheduler, "name", type(scheduler).__name__)
    declared = getattr(scheduler, "traits", NO_TRAITS)
    if not isinstance(declared, Traits):
        raise InvalidScheduler(f"scheduler {who!r}: traits must be a kvstab.Traits(...), got {type(declared).__name__}")
    for attr in dir(scheduler):
        if attr.startswith("_") or attr == "traits":
            continue
        close = difflib.get_close_matches(attr, TRAIT_NAMES, n=1, cutoff=0.8)
        if not close:
            continue
        try:
            value = getattr(scheduler, attr)
        except Exception:  # a property that fails is not a trait declaration
            continue
        if isinstance(value, bool):
            hint = "" if attr == close[0] else f" (did you mean {close[0]!r}?)"
            raise InvalidScheduler(
                f"scheduler {who!r}: {attr} = {value} is a plain attribute{hint}; declare traits as "
                f"traits = Traits({close[0]}={value}, ...) — known traits: {', '.join(TRAIT_NAMES)}"
            )
    return declared
