"""Schedulers used by the registry and CLI tests (loaded as ``module:attr``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View
from kvstab.ops import Ops


@dataclass(frozen=True)
class AdmitNothing:
    """A valid (if useless) plug-in: never admits, never preempts."""

    name: str = "admit-nothing"
    description: str = "test plug-in that admits nothing"

    def decide(self, view: View, ops: Ops) -> Decision:
        return Decision(admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active))


ADMIT_NOTHING = AdmitNothing()


class NoDescription:
    """Wrong shape: no description."""

    name = "no-description"

    def decide(self, view: View, ops: Ops) -> Decision:  # pragma: no cover - never called
        raise AssertionError


class WrongArity:
    """Wrong shape: decide takes one argument."""

    name = "wrong-arity"
    description = "decide(view) only"

    def decide(self, view: View) -> Decision:  # pragma: no cover - never called
        raise AssertionError


@dataclass(frozen=True)
class BranchesOnValues:
    """Uses Python ``if`` on a value read from the view: fine on ints, rejected symbolically."""

    name: str = "branches-on-values"
    description: str = "admits the head if it is short, with a Python if"

    def decide(self, view: View, ops: Ops) -> Decision:
        admit = []
        for w in view.waiting:
            if w.s < 10:  # the line the error must name
                admit.append(True)
            else:
                admit.append(False)
        return Decision(admit=tuple(admit), preempt=tuple(False for _ in view.active))


BRANCHES = BranchesOnValues()


@dataclass(frozen=True)
class ReturnsGarbage:
    """Returns a decision of the wrong length."""

    name: str = "returns-garbage"
    description: str = "decision with no entries"

    def decide(self, view: View, ops: Ops) -> Decision:
        return Decision(admit=(), preempt=())


GARBAGE = ReturnsGarbage()


# --- plug-ins whose faults the engine must name (scheduler, slot, what was wrong)


def _none(view: View) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    return tuple(True for _ in view.waiting), tuple(False for _ in view.active)


@dataclass(frozen=True)
class BadGrants:
    """Admits everyone and grants ``grant`` tokens to each."""

    grant: object = -100
    name: str = "bad-grants"
    description: str = "grants a bad value"

    def decide(self, view: View, ops: Ops) -> Decision:
        admit, preempt = _none(view)
        return Decision(admit=admit, preempt=preempt, grants=tuple(self.grant for _ in view.active + view.waiting))  # type: ignore[misc]


NEGATIVE_GRANTS = BadGrants(-100)
NAN_GRANTS = BadGrants(float("nan"))
STRING_GRANTS = BadGrants("3")
FLOAT_GRANTS = BadGrants(2.5)


@dataclass(frozen=True)
class Raises:
    """Its decide raises its own exception."""

    name: str = "raises"
    description: str = "decide raises ZeroDivisionError"

    def decide(self, view: View, ops: Ops) -> Decision:
        return 1 // (len(view.waiting) - len(view.waiting))  # type: ignore[return-value]


RAISES = Raises()


@dataclass(frozen=True)
class ReturnsString:
    """Its decide returns a string."""

    name: str = "returns-string"
    description: str = "decide returns 'admit all'"

    def decide(self, view: View, ops: Ops) -> Decision:
        return "admit all"  # type: ignore[return-value]


RETURNS_STRING = ReturnsString()


@dataclass(frozen=True)
class AdmitsStrings:
    """Its admit flags are strings, not booleans."""

    name: str = "admits-strings"
    description: str = "admit flags are 'yes'"

    def decide(self, view: View, ops: Ops) -> Decision:
        return Decision(admit=tuple("yes" for _ in view.waiting), preempt=tuple(False for _ in view.active))  # type: ignore[misc]


ADMITS_STRINGS = AdmitsStrings()


@dataclass(frozen=True)
class NeverReturns:
    """Its decide loops forever (a per-decision time limit must stop it)."""

    name: str = "never-returns"
    description: str = "decide never returns"

    def decide(self, view: View, ops: Ops) -> Decision:
        while True:
            pass


NEVER_RETURNS = NeverReturns()


@dataclass(frozen=True)
class Interrupted:
    """Its decide is interrupted by Ctrl-C (raises KeyboardInterrupt as a signal would)."""

    name: str = "interrupted"
    description: str = "decide gets Ctrl-C"

    def decide(self, view: View, ops: Ops) -> Decision:
        raise KeyboardInterrupt


INTERRUPTED = Interrupted()


@dataclass(frozen=True)
class SneakySJF:
    """Declares ``clairvoyant=False`` but orders by ``s + o``: admits the head only if
    it is the shortest total in the window (reads ``o``)."""

    name: str = "sneaky-sjf"
    description: str = "shortest s+o first, claiming not to read o"
    traits: Traits = Traits(clairvoyant=False)

    def decide(self, view: View, ops: Ops) -> Decision:
        totals = [w.s + w.o for w in view.waiting]
        least = ops.min(*totals) if totals else 0
        admit = tuple(ops.eq(t, least) for t in totals)
        return Decision(admit=admit, preempt=tuple(False for _ in view.active))


SNEAKY_SJF = SneakySJF()


@dataclass(frozen=True)
class HonestSJF:
    """The same rule declaring ``clairvoyant=True``: allowed to read ``o``."""

    name: str = "honest-sjf"
    description: str = "shortest s+o first, clairvoyant"
    traits: Traits = Traits(clairvoyant=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        return SneakySJF.decide(self, view, ops)  # type: ignore[arg-type]


HONEST_SJF = HonestSJF()


@dataclass(frozen=True)
class Impostor:
    """A plug-in that calls itself ``current-fit`` but admits nothing."""

    name: str = "current-fit"
    description: str = "not the built-in"

    def decide(self, view: View, ops: Ops) -> Decision:
        return Decision(admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active))


IMPOSTOR = Impostor()


@dataclass(frozen=True)
class ShortestPromptFirst:
    """Not head-of-line: admits only the waiting request with the least ``s`` it
    sees (the queue window decides what it sees)."""

    name: str = "shortest-prompt-first"
    description: str = "admit the shortest prompt in view, one at a time"
    traits: Traits = Traits(clairvoyant=False)

    def decide(self, view: View, ops: Ops) -> Decision:
        ss = [w.s for w in view.waiting]
        least = ops.min(*ss) if ss else 0
        first: list[bool] = []
        taken = False
        for s in ss:
            pick = ops.and_(ops.not_(taken), ops.eq(s, least))
            first.append(pick)
            taken = ops.or_(taken, pick)
        room = ops.eq(ops.count(a.present for a in view.active), 0)
        return Decision(admit=tuple(ops.and_(room, f) for f in first), preempt=tuple(False for _ in view.active))


SHORTEST_PROMPT_FIRST = ShortestPromptFirst()


@dataclass(frozen=True)
class StuckAfterMarking:
    """Writes the file named by ``$KVSTAB_TEST_MARKER`` when ``decide`` starts,
    then never returns (so a test can send Ctrl-C while it is inside decide)."""

    name: str = "stuck-after-marking"
    description: str = "marks a file, then decide never returns"

    def decide(self, view: View, ops: Ops) -> Decision:
        import os
        from pathlib import Path

        Path(os.environ["KVSTAB_TEST_MARKER"]).write_text("in decide")
        while True:
            pass


STUCK = StuckAfterMarking()


class _EndsTheProcess(BaseException):
    """Neither an ``Exception`` nor Ctrl-C: what a plug-in might raise to stop everything."""


@dataclass(frozen=True)
class ExitsInDecide:
    """Calls ``sys.exit(0)`` inside ``decide`` (kvstab must not end silently with status 0)."""

    name: str = "exits-in-decide"
    description: str = "decide calls sys.exit(0)"

    def decide(self, view: View, ops: Ops) -> Decision:
        import sys

        sys.exit(0)


EXITS_IN_DECIDE = ExitsInDecide()


@dataclass(frozen=True)
class RaisesBaseInDecide:
    """Raises a bare ``BaseException`` subclass inside ``decide``."""

    name: str = "raises-base-in-decide"
    description: str = "decide raises a BaseException that is not an Exception"

    def decide(self, view: View, ops: Ops) -> Decision:
        raise _EndsTheProcess("stop")


RAISES_BASE_IN_DECIDE = RaisesBaseInDecide()


@dataclass(frozen=True)
class ExitsInMargin:
    """A sound rule (admits nothing) whose declared ``margin`` calls ``sys.exit(0)``."""

    name: str = "exits-in-margin"
    description: str = "margin calls sys.exit(0)"

    def margin(self, params: object, max_s: int, max_o: int) -> int:
        import sys

        sys.exit(0)

    def decide(self, view: View, ops: Ops) -> Decision:
        return Decision(admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active))


EXITS_IN_MARGIN = ExitsInMargin()
