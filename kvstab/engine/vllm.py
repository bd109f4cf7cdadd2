"""The vLLM-matched model on the fast engine: a drop-in for
:func:`kvstab.empirical.replay.replay_model`.

Same plan, same :class:`~kvstab.steplog.ReplayConfig`, same
:class:`~kvstab.steplog.StepLog` — every per-step column (the batch
composition included) and every per-request column — computed by the compiled
loop with the ``vllm-v1`` rule and vLLM's request lifecycle instead of the
reference engine.  ``benchmarks/bench_engine.py`` compares it, step for step,
with the reference model and with vLLM's own scheduler.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.engine import _kernel as K
from kvstab.engine.driver import BATCH, _State, _violation
from kvstab.steplog import ReplayConfig, StepLog, StepRecorder, check_plan, replay_horizon

__all__ = ["replay_model"]

# the StepLog's per-step columns, by their index in the kernel's output block
_STEP_COLUMNS = {name: K.COLUMNS.index(name) for name in StepRecorder.STEP}


def replay_model(
    plan: ArrivalPlan,
    config: ReplayConfig,
    steps: int | None,
    *,
    check: bool = True,
    checkpoint: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> StepLog:
    """Replay ``plan`` for ``steps`` steps with the ``vllm-v1`` rule and vLLM's
    lifecycle on the fast engine; the arguments and the result are those of
    :func:`kvstab.empirical.replay.replay_model` (``on_step`` is called for
    every step, after the batch that ran it)."""
    n_steps = replay_horizon(plan, steps)
    check_plan(plan, config)
    params = config.params()
    rec = StepRecorder(plan, n_steps // 4 if checkpoint is None else checkpoint)
    state = _State(plan)
    start = time.perf_counter()
    blocks = []
    out = np.zeros((K.NCOLS, min(BATCH, n_steps)), dtype=np.int64)
    while state.t < n_steps:
        t0 = state.t
        t_end = min(t0 + out.shape[1], n_steps)
        if t0 < rec.checkpoint < t_end:
            t_end = rec.checkpoint  # stop at the checkpoint to read the attempts in progress
        if t0 == rec.checkpoint:
            act = state.active()
            rec.area_at_checkpoint[act] = state.att[act]
            rec.preemptions_at_checkpoint[:] = state.npre
        out[:] = 0
        status = state.step(K.VLLM_V1, K.VLLM_LIFE, params, check, True, t_end, False, 0, out)
        if status == K.VIOLATION:
            raise _violation(state, "vllm-v1", params)
        blocks.append(out[:, : state.t - t0].copy())
        if on_step is not None:
            for t in range(t0, state.t):
                on_step(t)
    whole = np.concatenate(blocks, axis=1) if blocks else np.zeros((K.NCOLS, 0), dtype=np.int64)
    for name, k in _STEP_COLUMNS.items():
        rec.cols[name] = whole[k]  # type: ignore[assignment]  # StepRecorder.log turns each column into an array
    n = state.arrived
    rec.arrival[:n] = state.pslot[:n]
    rec.first_admit[:] = state.first
    rec.finish[:] = state.fin
    rec.preemptions[:] = state.npre
    done = state.fin >= 0
    rec.area[done] = state.att[done]
    rec.final_s[done] = state.s[done]
    rec.wasted[:] = state.wasted
    rec.recomputed[:] = state.recomp
    act = state.active()
    rec.area_at_end[act] = state.att[act]
    return rec.log("model", config, time.perf_counter() - start)
