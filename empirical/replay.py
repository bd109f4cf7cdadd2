"""Replay one arrival plan step by step, on vLLM's scheduler or on kvstab's ``vllm-v1`` model.

Both replays take the same :class:`~kvstab.arrivals.ArrivalPlan` (requests in
vLLM's terms: prompt ``s``, ``max_tokens = o``) and the same
:class:`~kvstab.steplog.ReplayConfig`, run in simulated time (one step = one
engine iteration), and return a :class:`~kvstab.steplog.StepLog` with the same
fields, so that they can be compared step for step and fed to the same
estimators.  Time in seconds comes afterwards, from a batch-time model applied
to each step's composition (:meth:`~kvstab.steplog.StepLog.step_times`).

* :func:`replay_model` runs kvstab's reference engine with the ``vllm-v1``
  rule and vLLM's request lifecycle (:mod:`kvstab.lifecycles.vllm`);
* :func:`replay_vllm` drives ``vllm.v1.core.sched.scheduler.Scheduler`` itself
  (:mod:`kvstab.empirical.vllm_driver`; needs the vLLM extra).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.empirical.composition import composition
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.schedulers.vllm_v1 import SCHEDULER
from kvstab.steplog import ReplayConfig, StepLog, StepRecorder, check_plan, replay_horizon

__all__ = ["replay_model", "replay_vllm", "composition"]


def replay_model(
    plan: ArrivalPlan,
    config: ReplayConfig,
    steps: int | None,
    *,
    check: bool = True,
    checkpoint: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> StepLog:
    """Replay ``plan`` for ``steps`` steps on kvstab's engine with the ``vllm-v1`` rule
    and vLLM's request lifecycle.  ``checkpoint`` (default: a quarter of the steps,
    the estimators' default warm-up) is where the window-boundary areas are taken."""
    n_steps = replay_horizon(plan, steps)
    check_plan(plan, config)
    params = config.params()
    eng = VllmEngine(SCHEDULER, params, check=check)
    rec = StepRecorder(plan, n_steps // 4 if checkpoint is None else checkpoint)
    attempt: dict[int, int] = {}  # area of each request's current attempt
    i, n = 0, len(plan)
    start = time.perf_counter()
    for t in range(n_steps):
        arrived = 0
        while i < n and plan.slot[i] == t:
            if eng.cache is None or plan.prompts is None:
                rid = eng.arrive(int(plan.s[i]), int(plan.o[i]))
            else:  # prefix caching: the request's content, as the vLLM replay sends its token ids
                out = None if plan.prompts.output is None else int(plan.prompts.output[i])
                rid = eng.arrive(int(plan.s[i]), int(plan.o[i]), plan.prompts.prompt(i), out)
            rec.arrival[rid] = t
            i += 1
            arrived += 1
        rec.at_step_start(t, attempt)
        before = {r.rid: (r.progress, r.s) for r in eng.active}
        recomputed_before = sum(eng.recomputed)
        r_step = eng.step()
        # the running list of this step: survivors and admissions, finished ones included
        done = set(r_step.completed)
        worked = [r for r in eng.active] + [eng.requests[rid] for rid in r_step.completed]
        work: list[tuple[int, int, bool]] = []
        for r in worked:
            p0, s0 = before.get(r.rid, (r.cached, r.s))  # an admission starts past its cache hit
            if r.progress > p0:
                work.append((p0, r.progress - p0, p0 < s0))
            held = int(-(-r.progress // params.block) * params.block)
            attempt[r.rid] = attempt.get(r.rid, 0) + held
        for rid in r_step.admitted:
            if rec.first_admit[rid] < 0:
                rec.first_admit[rid] = t
        for rid in r_step.preempted:
            rec.preemptions[rid] += 1
            rec.wasted[rid] += attempt.pop(rid, 0)
        for rid in done:
            rec.finish[rid] = t
            rec.area[rid] = attempt.pop(rid, 0)
            rec.final_s[rid] = eng.requests[rid].s
        rec.step(
            arrived=arrived,
            admitted=len(r_step.admitted),
            preempted=len(r_step.preempted),
            completed=len(r_step.completed),
            running=r_step.running,
            memory=r_step.memory,
            wasted=r_step.wasted,
            tokens=r_step.tokens,
            recomputed=sum(eng.recomputed) - recomputed_before,
            queue=r_step.queue,
            **composition(work),
        )
        if on_step is not None:
            on_step(t)
    rec.recomputed[:] = np.asarray(eng.recomputed + [0] * (n - len(eng.recomputed)), dtype=np.int64)
    rec.at_end(attempt)
    return rec.log("model", config, time.perf_counter() - start)


def replay_vllm(
    plan: ArrivalPlan,
    config: ReplayConfig,
    steps: int | None,
    *,
    checkpoint: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> StepLog:
    """Replay ``plan`` for ``steps`` steps on vLLM 0.33.0's own v1 scheduler
    (raises :class:`~kvstab.empirical.vllm_driver.VllmUnavailable` without it);
    ``checkpoint`` as for :func:`replay_model`."""
    from kvstab.empirical.vllm_driver import VllmDriver

    n_steps = replay_horizon(plan, steps)
    check_plan(plan, config)
    driver = VllmDriver(config, config.model_len(plan))
    rec = StepRecorder(plan, n_steps // 4 if checkpoint is None else checkpoint)
    return driver.replay(plan, n_steps, rec, on_step=on_step)
