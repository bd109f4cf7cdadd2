"""Who leaves the active set: the orders in which a rule preempts, written against ``ops``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstab.contract.folds import scan
from kvstab.contract.memory import held_next
from kvstab.contract.view import ActiveEntry, View
from kvstab.ops import BoolLike, IntLike, Ops

__all__ = ["preempt_newest", "pops_before", "retract_until_fits"]


def preempt_newest(view: View, ops: Ops) -> tuple[tuple[BoolLike, ...], IntLike]:
    """Recompute preemption as vLLM v1 does it, written against ``ops``.

    vLLM walks the running list oldest first and preempts from the tail until
    the current request's blocks fit; because memory only grows, the survivors
    are the longest prefix (in admission order) whose post-slot memory fits in
    ``M``.  Returns the preempt flags (one per active entry) and the post-slot
    memory of the survivors.  One :func:`scan` over the active list, carrying
    ``(prefix, kept)``: the post-slot memory of every entry so far and of the
    survivors so far; an entry is a victim iff ``prefix`` exceeds ``M`` with it.
    """

    def step(a: ActiveEntry, acc: tuple[IntLike, IntLike]) -> tuple[BoolLike, tuple[IntLike, IntLike]]:
        prefix, kept = acc
        nxt = held_next(view, a, ops)
        prefix = prefix + nxt
        victim = ops.and_(a.present, ops.lt(view.M, prefix))
        return victim, (prefix, kept + ops.ite(victim, 0, nxt))

    preempt, (_, kept) = scan(view.active, step, (0, 0))
    return preempt, kept


def pops_before(ops: Ops, kj: Sequence[IntLike], ki: Sequence[IntLike], j_later: bool) -> BoolLike:
    """The order :func:`retract_until_fits` pops in: whether the entry with key ``kj``
    goes before the one with key ``ki`` — a smaller key (compared lexicographically),
    or an equal key and ``j`` later in the list (``j_later``).  A strict total order on
    the entries whatever the keys are (``kvstab.proofs.loops.retraction_lemma`` checks it)."""
    less: BoolLike = False
    same: BoolLike = True
    for a, b in zip(kj, ki, strict=True):
        less = ops.or_(less, ops.and_(same, ops.lt(a, b)))
        same = ops.and_(same, ops.eq(a, b))
    return ops.or_(less, same) if j_later else less


def retract_until_fits(
    view: View,
    ops: Ops,
    cost: Callable[[ActiveEntry], IntLike],
    key: Callable[[ActiveEntry], Sequence[IntLike]],
    cap: IntLike,
    allowed: BoolLike = True,
) -> tuple[BoolLike, ...]:
    """Retraction in a strict total order, written against ``ops``: the preempt flags.

    Pop the active requests one by one, in ascending order of ``key(a)`` (a tuple of
    values, compared lexicographically; of two equal keys the later entry goes
    first, as a stable sort by descending key popped from its end), while the
    requests not popped yet cost more than ``cap`` together (``Σ cost(a)``); never
    pop the last one.  Nobody is popped when ``allowed`` is false or everything
    fits.  Popping only makes the rest cheaper, so entry ``i`` is popped iff it is
    not last in the order and the requests from ``i`` on (itself included) cost more
    than ``cap`` — what this computes, one flag per entry.

    The memory bound it gives (``docs/proofs.md``, proved for any number of
    requests by ``kvstab.proofs``): when every request's cost lies in
    ``[0, cap]``, the requests kept cost at most ``cap`` — whatever the keys,
    since only the order's totality is used.  ``cost`` and ``key`` read one entry
    (pure functions); an empty slot costs nothing and is never popped.

    Concretely it returns at once when nobody is popped (the common case); only a
    step that retracts compares the entries pairwise (``O(K²)`` operations, which
    is also what a symbolic run unrolls).
    """
    hook = getattr(type(view.active), "__kvstab_retract__", None)
    if hook is not None:
        return hook(view.active, view, ops, cost, key, cap, allowed)  # type: ignore[no-any-return]
    actives = view.active
    n = len(actives)
    if allowed is False:
        return (False,) * n
    costs = [ops.ite(a.present, cost(a), 0) for a in actives]
    over = ops.and_(allowed, ops.lt(cap, ops.sum(costs)))
    if over is False:
        return (False,) * n  # the concrete common case: every flag below has `over` as a conjunct
    keys = [tuple(key(a)) for a in actives]
    present = [a.present for a in actives]
    # earlier[i][j]: entry j is popped before entry i
    earlier = [
        [ops.and_(present[j], pops_before(ops, keys[j], keys[i], j > i)) if j != i else False for j in range(n)]
        for i in range(n)
    ]
    flags: list[BoolLike] = []
    for i in range(n):
        # i is last when no present entry is popped after it
        last = ops.not_(ops.or_(*[ops.and_(present[j], earlier[j][i]) for j in range(n) if j != i]))
        # what is left when i's turn comes: the requests not popped before it, itself included
        rest = ops.sum(ops.ite(earlier[i][j], 0, costs[j]) for j in range(n))
        # `over` first: a tape skips the rows behind it when it is false (kvstab.engine._guards)
        flags.append(ops.and_(over, present[i], ops.not_(last), ops.lt(cap, rest)))
    return tuple(flags)
