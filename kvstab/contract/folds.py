"""The combinators a rule reads ``view.active`` and ``view.waiting`` with.

A rule may loop over ``view.active`` and ``view.waiting`` in plain Python, but
a rule that reads them only through these combinators has a decision whose
*structure* is the same for every number of requests: for ``n`` entries it is
the ``n``-fold unrolling of one step.  ``kvstab.proofs.unbounded`` runs such a
rule once on a view whose sequences cannot be iterated, measured or indexed
(each combinator then records its step instead of unrolling it) and proves the
memory invariant for any number of requests from obligations about one step.
Concretely every combinator is the plain loop its docstring states.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvstab.contract.view import View
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["scan", "zipped", "sum_of", "count_of", "any_of", "no_preemption", "select"]


def _lazy(xs: object) -> bool:
    """Whether ``xs`` is a sequence the proofs stand in for (it folds itself)."""
    return hasattr(type(xs), "__kvstab_scan__")


def scan(
    xs: Sequence[Any], step: Callable[[Any, Any], tuple[Any, Any]], init: Any, *, width: int | None = None
) -> tuple[Any, Any]:
    """A left fold over ``xs`` that also emits one output per element.

    ``step(x, acc)`` returns ``(out, acc′)``; ``scan`` runs it on every element
    in order, starting from ``init``, and returns the outputs in order and the
    final accumulator.  With ``width=k`` every ``out`` is a ``k``-tuple and the
    outputs come back as ``k`` tuples, one per component (so a step can emit a
    preempt flag and a grant).  ``step`` must be a pure function of its two
    arguments (it may read the view and ``ops``): it is the one place where the
    rule's decision may depend on an entry.  An accumulator may be a tuple.
    """
    hook = getattr(type(xs), "__kvstab_scan__", None)
    if hook is not None:
        return hook(xs, step, init, width)  # type: ignore[no-any-return]
    acc = init
    outs: list[Any] = []
    for x in xs:
        out, acc = step(x, acc)
        outs.append(out)
    if width is None:
        return tuple(outs), acc
    return tuple(tuple(o[i] for o in outs) for i in range(width)), acc


def zipped(*seqs: Sequence[Any]) -> tuple[Any, ...]:
    """The elements of equally long sequences side by side (``zip``), e.g. the
    active entries with the flags a scan emitted for them, to scan again."""
    hook = getattr(type(seqs[0]), "__kvstab_zip__", None) if seqs else None
    if hook is not None:
        return hook(*seqs)  # type: ignore[no-any-return]
    return tuple(zip(*seqs, strict=True))


def sum_of(xs: Sequence[Any], term: Callable[[Any], IntLike], ops: Ops) -> IntLike:
    """``Σ term(x)`` over ``xs`` (``ops.sum``, a fold with ``acc + term(x)``)."""
    if _lazy(xs):
        return scan(xs, lambda x, acc: (None, acc + term(x)), 0)[1]
    return ops.sum(term(x) for x in xs)


def count_of(xs: Sequence[Any], pred: Callable[[Any], BoolLike], ops: Ops) -> IntLike:
    """How many ``x`` in ``xs`` satisfy ``pred`` (``ops.count``)."""
    if _lazy(xs):
        return scan(xs, lambda x, acc: (None, acc + ops.ite(pred(x), 1, 0)), 0)[1]
    return ops.count(pred(x) for x in xs)


def any_of(flags: Sequence[BoolLike], ops: Ops) -> BoolLike:
    """Whether any of ``flags`` holds (``ops.or_``), e.g. "this slot preempted"."""
    if _lazy(flags):
        return scan(flags, lambda x, acc: (None, ops.or_(acc, x)), False)[1]
    return ops.or_(*flags)


def no_preemption(view: View) -> tuple[BoolLike, ...]:
    """Preempt flags that preempt nobody (one ``False`` per active entry)."""
    if _lazy(view.active):
        return scan(view.active, lambda a, acc: (False, acc), ())[0]  # type: ignore[no-any-return]
    return tuple(False for _ in view.active)


def select(cond: BoolLike, then: Sequence[Any], other: Sequence[Any], ops: Ops) -> tuple[Any, ...]:
    """Element by element, ``then[i]`` where ``cond`` holds and ``other[i]`` where it
    does not (``ops.ite``): one choice, the same for every entry, between two
    sequences — e.g. the active list's grants of a prefill step or of a decode step.

    ``cond`` is a value of the rule (a fold's result), not of one entry.  The proofs
    for any number of requests split the slot on it: in each case the decision comes
    from one of the two sequences (``docs/proofs.md``)."""
    hook = getattr(type(then), "__kvstab_select__", None)
    if hook is not None:
        return hook(then, cond, other)  # type: ignore[no-any-return]
    return tuple(ops.ite(cond, a, b) for a, b in zip(then, other, strict=True))
