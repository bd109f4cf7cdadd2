"""Memory helpers every rule may use; each calls the one memory-accounting function
(:func:`kvstab.model.tokens_held`)."""

from __future__ import annotations

from kvstab.contract.folds import sum_of
from kvstab.contract.view import ActiveEntry, View, WaitingEntry
from kvstab.model import progress_after, tokens_held
from kvstab.ops import IntLike, Ops

__all__ = ["held_now", "held_next", "held_first", "first_progress", "first_step", "used_now", "used_next"]


def held_now(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """Tokens ``a`` holds now (before this slot's work); 0 for an empty slot."""
    return ops.ite(a.present, tokens_held(a.progress, view.block, ops), 0)


def held_next(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """Tokens ``a`` will hold after one full unit of work this slot; 0 for an empty slot."""
    nxt = progress_after(a.s, a.progress, view.chunk, None, ops)
    return ops.ite(a.present, tokens_held(nxt, view.block, ops), 0)


def held_first(view: View, w: WaitingEntry, ops: Ops) -> IntLike:
    """Tokens a waiting request would hold after its first slot: its cached prefix
    (prefix caching) and one chunk of the rest of its prompt."""
    return ops.ite(w.present, tokens_held(first_progress(view, w, ops), view.block, ops), 0)


def first_progress(view: View, w: WaitingEntry, ops: Ops, cap: IntLike | None = None) -> IntLike:
    """Progress of ``w`` after its first slot: ``cached + min(s − cached, ŝ)``, the
    chunk further capped by ``cap`` (tokens left in a budget) when given."""
    return first_step(view, w, ops, cap)[1]


def first_step(view: View, w: WaitingEntry, ops: Ops, cap: IntLike | None = None) -> tuple[IntLike, IntLike]:
    """``(grant, progress)`` of ``w``'s first slot: the prompt tokens it computes,
    ``min(s − cached, ŝ, cap)``, and where that leaves it, ``cached + grant``.

    Without prefix caching (``cached`` the integer 0, as in every proof) both are the
    paper's ``min(s, ŝ)``, built as the same term (no ``− 0`` for z3 to carry)."""
    plain = type(w.cached) is int and w.cached == 0
    left = w.s if plain else w.s - w.cached
    grant = ops.min(left, view.chunk) if cap is None else ops.min(left, view.chunk, cap)
    return grant, (grant if plain else w.cached + grant)


def used_now(view: View, ops: Ops) -> IntLike:
    """Memory in use at the start of the slot."""
    return sum_of(view.active, lambda a: held_now(view, a, ops), ops)


def used_next(view: View, ops: Ops) -> IntLike:
    """Memory the active requests will hold after one full unit each."""
    return sum_of(view.active, lambda a: held_next(view, a, ops), ops)
