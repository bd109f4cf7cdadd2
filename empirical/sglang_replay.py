"""The model's replay of a plan under SGLang's lifecycle, on the compiled engine or the reference one.

:func:`replay_sglang_model` is what the cross-check against SGLang's own
scheduler (:mod:`kvstab.empirical.sglang_driver`) compares with: the ``sglang``
rule with SGLang's request lifecycle (:mod:`kvstab.lifecycles.sglang`), one
SGLang step per slot, as a :class:`~kvstab.steplog.SglangModelLog`.
"""

from __future__ import annotations

import time

from kvstab.arrivals import ArrivalPlan
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang import replay_reference
from kvstab.lifecycles.sglang_radix import replay_radix
from kvstab.model import ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.steplog import STEP_FIELDS, SglangModelLog, SglangStep
from kvstab.validation import MAX_SLOTS

__all__ = ["replay_sglang_model"]


def replay_sglang_model(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int | None = None,
    *,
    max_steps: int = MAX_SLOTS,
    engine: str = "auto",
) -> SglangModelLog:
    """Replay ``plan`` (``o`` = SGLang's ``max_new_tokens``) on the ``sglang`` rule
    with SGLang's lifecycle on the server ``params``: ``steps`` steps, or (``None``) until every request has
    arrived and finished, at most ``max_steps``.  Every step is recorded, idle ones too.

    ``engine``: ``"auto"`` (the compiled engine, :mod:`kvstab.engine.sglang`, for the
    :class:`Sglang` class itself; the reference
    :class:`~kvstab.lifecycles.sglang.SglangEngine` for a subclass),
    ``"fast"`` (refuse a subclass) or ``"reference"``; the log's ``engine`` says which ran.
    Both give the same log, step for step (``tests/test_engine_sglang.py``).

    With ``params.prefix_caching`` on, SGLang runs its radix cache: the model is
    :func:`~kvstab.lifecycles.sglang_radix.replay_radix` on the reference engine (the log's
    ``engine`` is ``"reference (radix cache)"``); ``engine="fast"`` is refused, since the compiled
    kernel has no radix cache and must not run with it silently off."""
    from kvstab.engine import sglang as fast  # numba: loaded only when a replay asks for it

    if engine not in ("auto", "fast", "reference"):
        raise InvalidArgument(f"engine must be 'auto', 'fast' or 'reference', got {engine!r}")
    if params.prefix_caching:
        if engine == "fast":
            raise InvalidArgument(
                "the compiled sglang kernel has no radix cache; with prefix caching on use engine='reference' "
                "(or 'auto'), which runs the radix-cache model"
            )
        return replay_radix(plan, rule, params, steps, max_steps=max_steps)
    start = time.perf_counter()
    if engine != "reference" and fast.is_fast(rule):
        return _replay_fast(plan, rule, params, steps, max_steps, start)
    if engine == "fast":
        raise InvalidArgument(f"{type(rule).__name__} has no compiled path ({fast.no_fast_path(rule)}); use engine='reference'")
    return replay_reference(plan, rule, params, steps, max_steps=max_steps)


def _replay_fast(
    plan: ArrivalPlan, rule: Sglang, params: ModelParams, steps: int | None, max_steps: int, start: float
) -> SglangModelLog:
    """:func:`replay_sglang_model` on the compiled engine."""
    from kvstab.engine.sglang import LogEnd, replay_steps

    end: list[LogEnd] = []
    log = tuple(
        SglangStep(step=t, **{f: getattr(r, f) for f in STEP_FIELDS})
        for t, r in enumerate(replay_steps(plan, rule, params, steps, max_steps, end))
    )
    e = end[0]
    n = e.arrived
    return SglangModelLog(
        rule=rule,
        params=params,
        steps=log,
        s=tuple(plan.s[:n].tolist()),
        max_new=tuple(e.max_new.tolist()),
        arrival=tuple(plan.slot[:n].tolist()),
        first_admit=tuple(e.first_admit.tolist()),
        finish=tuple(e.finish.tolist()),
        retractions=tuple(e.retractions.tolist()),
        recomputed=tuple(e.recomputed.tolist()),
        wall_s=time.perf_counter() - start,
        engine="fast",
    )
