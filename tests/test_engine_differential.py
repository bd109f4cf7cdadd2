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

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.engine import run
from kvstab.engine import sglang as sgl
from kvstab.engine._drive import Reporting
from kvstab.engine.driver import finish_table, has_fast_path
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import builtin_names, load_scheduler
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import Horizon, SimResult
from kvstab.steplog import ReplayConfig, check_plan

#: scales every example count here and in ``test_engine_events.py``: ``KVSTAB_ENGINE_EXAMPLES=20``
#: runs twenty times as many scenarios (what a change to the compiled engine should pass once)
SCALE = max(1, int(os.environ.get("KVSTAB_ENGINE_EXAMPLES", "1")))
FIELDS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "s o arrival first_admit finish preemptions served request_wasted"
).split()
#: every built-in: the differential tests compare them all
RULES = builtin_names(include_negative=True)
#: the built-ins with a compiled engine: every one (``sglang`` has a kernel of its own)
COMPILED = [r for r in RULES if has_fast_path(load_scheduler(r))]
#: the lifecycles each built-in has a fast path for (sglang's own is tested below, with its knobs)
LIFECYCLES = {r: ["kvstab", "vllm"] if r in COMPILED else ["kvstab"] for r in RULES}


#: where ``lookahead`` keeps its finish-time table (``_finish_tree.FORCE``): in the tree from the
#: first request; moved between the O(n) table and the tree at every test while 2 (or 4) run;
#: or as shipped (``None``: mostly the table on these small servers)
TABLE_MODES: list[tuple[int, int] | None] = [(0, -1), (2, 2), (4, 4), None]




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
    with finish_table(mode):
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
            with finish_table(mode):
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
    """Every built-in has a compiled engine, which ``engine="auto"`` takes and names, under
    kvstab's and vLLM's lifecycles (and sglang under SGLang's own); a subclass of a built-in
    (it may change ``decide``) does not take it."""
    assert COMPILED == RULES
    params = ModelParams(M=64, chunk=8)
    plan = fixed_arrivals([(0, 5, 3), (1, 9, 4)])
    for rule in RULES:
        for life in ("kvstab", "vllm"):
            out = run(load_scheduler(rule), params, plan, drain=True, max_slots=1000, lifecycle=life)  # type: ignore[arg-type]
            assert out.engine == "fast", (rule, out.reason)
    sg = Sglang()
    out = run(sg, params, plan, drain=True, lifecycle="sglang")
    assert out.engine == "fast" and "sglang" in out.reason

    class Mine(Sglang):
        pass

    mine = Mine()
    assert not sgl.is_fast(mine)
    ref = run(mine, params, plan, drain=True, lifecycle="sglang")
    assert ref.engine == "reference" and "subclass" in ref.reason, ref.reason
    _same(ref.result, out.result)
    try:
        run(mine, params, plan, drain=True, engine="fast", lifecycle="sglang")
    except InvalidArgument as exc:
        assert "has no fast path" in str(exc)
    else:
        raise AssertionError("engine='fast' ran a subclass of Sglang on the compiled path")


# --- sglang with its knobs, under its three lifecycles
@st.composite
def sglang_cases(draw: st.DrawFn) -> tuple[Sglang, ModelParams, str]:
    """An ``Sglang`` with drawn knobs — low initial ratios (the reservation under-counts, and
    decode runs out of memory: retraction), dyadic ratios (exact float ties at the admission
    boundary), a small clip, small prefill budgets — and the server it runs on: under
    SGLang's lifecycle one SGLang accepts (chunks of whole pages, caps, no token budget),
    any drawn server under kvstab's and vLLM's (the rule reads ``M``, chunk, page and cap
    off the view in every lifecycle)."""
    life = draw(st.sampled_from(["kvstab", "vllm", "sglang"]))
    B = draw(st.sampled_from([1, 1, 4, 16]))
    chunk = B * draw(st.integers(1, 8))
    M = draw(st.integers(max(2 * chunk, 3 * B, 24), 24 * B + 200))
    knobs = dict(
        init_new_token_ratio=draw(st.sampled_from([0.7, 0.3, 0.1, 0.05, 0.5, 0.25, 1.0])),
        clip_max_new_tokens=draw(st.sampled_from([4096, 1, 3, 20])),
        max_prefill_tokens=draw(st.sampled_from([1, chunk, 2 * chunk, 16384])),
        retract_decode_steps=draw(st.sampled_from([20, 0, 3])),
        new_token_ratio_decay_steps=draw(st.sampled_from([600, 7])),
    )
    max_num_seqs = draw(st.none() | st.integers(1, 6))
    rule = Sglang(**knobs)  # type: ignore[arg-type]
    if life == "sglang":
        return rule, ModelParams(M=M, chunk=chunk, block=B, max_num_seqs=max_num_seqs), life
    params = draw(servers("sglang"))
    return rule, params, life


@st.composite
def sglang_plans(draw: st.DrawFn, params: ModelParams, horizon: int) -> ArrivalPlan:
    """Bursts of requests that together overfill ``M`` (prompts up to a third of it, outputs
    up to half), so that an under-counting reservation runs decode out of memory."""
    rows = []
    for _ in range(draw(st.integers(1, 30))):
        slot = draw(st.integers(0, horizon // 2))
        s = draw(st.integers(1, max(1, params.M // 3)))
        o = draw(st.integers(1, max(1, params.M // 2 - s)))
        rows.append((slot, s, o))
    return fixed_arrivals(sorted(rows))


def _sglang_outcome(rule: Sglang, params: ModelParams, plan: ArrivalPlan, horizon: int | None, engine: str,
                    life: str, work: dict[str, int]) -> object:  # fmt: skip
    drain = horizon is None
    try:
        if engine == "fast":  # the compiled engine itself, for its work counters (run() takes it: above)
            h = Horizon(horizon, drain, 3000)
            return sgl.run_fast(rule, params, plan, h, Reporting(), True, life, work)[1]  # type: ignore[arg-type]
        # the queue window only sizes the reference's view (the rule stops at its first refusal)
        window = 1 + len(plan) % 8
        return run(rule, params, plan, horizon, drain=drain, window=window, max_slots=3000, engine="reference",
                   lifecycle=life).result  # type: ignore[arg-type]  # fmt: skip
    except InvariantViolation as exc:
        return ("violation", exc.slot, exc.memory, exc.requests, str(exc))
    except InvalidArgument as exc:
        return ("refused", str(exc))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), case=sglang_cases())
def test_sglang_matches_reference_with_its_knobs(data: st.DataObject, case: tuple[Sglang, ModelParams, str]) -> None:
    """sglang's compiled engine, every knob drawn, kvstab's, vLLM's and SGLang's lifecycles,
    fixed horizons and drained runs: every SimResult array, or the same violation or refusal."""
    rule, params, life = case
    horizon = data.draw(st.none() | st.integers(1, 150))
    plan = data.draw(sglang_plans(params, horizon or 80))
    work: dict[str, int] = {}
    ref = _sglang_outcome(rule, params, plan, horizon, "reference", life, work)
    fast = _sglang_outcome(rule, params, plan, horizon, "fast", life, work)
    if isinstance(ref, tuple) and ref[0] == "refused":
        assert fast == ref
        event("refused")
        return
    _same(ref, fast)
    # the corners the scenarios must keep reaching (shown by --hypothesis-show-statistics)
    if isinstance(ref, SimResult):
        event(f"{life}: {'retraction' if ref.preemptions.any() else 'no retraction'}")
        event("a float sum recomputed in Python's order" if work["exact_sums"] else "float tests decided by margin")
        event("quiet stretches skipped" if work["stretches"] else "no stretch")
    else:
        event("invariant violation")


def test_a_request_vllm_cannot_hold_is_refused_alike() -> None:
    """A request whose vLLM peak (``s + o − 1``, in blocks) exceeds ``M``: the fast and the reference
    engine refuse it in the same words under vLLM's lifecycle, and the replay in its own."""
    params = ModelParams(M=256, chunk=64, block=16)
    plan = fixed_arrivals([(0, 10, 5), (1, 200, 60), (2, 5, 5)])  # request 1's peak: 259 → 272 tokens
    said = "request 1 (s=200, o=60) needs 272 tokens of KV at its peak but M=256: vLLM could never finish it"
    for engine in ("fast", "reference"):
        with pytest.raises(InvalidArgument) as exc:
            run(load_scheduler("current-fit"), params, plan, 50, lifecycle="vllm", engine=engine)  # type: ignore[arg-type]
        assert str(exc.value) == said
    config = ReplayConfig.for_capacity(256, 16, max_num_batched_tokens=64, max_num_seqs=8)
    with pytest.raises(InvalidArgument, match=r"272 tokens of KV at its peak but M=\(num_blocks-1\)·B=256: vLLM would"):
        check_plan(plan, config)
