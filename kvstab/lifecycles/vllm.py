"""vLLM's request lifecycle in kvstab's reference engine.

kvstab's model and vLLM v1 agree on how a step works (the ``vllm-v1`` rule
reproduces the scheduling decision) but differ in two points of a request's
lifecycle, which this module maps exactly:

* **The last prefill step samples output token 1.**  A vLLM request
  ``(s, o)`` with ``max_tokens = o`` is in service ``n(s) + o − 1`` steps and
  holds at most ``s + o − 1`` tokens of KV.  kvstab's request ``(s, o′)`` is in
  service ``n(s) + o′`` slots and holds at most ``s + o′``, so ``o′ = o − 1``;
  its progress is then vLLM's ``num_computed_tokens`` in every step.  A vLLM
  request with ``o = 1`` is a kvstab request with no decode unit (``o′ = 0``):
  it finishes in its last prefill slot.
* **Recompute keeps the output.**  vLLM frees a preempted request's KV but
  keeps the tokens it produced; on resumption it recomputes them as part of
  the prompt (``num_tokens − num_computed_tokens``, chunked like any prefill).
  A request preempted with progress ``p ≥ s`` has produced ``k = p − s + 1``
  tokens, so it comes back as ``(s + k, o′ − k) = (p + 1, s + o′ − p − 1)``:
  same peak ``s + o′``, but its first ``k`` outputs cost one chunked prefill
  instead of ``k`` decode steps.  Preempted during prefill (``p < s``), it
  restarts unchanged.

kvstab's :class:`~kvstab.simulator.Engine` restarts a preempted request from
scratch and accepts only ``o ≥ 1``; :class:`VllmEngine` changes both through
the engine's extension points (``min_output`` and ``on_preempt``), with no
change to the rule.
"""

from __future__ import annotations

import numpy as np

from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, tokens_held
from kvstab.prefix import Prompt
from kvstab.simulator import Engine, RequestState

__all__ = ["VllmEngine", "kvstab_lengths", "resumed_lengths"]


def kvstab_lengths(s: int, o: int) -> tuple[int, int]:
    """The kvstab lengths ``(s, o − 1)`` of a vLLM request with prompt ``s`` and
    ``max_tokens = o`` (``o − 1`` may be 0: the request ends with its prefill)."""
    if s < 1 or o < 1:
        raise InvalidArgument(f"a vLLM request needs s >= 1 and o >= 1, got s={s}, o={o}")
    return s, o - 1


def resumed_lengths(s: int, o: int, progress: int) -> tuple[int, int]:
    """Lengths a kvstab request ``(s, o)`` (already mapped) resumes with after a
    recompute preemption at ``progress``: unchanged in prefill, else
    ``(progress + 1, s + o − progress − 1)``."""
    if progress < s:
        return s, o
    return progress + 1, s + o - progress - 1


class VllmEngine(Engine):
    """kvstab's engine with vLLM's request lifecycle (see the module docstring).

    Requests are given in vLLM's terms (``max_tokens = o``); :attr:`vllm_o`
    keeps them so results can be reported in those terms.  The lifecycle
    enters through the engine's two extension points: :attr:`min_output`
    (a request may have no decode unit) and :meth:`on_preempt` (a victim keeps
    its outputs as prompt).
    """

    min_output = 0

    def __init__(self, scheduler: Scheduler, params: ModelParams, *, check: bool = True, window: int = 8) -> None:
        super().__init__(scheduler, params, check=check, window=window)
        self.vllm_s: list[int] = []
        self.vllm_o: list[int] = []
        self.recomputed: list[int] = []  # per request: tokens recomputed after preemptions

    def output_tokens(self, o: int) -> int:
        """vLLM samples ``max_tokens = o + 1`` tokens for kvstab's ``o`` decode units."""
        return o + 1

    def arrive(self, s: int, o: int, prompt: Prompt | None = None, output: int | None = None) -> int:
        """A vLLM request with prompt ``s`` and ``max_tokens = o`` arrives now (``prompt``
        and ``output``: its content, for prefix caching, as :meth:`Engine.arrive`)."""
        for name, v in (("s", s), ("o", o)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidArgument(f"request length {name} must be an integer >= 1, got {v!r}")
        ks, ko = kvstab_lengths(int(s), int(o))
        if tokens_held(ks + ko, self.params.block) > self.params.M:
            raise InvalidArgument(
                f"request (s={s}, o={o}) needs {ks + ko} tokens of KV at its peak but M={self.params.M}: "
                "vLLM could never finish it"
            )
        rid = super().arrive(ks, ko, prompt, output)
        self.vllm_s.append(int(s))
        self.vllm_o.append(int(o))
        self.recomputed.append(0)
        return rid

    def on_preempt(self, r: RequestState) -> None:
        """The victim comes back with its outputs folded into the prompt."""
        self.recomputed[r.rid] += r.progress  # every token whose KV it throws away is computed again
        if r.progress >= r.s:  # outputs kept: the rule sees them as `prior` (docs/scheduler-contract.md)
            r.prior += r.progress - r.s + 1
        r.s, r.o = resumed_lengths(r.s, r.o, r.progress)
