"""The fast engine against the reference engine, on scenarios that reach the corners.

One source of truth: for every built-in rule and both request lifecycles, the
fast engine (:func:`kvstab.engine.driver`: the compiled loop of a built-in, or
the taped plug-in path for ``sglang``, kvstab's lifecycle) must give the reference engine's
outcome exactly — every per-slot series and every per-request outcome of
:class:`~kvstab.simulator.SimResult`, or the same :class:`InvariantViolation`
(slot, memory, running requests).  The scenarios are small servers (a few
requests fill ``M``) with blocks, token budgets, ``max_num_seqs`` caps, chunks
that do not divide the prompts, bursts and idle gaps, and vLLM-lifecycle
requests with ``o = 1`` (no decode unit).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.engine import _finish_tree, run
from kvstab.engine.driver import fast_rule
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import builtin_names, load_scheduler
from kvstab.simulator import SimResult

#: scales every example count here and in ``test_engine_events.py``: ``KVSTAB_ENGINE_EXAMPLES=20``
#: runs twenty times as many scenarios (what a change to the compiled engine should pass once)
SCALE = max(1, int(os.environ.get("KVSTAB_ENGINE_EXAMPLES", "1")))
FIELDS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "s o arrival first_admit finish preemptions served request_wasted"
).split()
#: every built-in: the differential tests compare them all
RULES = builtin_names(include_negative=True)
#: the built-ins with a compiled slot loop; the others (``sglang``) run on the plug-in path
COMPILED = [r for r in RULES if fast_rule(load_scheduler(r)) is not None]
#: the lifecycles each built-in has a fast path for (the plug-in path runs kvstab's only)
LIFECYCLES = {r: ["kvstab", "vllm"] if r in COMPILED else ["kvstab"] for r in RULES}


#: where ``lookahead`` keeps its finish-time table (``_finish_tree.FORCE``): in the tree from the
#: first request; moved between the O(n) table and the tree at every test while 2 (or 4) run;
#: or as shipped (``None``: mostly the table on these small servers)
TABLE_MODES: list[tuple[int, int] | None] = [(0, -1), (2, 2), (4, 4), None]


@contextmanager
def table_mode(mode: tuple[int, int] | None) -> Iterator[None]:
    """Runs started inside keep lookahead's table as ``mode`` says (see ``TABLE_MODES``)."""
    old = _finish_tree.FORCE
    _finish_tree.FORCE = mode
    try:
        yield
    finally:
        _finish_tree.FORCE = old


@st.composite
def servers(draw: st.DrawFn, rule: str = "vllm-v1") -> ModelParams:
    """Small servers: every option of the model drawn, corner values included.  Only
    ``vllm-v1`` reads the token budget; the other rules get one rarely (the engine
    must then catch the overrun, like the reference)."""
    M = draw(st.integers(8, 160))
    chunk = draw(st.one_of(st.integers(1, min(48, M)), st.just(M)))
    block = draw(st.sampled_from([b for b in (1, 1, 2, 3, 4, 16) if 2 * b <= M]))
    with_budget = draw(st.booleans()) if rule == "vllm-v1" else draw(st.integers(0, 9)) == 0
    budget = draw(st.integers(1, 64)) if with_budget else None
    seqs = draw(st.none() | st.integers(1, 6))
    return ModelParams(M=M, chunk=chunk, block=block, token_budget=budget, max_num_seqs=seqs)


@st.composite
def plans(draw: st.DrawFn, params: ModelParams, horizon: int) -> ArrivalPlan:
    """Bursts and gaps of requests whose peak fits ``M`` (vLLM terms: peak ``s + o − 1``
    also fits, so both lifecycles accept every plan)."""
    cap = params.M // params.block * params.block  # the largest block-aligned peak within M
    rows = []
    for _ in range(draw(st.integers(1, 20))):
        slot = draw(st.integers(0, horizon // 2))
        s = draw(st.integers(1, max(1, cap - 1)))
        o = draw(st.integers(1, max(1, cap - s)))
        rows.append((slot, s, o))
    return fixed_arrivals(rows)


def _outcome(rule: str, params: ModelParams, plan: ArrivalPlan, horizon: int, engine: str, life: str) -> object:
    try:
        out = run(load_scheduler(rule), params, plan, horizon, engine=engine, lifecycle=life)  # type: ignore[arg-type]
    except InvariantViolation as exc:
        return ("violation", exc.slot, exc.memory, exc.requests, str(exc))
    if engine == "reference":
        assert out.engine == "reference"
    elif rule in COMPILED:
        assert out.engine == "fast", out.reason
    else:  # the plug-in path, or the reference engine after a hand-over (the outcome is the reference's)
        assert out.engine == "fast-plugin" or "handed over" in out.reason, out.reason
    return out.result


def _same(a: object, b: object) -> None:
    if isinstance(a, SimResult) and isinstance(b, SimResult):
        assert a.slots == b.slots
        for f in FIELDS:
            x, y = getattr(a, f), getattr(b, f)
            bad = np.flatnonzero(x != y) if x.shape == y.shape else [0]
            assert len(bad) == 0, (
                f"{f} differs first at index {bad[0]}: reference {x[bad[0] : bad[0] + 3]}, fast {y[bad[0] : bad[0] + 3]}"
            )
        return
    assert isinstance(a, tuple) and isinstance(b, tuple), (a, b)
    assert a == b  # slot, memory, running requests and message


@settings(max_examples=120 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), rule=st.sampled_from(RULES))
def test_fast_engine_matches_reference(data: st.DataObject, rule: str) -> None:
    life = data.draw(st.sampled_from(LIFECYCLES[rule]))
    params = data.draw(servers(rule))
    horizon = data.draw(st.integers(1, 120))
    plan = data.draw(plans(params, horizon))
    mode = data.draw(st.sampled_from(TABLE_MODES)) if rule == "lookahead" else TABLE_MODES[-1]
    ref = _outcome(rule, params, plan, horizon, "reference", life)
    with table_mode(mode):
        fast = _outcome(rule, params, plan, horizon, "fast", life)
    _same(ref, fast)
    # the corners the scenarios must keep reaching (shown by --hypothesis-show-statistics)
    if isinstance(ref, SimResult):
        event("preempted" if ref.preemptions.any() else "no preemption")
        if life == "vllm" and ref.preemptions.any():
            event(
                "vllm resume with outputs folded into the prompt"
                if (ref.s > plan.s[: ref.s.size]).any()
                else "vllm restart in prefill"
            )
    else:
        event("invariant violation")


@settings(max_examples=40 * SCALE, deadline=None)
@given(data=st.data(), rule=st.sampled_from([r for r in RULES if r != "current-fit-no-preempt"]))
def test_fast_engine_drains_like_reference(data: st.DataObject, rule: str) -> None:
    """``drain=True``: the same number of slots, the same outcomes (or the same refusal)."""
    params = data.draw(servers(rule))
    plan = data.draw(plans(params, 60))
    mode = data.draw(st.sampled_from(TABLE_MODES)) if rule == "lookahead" else TABLE_MODES[-1]
    outs = []
    for engine in ("reference", "fast"):
        try:
            with table_mode(mode):
                outs.append(run(load_scheduler(rule), params, plan, drain=True, max_slots=3000, engine=engine).result)  # type: ignore[arg-type]
        except InvalidArgument as exc:
            outs.append(("refused", str(exc)))  # type: ignore[arg-type]
        except InvariantViolation as exc:
            outs.append(("violation", exc.slot, exc.memory, exc.requests, str(exc)))  # type: ignore[arg-type]
    if isinstance(outs[0], tuple) and outs[0][0] == "refused":
        assert outs[1] == outs[0]
        return
    _same(outs[0], outs[1])


def test_negative_control_caught_at_the_same_slot() -> None:
    """The negative control overflows; both engines stop at the same slot with the same requests."""
    params = ModelParams(M=40, chunk=8)
    plan = fixed_arrivals([(0, 5, 30), (0, 5, 30), (1, 5, 30)])
    ref = _outcome("current-fit-no-preempt", params, plan, 100, "reference", "kvstab")
    fast = _outcome("current-fit-no-preempt", params, plan, 100, "fast", "kvstab")
    assert isinstance(ref, tuple) and ref[0] == "violation"
    _same(ref, fast)


@settings(max_examples=40 * SCALE, deadline=None)
@given(data=st.data(), rule=st.sampled_from(["current-fit-no-preempt", "current-fit", "reserve"]))
def test_unchecked_runs_match_past_a_violation(data: st.DataObject, rule: str) -> None:
    """``check=False``: the engines keep going past an overflow (or a token-budget overrun)
    and must still agree slot for slot, ``drain`` with a minimum horizon included."""
    params = data.draw(servers("vllm-v1"))  # budgets drawn often: the non-vLLM rules overrun them
    horizon = data.draw(st.integers(1, 80))
    plan = data.draw(plans(params, horizon))
    drain = data.draw(st.booleans())
    outs = [
        run(load_scheduler(rule), params, plan, horizon, drain=drain, check=False, engine=e, max_slots=5000).result  # type: ignore[arg-type]
        for e in ("reference", "fast")
    ]
    _same(outs[0], outs[1])


def test_every_builtin_has_a_fast_path() -> None:
    """Every built-in runs fast under kvstab's lifecycle: a compiled loop, or (``sglang``: a
    real-valued state and float reservations, which the tape holds in float64 registers) the
    plug-in path, which ``engine="auto"`` takes and names; under vLLM's lifecycle the plug-in
    path has none, and ``engine="fast"`` says why."""
    others = [r for r in RULES if r not in COMPILED]
    assert others == ["sglang"]
    params = ModelParams(M=64, chunk=8)
    plan = fixed_arrivals([(0, 5, 3), (1, 9, 4)])
    for rule in others:
        out = run(load_scheduler(rule), params, plan, drain=True, max_slots=1000)
        assert out.engine == "fast-plugin", out.reason
        _same(run(load_scheduler(rule), params, plan, drain=True, engine="reference").result, out.result)
        try:
            run(load_scheduler(rule), params, plan, drain=True, engine="fast", lifecycle="vllm")
        except InvalidArgument as exc:
            assert "has no fast path" in str(exc) and "kvstab's lifecycle only" in str(exc)
        else:
            raise AssertionError(f"{rule}: engine='fast' ran the vLLM lifecycle without a fast path")
