"""sglang's compiled engine (:mod:`kvstab.engine.sglang`) against the reference engine.

The SimResult side (kvstab's, vLLM's and SGLang's lifecycles, every knob drawn) is in
``tests/test_engine_differential.py``; here: SGLang's step log step for step, the float
tests at their boundary (from hand-built states where Python's float sum decides what the
exact sum would not), the scheduler's state after skipped stretches, and which engine runs.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.engine import _kernel as K
from kvstab.engine import _kernel_sglang as KS
from kvstab.engine import sglang as sgl
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.sglang import SglangEngine
from kvstab.model import ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import Engine

ROWS = "arrived admitted preempted completed running memory wasted tokens queue".split()


@st.composite
def small_servers(draw: st.DrawFn) -> tuple[Sglang, ModelParams, ArrivalPlan]:
    """Servers SGLang accepts (chunks of whole pages) and up to 40 requests: pages 1/4/16, caps,
    prefill budgets down to one token, a clip down to one token, low and dyadic initial ratios,
    a fast decay (the floor is reached), no retract steps."""
    B = draw(st.sampled_from([1, 1, 4, 16]))
    chunk = B * draw(st.integers(1, 8))
    M = draw(st.integers(max(2 * chunk, 8 * B, 32), 30 * B + 300))
    params = ModelParams(M=M, chunk=chunk, block=B, max_num_seqs=draw(st.none() | st.integers(1, 10)))
    rule = Sglang(
        max_prefill_tokens=draw(st.sampled_from([1, chunk, 2 * chunk, 16384])),
        init_new_token_ratio=draw(st.sampled_from([0.7, 0.3, 0.1, 0.05, 0.5, 1.0])),
        clip_max_new_tokens=draw(st.sampled_from([4096, 1, 5, 40])),
        new_token_ratio_decay_steps=draw(st.sampled_from([600, 5])),
        retract_decode_steps=draw(st.sampled_from([20, 0])),
    )
    rows = [
        (draw(st.integers(0, 100)), draw(st.integers(1, max(1, M // 3))), draw(st.integers(1, max(1, M // 3))))
        for _ in range(draw(st.integers(1, 40)))
    ]
    return rule, params, fixed_arrivals(sorted(rows))


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_servers(), steps=st.none() | st.integers(1, 300))
def test_the_step_log_is_the_reference_s(case: tuple[Sglang, ModelParams, ArrivalPlan], steps: int | None) -> None:
    """SGLang's lifecycle: every field of every step (the ratio bit for bit) and every request's
    outcome, as ``kvstab empirical compare --sglang`` and the cross-check read them."""
    rule, params, plan = case
    ref = replay_sglang_model(plan, rule, params, steps, max_steps=4000, engine="reference")
    fast = replay_sglang_model(plan, rule, params, steps, max_steps=4000)
    assert fast.engine == "fast" and ref.engine == "reference"
    assert ref.first_difference(fast) is None, ref.first_difference(fast)
    assert len(ref.steps) == len(fast.steps)
    kinds = {st.kind for st in ref.steps}
    event("retraction" if any(ref.retractions) else "no retraction")
    event("idle steps" if "idle" in kinds else "no idle step")
    event("chunked prefill" if any(st.kind == "prefill" and st.queue and st.batch_is_full for st in ref.steps) else "-")


def test_a_subclass_replays_on_the_reference_engine() -> None:
    class Mine(Sglang):
        pass

    plan = fixed_arrivals([(0, 20, 30), (2, 40, 10)])
    server = ModelParams(M=256, chunk=64)
    log = replay_sglang_model(plan, Mine(), server)
    assert log.engine == "reference"
    assert log.first_difference(replay_sglang_model(plan, Sglang(), server)) is None
    with pytest.raises(InvalidArgument, match="no compiled path"):
        replay_sglang_model(plan, Mine(), server, engine="fast")


def test_refusals_are_the_reference_s() -> None:
    """A prompt SGLang refuses, or one its clip leaves no output, fails as on the reference engine."""
    rule, params = Sglang(), ModelParams(M=256, chunk=64)
    for bad, paged in (((3, 250, 10), params), ((3, 230, 40), ModelParams(M=256, chunk=64, block=16))):
        plan = fixed_arrivals([(0, 20, 30), bad])
        msgs = []
        for engine in ("reference", "fast"):
            with pytest.raises(InvalidArgument) as exc:
                replay_sglang_model(plan, rule, paged, engine=engine)
            msgs.append(str(exc.value))
        assert msgs[0] == msgs[1]
    # a refused request after the horizon never arrives, on either engine
    plan = fixed_arrivals([(0, 20, 30), (50, 250, 10)])
    assert (
        replay_sglang_model(plan, rule, params, 40).first_difference(
            replay_sglang_model(plan, rule, params, 40, engine="reference")
        )
        is None
    )


# --- the float tests at their boundary, from hand-built states
def _both(rule: Sglang, params: ModelParams, active: list[tuple[int, int, int]], waiting: list[tuple[int, int]],
          ratio: float, slots: int) -> tuple[dict[str, np.ndarray], dict[str, int], Engine]:  # fmt: skip
    """``slots`` steps of the reference engine and of the compiled one from the same loaded state
    (kvstab's lifecycle); the per-slot rows must agree (``arrived`` aside: a loaded queue is
    no arrival here); returns the compiled rows and work counters, and the reference engine."""
    eng = Engine(rule, params)
    eng.load_state(active=active, waiting=waiting, sched_state=(ratio, 0))
    for _ in range(slots):
        eng.step()
    ref = eng.result()
    plan = fixed_arrivals([(0, s, o) for s, o, _ in active] + [(0, s, o) for s, o in waiting])
    state = sgl._State(rule, params, plan, plan.o)
    state.load(active, waiting, (ratio, 0))
    out = np.zeros((9, slots), dtype=np.int64)
    assert state.step(KS.KVSTAB_LIFE, True, slots, False, 0, out) == K.REACHED
    state.sync()
    rows = dict(zip(ROWS, out))
    for f in ROWS[1:]:
        assert np.array_equal(getattr(ref, f), rows[f]), (f, getattr(ref, f), rows[f])
    for f, row in (("finish", KS.G_FIN), ("served", KS.G_SERVED), ("preemptions", KS.G_NPRE)):
        assert np.array_equal(getattr(ref, f), state.R[row]), f
    return rows, state.work(), eng


def test_pythons_float_sum_sizes_the_chunk() -> None:
    """Ten decoders reserve ``min(s + o − p, clip) · 0.1 = 0.1`` each: Python's sum is
    0.9999999999999999, the exact one 1.0000000000000000555 (0.1 is above a tenth), and with
    2 tokens free the chunk is ``min(rem_chunk, ⌊2 − sum⌋)``: 1 token in floats, 2 exactly.
    The engine decides from its exact aggregate only outside the rounding bound; here it
    recomputes the sum in Python's order and takes Python's branch."""
    ratio = 0.1
    assert sum([ratio] * 10) < 1 < 10 * Fraction(ratio)
    assert int(np.floor(2 - sum([ratio] * 10))) == 1 and 2 - 10 * Fraction(ratio) < 1
    rule, params = Sglang(clip_max_new_tokens=1), ModelParams(M=13, chunk=4)
    active = [(1, 1, 1)] * 10 + [(5, 1, 1)]  # ten decoders, then a prompt in flight
    rows, work, _ = _both(rule, params, active, [], ratio, 8)
    assert rows["tokens"][0] == 1  # Python's branch (the exact sum would chunk 2 tokens)
    assert work["exact_sums"] >= 1


@pytest.mark.parametrize(("M", "admitted"), [(13, 0), (14, 1)])
def test_an_exact_tie_at_the_admission_boundary_refuses(M: int, admitted: int) -> None:
    """Two decoders reserve 4 · 0.5 = 2.0 each (exact in floats): with 11 tokens free the head
    needs ``2 + min(3 + 1, clip) + 1 = 7 < 11 − 4.0``, a tie, refused (and the flag set); one
    token more and it is admitted.  Within the rounding bound, the engine recomputes."""
    rows, work, eng = _both(Sglang(), ModelParams(M=M, chunk=64), [(1, 4, 1), (1, 4, 1)], [(2, 3)], 0.5, 6)
    assert rows["admitted"][0] == admitted
    if not admitted:
        assert work["exact_sums"] >= 1
        assert eng.records[0].state[1] == 1  # batch_is_full: no prefill is tried until a request leaves


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_servers(), slots=st.integers(1, 400), life=st.sampled_from(["kvstab", "sglang"]))
def test_the_state_after_quiet_stretches_is_the_reference_s(
    case: tuple[Sglang, ModelParams, ArrivalPlan], slots: int, life: str
) -> None:
    """Skipped stretches apply the ratio's decay one float operation a step (and an idle
    stretch its reset): after a streamed run the ratio is the reference's bit for bit, and so
    is the flag."""
    rule, params, plan = case
    eng = SglangEngine(rule, params) if life == "sglang" else Engine(rule, params)
    eng.run(plan, slots)
    po = sgl.sglang_lengths(rule, params, plan, len(plan)) if life == "sglang" else plan.o
    state = sgl._State(rule, params, plan, po)
    status = state.step(KS.SGLANG_LIFE if life == "sglang" else KS.KVSTAB_LIFE, True, slots, False, 0,
                        np.zeros((9, 0), dtype=np.int64))  # fmt: skip
    assert status == K.REACHED and state.t == slots
    assert (float(state.fs[KS.FS_RATIO]), int(state.st[KS.S_FULL])) == eng.sched_state
    event("stretches skipped" if state.work()["skipped_slots"] else "no stretch")


def test_a_compensated_float_sum_declines_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Python's ``sum`` compensates (CPython >= 3.12), the kernel's sequential sum would not be
    the rule's: the run takes the reference engine and says why."""
    monkeypatch.setattr(sgl, "SEQUENTIAL_FLOAT_SUM", False)
    rule, params = Sglang(), ModelParams(M=256, chunk=64)
    plan = fixed_arrivals([(0, 20, 30), (2, 40, 10)])
    from kvstab.engine import run

    out = run(rule, params, plan, 50, lifecycle="sglang")
    assert out.engine == "reference" and "compensates" in out.reason
    assert replay_sglang_model(plan, rule, params, 50).engine == "reference"


def test_the_sglang_kernel_is_rebuilt_when_the_kernel_it_inlines_changes() -> None:
    """numba keys ``run_sglang``'s cache by the text of ``_kernel_sglang.py`` alone, and it
    inlines ``_kernel``'s helpers: the hash of ``_kernel.py`` written there makes a change to
    them change this kernel's text.  After editing ``_kernel.py``, write
    ``sha256sum kvstab/engine/_kernel.py | cut -c1-16`` into ``_kernel_sglang.KERNEL_SHA``."""
    import hashlib
    from pathlib import Path

    assert hashlib.sha256(Path(K.__file__).read_bytes()).hexdigest()[:16] == KS.KERNEL_SHA
