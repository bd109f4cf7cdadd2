"""Schedulers used by the registry and CLI tests (loaded as ``module:attr``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvstab.contract import Decision, View
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
