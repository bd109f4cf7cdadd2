"""Memory helpers every rule may use; each calls the one memory-accounting function
(:func:`kvstab.model.tokens_held`)."""

from __future__ import annotations

from kvstab.contract.folds import sum_of
from kvstab.contract.view import ActiveEntry, View, WaitingEntry
from kvstab.model import first_chunk_tokens, progress_after, tokens_held
from kvstab.ops import IntLike, Ops

__all__ = ["held_now", "held_next", "held_first", "used_now", "used_next"]


def held_now(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """Tokens ``a`` holds now (before this slot's work); 0 for an empty slot."""
    return ops.ite(a.present, tokens_held(a.progress, view.block, ops), 0)


def held_next(view: View, a: ActiveEntry, ops: Ops) -> IntLike:
    """Tokens ``a`` will hold after one full unit of work this slot; 0 for an empty slot."""
    nxt = progress_after(a.s, a.progress, view.chunk, None, ops)
    return ops.ite(a.present, tokens_held(nxt, view.block, ops), 0)


def held_first(view: View, w: WaitingEntry, ops: Ops) -> IntLike:
    """Tokens a waiting request would hold after its first slot (its first chunk)."""
    return ops.ite(w.present, tokens_held(first_chunk_tokens(w.s, view.chunk, ops), view.block, ops), 0)


def used_now(view: View, ops: Ops) -> IntLike:
    """Memory in use at the start of the slot."""
    return sum_of(view.active, lambda a: held_now(view, a, ops), ops)


def used_next(view: View, ops: Ops) -> IntLike:
    """Memory the active requests will hold after one full unit each."""
    return sum_of(view.active, lambda a: held_next(view, a, ops), ops)
