"""Who joins the active set: first-come-first-served walks of the queue, written against ``ops``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from kvstab.contract.folds import count_of, scan
from kvstab.contract.view import View, WaitingEntry
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = [
    "fcfs_admit",
    "fcfs_admit_with_grants",
    "Projected",
    "fcfs_admit_projected",
    "projected_entries",
    "walk_projected",
]


def fcfs_admit(
    view: View,
    ops: Ops,
    fits: Callable[[WaitingEntry, IntLike], tuple[BoolLike, IntLike]],
    start: IntLike,
    allowed: BoolLike = True,
) -> tuple[BoolLike, ...]:
    """Head-of-line FCFS admission written against ``ops``.

    Walk the queue in order carrying an accumulator (``start``, e.g. memory
    committed so far; a tuple of values is fine).  ``fits(w, acc)`` returns whether ``w`` may be admitted
    on top of ``acc`` and the accumulator if it is.  The first present request
    that does not fit blocks everyone behind it.  ``allowed=False`` admits no
    one (e.g. in a slot that preempted).  ``max_num_seqs`` is respected.
    One :func:`scan` over the queue.
    """
    admits, _ = _fcfs(view, ops, lambda w, acc: (*fits(w, acc), None), start, allowed, granting=False)
    return admits  # type: ignore[no-any-return]


def fcfs_admit_with_grants(
    view: View,
    ops: Ops,
    fits: Callable[[WaitingEntry, Any], tuple[BoolLike, Any, IntLike]],
    start: Any,
    allowed: BoolLike = True,
) -> tuple[tuple[BoolLike, ...], tuple[IntLike, ...]]:
    """:func:`fcfs_admit` for a rule that grants tokens: ``fits(w, acc)`` returns
    ``(ok, acc_if_admitted, grant_if_admitted)``, and the result is the admit
    flags and each waiting entry's grant (0 unless admitted), from one walk."""
    admits, grants = _fcfs(view, ops, fits, start, allowed, granting=True)
    return admits, grants


def _fcfs(
    view: View, ops: Ops, fits: Callable[[WaitingEntry, Any], tuple[Any, Any, Any]], start: Any, allowed: BoolLike,
    *, granting: bool,
) -> tuple[Any, Any]:
    """The one FCFS walk behind :func:`fcfs_admit` and :func:`fcfs_admit_with_grants`."""
    running0 = count_of(view.active, lambda a: a.present, ops)
    cap = view.max_num_seqs  # a configuration fact, not a value of the state

    def step(w: WaitingEntry, state: tuple[Any, BoolLike, IntLike]) -> tuple[Any, tuple[Any, BoolLike, IntLike]]:
        acc, blocked, running = state
        ok, acc_if, grant_if = fits(w, acc)
        if cap is not None:
            ok = ops.and_(ok, ops.lt(running, cap))
        take = ops.and_(w.present, ops.not_(blocked), ok)
        out = (take, ops.ite(take, grant_if, 0)) if granting else take
        return out, (
            _select(ops, take, acc_if, acc),
            ops.or_(blocked, ops.and_(w.present, ops.not_(take))),
            running + ops.ite(take, 1, 0),
        )

    outs, _ = scan(view.waiting, step, (start, ops.not_(allowed), running0), width=2 if granting else None)
    return (outs[0], outs[1]) if granting else (outs, None)


def _select(ops: Ops, cond: BoolLike, then: Any, other: Any) -> Any:
    """``ops.ite`` lifted to (nested) tuples, so accumulators may be tuples."""
    if isinstance(then, tuple):
        return tuple(_select(ops, cond, a, b) for a, b in zip(then, other))
    return ops.ite(cond, then, other)


def _whole(x: IntLike, shared: IntLike) -> IntLike:
    """``x + shared``, or ``x`` itself when nothing is shared (the integer 0: no
    prefix caching, as in every proof), so the term a proof sees is unchanged."""
    return x if type(shared) is int and shared == 0 else x + shared


@runtime_checkable
class Projected(Protocol):
    """A request's projected future, as :func:`fcfs_admit_projected` reads it."""

    @property
    def f(self) -> IntLike:
        """Slots until the request finishes, this one counted."""

    @property
    def present(self) -> BoolLike:
        """Whether the entry holds a request (an empty slot of a symbolic view projects nothing)."""

    def held_at(self, view: View, tau: IntLike, ops: Ops) -> IntLike:
        """Memory it holds ``tau ≥ 1`` slots from now (0 once finished, or for an empty slot)."""


def fcfs_admit_projected(
    view: View, ops: Ops, project: Callable[[IntLike, IntLike, IntLike, BoolLike], Projected]
) -> tuple[BoolLike, ...]:
    """FCFS admission that keeps the projected memory within ``M`` at every future slot.

    ``project(s, o, progress, present)`` projects one request (an active one
    at its progress, a waiting one at 0).  Walk the queue in order
    (:func:`fcfs_admit`): the head ``w`` is admitted while the projected total
    of the active requests, the ones admitted so far and ``w`` itself, checked
    at the finish slot ``f`` of every one of them, stays ``≤ M``.  A projection
    that grows until its finish slot and is 0 after it makes a total of them
    largest at one of their finish slots, so this bounds every future slot
    (``docs/proofs.md``).  The accumulator holds the totals at the active
    requests' finish slots and which queued requests were admitted.
    """
    hook = getattr(type(view.waiting), "__kvstab_projected__", None)
    if hook is not None:
        return hook(view.waiting, view, ops, project)  # type: ignore[no-any-return]
    # the order of the original walk (actives projected, their totals, then the queue): a proof's
    # terms are built in this order, and z3's search is sensitive to it
    act = _project_active(view, project)
    totals = _totals(view, ops, act)
    return _walk(view, ops, act, totals, _project_waiting(view, project))


def projected_entries(
    view: View, project: Callable[[IntLike, IntLike, IntLike, BoolLike], Projected]
) -> tuple[list[Projected], list[Projected]]:
    """The projections :func:`fcfs_admit_projected` walks: each active entry's at its
    progress, then each waiting entry's from its cached progress (a hook that compiles the
    walk, :mod:`kvstab.engine.tape`'s, projects the same way)."""
    return _project_active(view, project), _project_waiting(view, project)


# Prefix caching: a projection takes no credit for shared blocks.  A shared block is shown on
# its oldest holder only, but it stays held until its *last* holder finishes, which a
# per-request projection cannot see; so each request is projected with its whole table
# (``shared`` added back: an over-count, never an under-count), and a waiting one from its
# cached progress (its prefill starts there).
def _project_active(view: View, project: Callable[[IntLike, IntLike, IntLike, BoolLike], Projected]) -> list[Projected]:
    return [project(_whole(a.s, a.shared), a.o, _whole(a.progress, a.shared), a.present) for a in view.active]


def _project_waiting(view: View, project: Callable[[IntLike, IntLike, IntLike, BoolLike], Projected]) -> list[Projected]:
    return [project(_whole(w.s, w.shared), w.o, _whole(w.cached, w.shared), w.present) for w in view.waiting]


def _totals(view: View, ops: Ops, act: Sequence[Projected]) -> tuple[IntLike, ...]:
    """The projected memory of the active requests at the finish slot of each of them."""
    return tuple(ops.sum(q.held_at(view, k.f, ops) for q in act) for k in act)


def walk_projected(
    view: View, ops: Ops, act: Sequence[Projected], cands: Sequence[Projected]
) -> tuple[BoolLike, ...]:
    """:func:`fcfs_admit_projected`'s walk over given projections (``act`` of the active
    entries, ``cands`` of the waiting ones, in view order), unrolled with ``ops``."""
    return _walk(view, ops, act, _totals(view, ops, act), cands)


def _walk(
    view: View, ops: Ops, act: Sequence[Projected], totals: tuple[IntLike, ...], cands: Sequence[Projected]
) -> tuple[BoolLike, ...]:
    index = {id(w): j for j, w in enumerate(view.waiting)}
    # the accumulator: (totals at the active finish slots, admitted flags of the queue)
    start: tuple[Any, ...] = (totals, tuple(False for _ in cands))

    def fits(w: WaitingEntry, acc: tuple[Any, ...]) -> tuple[BoolLike, tuple[Any, ...]]:
        tot_act, incl = acc
        j = index[id(w)]
        c = cands[j]
        # the candidate's own memory at every active finish slot
        new_act = tuple(t + c.held_at(view, k.f, ops) for t, k in zip(tot_act, act))
        earlier = list(zip(incl[:j], cands[:j]))
        # the total at the candidate's own finish slot: everyone admitted, itself too
        at_own = (
            ops.sum(q.held_at(view, c.f, ops) for q in act)
            + ops.sum(ops.ite(flag, ci.held_at(view, c.f, ops), 0) for flag, ci in earlier)
            + c.held_at(view, c.f, ops)
        )
        # the totals at the finish slots of earlier admitted candidates, with c added
        ok_cands = [
            ops.or_(
                ops.not_(flag),
                ops.le(
                    ops.sum(q.held_at(view, ci.f, ops) for q in act)
                    + ops.sum(ops.ite(fl2, cj.held_at(view, ci.f, ops), 0) for fl2, cj in earlier)
                    + c.held_at(view, ci.f, ops),
                    view.M,
                ),
            )
            for flag, ci in earlier
        ]
        ok = ops.and_(c.present, ops.le(at_own, view.M), *[ops.le(t, view.M) for t in new_act], *ok_cands)
        return ok, (new_act, tuple(True if i == j else f for i, f in enumerate(incl)))

    return fcfs_admit(view, ops, fits, start)
