"""The batch composition of one engine step, as columns of a :class:`~kvstab.steplog.StepLog`.

Both replays — kvstab's ``vllm-v1`` model (:mod:`kvstab.empirical.replay`) and
vLLM's own scheduler (:mod:`kvstab.empirical.vllm_driver`) — describe each step
by the same columns, which the batch-time model (:mod:`kvstab.empirical.batchtime`)
turns into a step time.  The one function that computes them lives here, below
both, so that neither replay imports the other.
"""

from __future__ import annotations

__all__ = ["composition", "COLUMNS"]

#: the composition columns, in the order :func:`composition` returns them
COLUMNS: tuple[str, ...] = (
    "scheduled", "prefill_tokens", "decode_tokens", "kv_attended", "prefill_reqs", "prefill_ctx", "prefill_sq",
    "decode_ctx",
)


def composition(work: list[tuple[int, int, bool]]) -> dict[str, int]:
    """Batch-composition columns of one step from ``(cached, new, prefill)`` per scheduled
    request: ``cached`` tokens already in KV, ``new`` tokens computed now, and whether
    they are prompt (prefill) tokens.  Both replays call this one function."""
    out = dict.fromkeys(COLUMNS, 0)
    for cached, new, prefill in work:
        out["scheduled"] += 1
        out["kv_attended"] += cached + new
        if prefill:
            out["prefill_tokens"] += new
            out["prefill_reqs"] += 1
            out["prefill_ctx"] += new * cached
            out["prefill_sq"] += new * new
        else:
            out["decode_tokens"] += new
            out["decode_ctx"] += cached + new
    return out
