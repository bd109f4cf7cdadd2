"""The encoding checks itself: one encoded slot against ``Engine.step``.

Every rule the suite knows — the built-ins, the negative control and the
mutants in ``tests/mutants/`` — is encoded once per setting and evaluated on
concrete states drawn by Hypothesis (10 500 in all), comparing every state
variable after the slot: the active list with each request's progress, the
queue in order, the memory charged, the tokens processed, the requests run.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutants import MUTANTS

import kvstab.proofs.encoding as encoding
from kvstab.contract import state_vars_of
from kvstab.model import progress_after, tokens_held
from kvstab.proofs.encoding import Setting
from kvstab.proofs.selfcheck import CompiledStep, Concrete, compare, engine_step
from kvstab.registry import builtin_names, load_scheduler

RULES = tuple(builtin_names(include_negative=True)) + tuple(f"mutants.{m}:SCHEDULER" for m in MUTANTS)
SETTINGS = (
    Setting(M=None, chunk=4, block=1),
    Setting(M=None, chunk=3, block=2, token_budget=5, max_num_seqs=3),
)
K, Q = 3, 3
#: states per drawn batch and batches per (rule, setting): 15 rules × 2 × 7 × 50 = 10 500
BATCH, BATCHES = 50, 7


def state_of(words: list[int], block: int) -> Concrete:
    """A state the engine can hold, made from Hypothesis-drawn integers by
    arithmetic (no filtering, so drawing stays cheap): peaks fit in ``M``,
    active progress inside ``(0, s + o)``."""
    it = iter(words)
    M = 4 + next(it) % 45

    def lengths() -> tuple[int, int]:
        s = 1 + next(it) % min(16, M - 1)
        # the largest o whose block-rounded peak still fits
        most = max(o for o in range(1, 11) if o == 1 or tokens_held(s + o, block) <= M)
        return (s, 1 + next(it) % most) if tokens_held(s + 1, block) <= M else (1, 1)

    active = []
    for _ in range(next(it) % (K + 1)):
        s, o = lengths()
        active.append((s, o, 1 + next(it) % (s + o - 1)) if s + o > 1 else (1, 1, 1))
    waiting = tuple(lengths() for _ in range(next(it) % (Q + 1)))
    return M, tuple(active), waiting


#: integers one state consumes at most: M, two counts, 3 per active, 2 per queued
WORDS = 3 + 3 * K + 2 * Q


@functools.cache
def compiled(rule: str, i: int) -> CompiledStep:
    return CompiledStep(load_scheduler(rule), SETTINGS[i], K, Q)


@pytest.mark.parametrize("i", range(len(SETTINGS)))
@pytest.mark.parametrize("rule", RULES)
def test_encoding_matches_the_engine(rule: str, i: int) -> None:
    step = compiled(rule, i)
    seen: list[int] = []
    # a real state starts at a multiple of 1/64, exact in floats: the encoding reasons in
    # rationals and the engine in floats, and at sglang's initial ratio 0.7 they part on a
    # rounding boundary (1·0.7 + 9·0.7 is 7.0 in floats, 7 − 2⁻⁵⁰·… exactly: an admission
    # test `17 < 25 − 7` then differs) — the limit docs/proofs.md states, not an encoding bug
    svars = state_vars_of(step.scheduler)
    start = tuple(round(v.initial * 64) / 64 if v.real else v.initial for v in svars)

    @settings(max_examples=BATCHES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.integers(0, 2**16), min_size=BATCH * WORDS, max_size=BATCH * WORDS))
    def check(words: list[int]) -> None:
        for k in range(BATCH):
            state = state_of(words[k * WORDS : (k + 1) * WORDS], SETTINGS[i].block)
            if svars:
                state = (*state, start)  # type: ignore[assignment]
            diff = compare(step(state), engine_step(step.scheduler, step.setting, state))
            assert not diff, f"{rule} on M={state[0]}, active {state[1]}, queue {state[2]}: " + "; ".join(diff)
            seen.append(1)

    check()
    assert len(seen) >= BATCH * BATCHES  # the count the module docstring promises


def test_the_compiled_terms_are_z3s_terms() -> None:
    """The compiler agrees with z3's own simplification of the substituted terms."""
    step = compiled("vllm-v1", 1)
    for state in [(20, ((5, 3, 4), (2, 2, 1)), ((3, 2), (7, 1))), (9, ((4, 4, 7),), ((4, 1),)), (30, (), ((6, 6),))]:
        assert step.by_z3(state) == step(state)


def test_a_broken_encoding_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: an encoding whose prefill advances one token too far disagrees."""

    def off_by_one(s, p, chunk, grant=None, ops=None):  # type: ignore[no-untyped-def]
        return progress_after(s, p, chunk, grant, ops) + ops.ite(ops.lt(p, s), 1, 0)

    monkeypatch.setattr(encoding, "progress_after", off_by_one)
    step = CompiledStep(load_scheduler("current-fit"), SETTINGS[0], K, Q)
    state: Concrete = (40, ((10, 3, 4),), ((5, 2),))
    assert compare(step(state), engine_step(step.scheduler, step.setting, state))
