"""The event-driven compiled engine's own corners, each against the reference engine.

``tests/test_engine_differential.py`` compares every built-in on small servers;
here the scenarios are built to reach what the event engine adds: long quiet
stretches skipped in one jump (ending at an arrival, a completion, an overflow
inside a block period, a refused ``lookahead`` head's wake slot), the closed
forms behind them, and decoders the token budget stalls (which a run from the
empty system does not reach: only the newest, cut-short prefill goes past the
budget — so that path is driven from a loaded state, as
:meth:`kvstab.simulator.Engine.load_state` loads one).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_engine_differential import FIELDS, SCALE, TABLE_MODES, _same

from kvstab.arrivals import ArrivalPlan, fixed_arrivals
from kvstab.engine import _finish_tree as FT
from kvstab.engine import _kernel as K
from kvstab.engine import _layout, driver, run
from kvstab.engine._drive import Reporting
from kvstab.engine.driver import finish_table
from kvstab.errors import InvariantViolation
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.simulator import Engine, Horizon, SimResult

COMPILED = ["current-fit", "current-fit-no-preempt", "reserve", "lookahead", "vllm-v1"]


def _work(
    rule: str, params: ModelParams, plan: ArrivalPlan, slots: int | None, *, drain: bool = False, check: bool = True
) -> tuple[SimResult, dict[str, int]]:
    """The fast engine's result and what it did (slots run one by one, skipped, stalls, tests)."""
    work: dict[str, int] = {}
    pol = driver.fast_rule(load_scheduler(rule))
    assert pol is not None
    h = Horizon(slots, drain, 10**6)
    _, res = driver._run_fast(pol, rule, params, plan, h, Reporting(), check, "kvstab", work=work)
    assert res is not None
    return res, work


# --- the closed forms, against the sums they replace
def _phases(rng: np.random.Generator, B: int, n: int) -> tuple[np.ndarray, list[int]]:
    ds = [int(x) for x in rng.integers(-50, 50, size=n)]
    ph = np.zeros(B, dtype=np.int64)
    for d in ds:
        ph[d % B] += 1
    return ph, ds


@pytest.mark.parametrize("B", [1, 2, 3, 4, 7, 16])
def test_closed_forms_are_the_sums(B: int) -> None:
    """Area, lazy memory after L slots, its sum over L slots and the first overflow slot are
    what stepping the decoders slot by slot gives."""
    rng = np.random.default_rng(B)
    held = lambda p: -(-p // B) * B  # noqa: E731
    for p0 in range(0, 40):
        for k in range(0, 40):
            assert K._area(p0, k, B) == sum(held(p0 + j) for j in range(1, k + 1))
    for _ in range(60):
        n = int(rng.integers(0, 9))
        ph, ds = _phases(rng, B, n)
        t = int(rng.integers(51, 200))  # every progress d + t stays positive
        DL = sum(held(d + t) for d in ds)
        for L in (0, 1, 2, B - 1, B, B + 1, 3 * B + 2, 50):
            if L < 0:
                continue
            posts = [sum(held(d + t + j + 1) for d in ds) for j in range(L)]
            assert K._dl_advance(DL, n, t, L, B, ph) == sum(held(d + t + L) for d in ds)
            assert K._post_sum(DL, n, t, L, B, ph) == sum(posts)
        for M in (DL, DL + 1, DL + B * n + 3, DL + 5 * B * n + 1):
            limit = t + 400
            first = next((t + j for j in range(400) if sum(held(d + t + j + 1) for d in ds) > M), limit)
            assert K._overflow(DL, n, t, limit, M, B, ph) == first


# --- quiet stretches that end at each kind of event
@settings(max_examples=60 * SCALE, deadline=None)
@given(data=st.data(), rule=st.sampled_from(COMPILED))
def test_long_quiet_stretches_match_the_reference(data: st.DataObject, rule: str) -> None:
    """Few long requests on a roomy server: most slots are skipped, and every stretch ends at
    an arrival, a completion, an overflow (inside a block period when B > 1) or a wake slot."""
    B = data.draw(st.sampled_from([1, 2, 4, 16]))
    M = data.draw(st.integers(8 * B, 400))
    chunk = data.draw(st.integers(1, 64))
    horizon = data.draw(st.integers(50, 600))
    rows = []
    for _ in range(data.draw(st.integers(1, 10))):
        slot = data.draw(st.integers(0, horizon))
        s = data.draw(st.integers(1, M // 3))
        o = data.draw(st.integers(1, max(1, M // B * B - s)))
        rows.append((slot, s, o))
    plan = fixed_arrivals(rows)
    params = ModelParams(M=M, chunk=chunk, block=B)
    check = rule != "current-fit-no-preempt"
    ref = run(load_scheduler(rule), params, plan, horizon, engine="reference", check=check).result
    with finish_table(data.draw(st.sampled_from(TABLE_MODES))):
        fast, work = _work(rule, params, plan, horizon, check=check)
    assert ref is not None
    _same(ref, fast)
    event("stretches skipped" if work["skipped_slots"] else "no stretch")
    if ref.preemptions.any():
        event("preempted after a stretch" if work["skipped_slots"] else "preempted")


def test_a_stretch_ends_at_an_arrival_into_an_empty_queue() -> None:
    """The arrival is admitted in its own slot, after a stretch of lone decoding."""
    params = ModelParams(M=200, chunk=8, block=4)
    plan = fixed_arrivals([(0, 5, 60), (23, 7, 30), (24, 3, 3)])
    for rule in COMPILED:
        ref = run(load_scheduler(rule), params, plan, 120, engine="reference").result
        fast, work = _work(rule, params, plan, 120)
        assert ref is not None and ref.first_admit[1] == 23
        _same(ref, fast)
        assert work["skipped_slots"] > 60, work


@pytest.mark.parametrize("B", [1, 4, 16])
def test_overflow_inside_a_block_period_preempts_in_its_slot(B: int) -> None:
    """current-fit and vllm-v1: decoders grow into M after a skipped stretch; the victim is
    preempted in the very slot the reference preempts it."""
    params = ModelParams(M=16 * 13, chunk=4, block=B)
    plan = fixed_arrivals([(0, 3, 150), (0, 5, 150), (2, 9, 150), (40, 2, 5)])
    for rule in ("current-fit", "vllm-v1"):
        ref = run(load_scheduler(rule), params, plan, 400, engine="reference").result
        fast, work = _work(rule, params, plan, 400)
        assert ref is not None and ref.preemptions.any()
        _same(ref, fast)
        assert work["skipped_slots"] > 0 and work["preemptions"] == int(ref.preemptions.sum())


@pytest.mark.parametrize("mode", [TABLE_MODES[0], TABLE_MODES[-1]], ids=["tree", "table"])
def test_lookahead_sleeps_until_its_head_can_pass(mode: tuple[int, int] | None) -> None:
    """A refused lookahead head is tested again only at its wake slot, not every slot:
    far fewer tests than slots it waited, the same outcome (the table kept in the finish
    tree, and as the O(n) table)."""
    params = ModelParams(M=120, chunk=8)
    plan = fixed_arrivals([(0, 20, 80), (1, 30, 60), (2, 10, 90), (3, 40, 30), (4, 5, 100), (5, 50, 20)])
    ref = run(load_scheduler("lookahead"), params, plan, drain=True, engine="reference").result
    with finish_table(mode):
        fast, work = _work("lookahead", params, plan, None, drain=True)
    assert ref is not None
    _same(ref, fast)
    waited = int((ref.first_admit - ref.arrival).sum())
    assert waited > 100 and work["lookahead_tests"] < waited // 5, (waited, work)


def test_drained_runs_skip_to_the_end_exactly() -> None:
    """drain=True with a minimum horizon past the last completion: the idle tail is skipped
    in one jump and the run ends where the reference ends."""
    params = ModelParams(M=64, chunk=8, block=2)
    plan = fixed_arrivals([(0, 5, 20), (3, 4, 8), (500, 2, 2)])
    for rule in COMPILED:
        ref = run(load_scheduler(rule), params, plan, 900, drain=True, engine="reference").result
        fast, work = _work(rule, params, plan, 900, drain=True)
        assert ref is not None and ref.slots == 900
        _same(ref, fast)
        assert work["full_slots"] < 40, work


# --- decoders the token budget stalls (from a loaded state)
def _loaded(params: ModelParams, active: list[tuple[int, int, int]], waiting: list[tuple[int, int]]) -> driver._State:
    """A fresh engine state holding ``active`` (``(s, o, progress)``, admission order) and
    ``waiting`` (arriving in slot 0), as ``Engine.load_state`` holds it."""
    plan = fixed_arrivals([(0, s, o) for s, o, _ in active] + [(0, s, o) for s, o in waiting])
    state = driver._State(plan)
    B = params.block
    state.ph = np.zeros(B, dtype=np.int64)
    R, st = state.R, state.st
    nL = CL = DL = hn = ne = 0
    prev = -1
    for r, (s, o, p) in enumerate(active):
        R[K.F_S, r], R[K.F_O, r] = s, o
        R[K.F_PRV, r] = prev
        if prev >= 0:
            R[K.F_NXT, prev] = r
        else:
            st[K.ST_AH] = r
        prev = r
        if p >= s:
            nL, CL, DL, hn = K._lazy_add(R, state.hk, state.hid, state.ph, r, p, 0, B, nL, CL, DL, hn)
        else:
            R[K.F_MODE, r], R[K.F_PROG, r], R[K.F_EPOS, r] = K.M_EXPL, p, ne
            state.elist[ne] = r
            ne += 1
    st[_layout.ST_AT] = prev
    st[_layout.ST_NA], st[_layout.ST_I] = len(active), len(active)
    st[_layout.ST_NL], st[_layout.ST_CL], st[_layout.ST_DL], st[_layout.ST_HN], st[_layout.ST_NE] = nL, CL, DL, hn, ne
    return state


@pytest.mark.parametrize("B", [1, 4])
def test_decoders_past_the_budget_hold_without_working(B: int) -> None:
    """vllm-v1 with an old prefill that spends the budget: the lazy decoders behind it are
    stepped explicitly (grant 0) in those slots, and everything is the reference's."""
    params = ModelParams(M=400, chunk=8, block=B, token_budget=9)
    active = [(3, 30, 5), (60, 10, 4), (2, 40, 9), (4, 25, 6), (1, 50, 3)]
    waiting = [(5, 5), (7, 3)]
    slots = 150
    eng = Engine(load_scheduler("vllm-v1"), params)
    eng.load_state(active=active, waiting=waiting)
    for _ in range(slots):
        eng.step()
    ref = eng.result()
    state = _loaded(params, active, waiting)
    out = np.zeros((K.NCOLS, slots), dtype=np.int64)
    status = state.step(K.VLLM_V1, K.KVSTAB_LIFE, params, True, False, slots, False, 0, out)
    assert status == K.REACHED
    state.sync()
    cols = dict(zip(K.COLUMNS, out))
    for f in FIELDS[:9]:
        assert np.array_equal(getattr(ref, f), cols[f]), f
    for f, mine in (("first_admit", state.first), ("finish", state.fin), ("served", state.served),
                    ("preemptions", state.npre), ("s", state.s), ("o", state.o)):  # fmt: skip
        assert np.array_equal(getattr(ref, f), mine), f
    work = state.work()
    assert work["budget_stalls"] > 0 and work["budget_slots"] > 0, work


def test_a_violation_after_a_stretch_is_reported_at_its_slot() -> None:
    """The negative control overflows M after a long quiet stretch: the same slot, memory and
    running requests as the reference."""
    params = ModelParams(M=100, chunk=8, block=4)
    plan = fixed_arrivals([(0, 4, 90), (1, 4, 90)])
    outs = []
    for engine in ("reference", "fast"):
        with pytest.raises(InvariantViolation) as exc:
            run(load_scheduler("current-fit-no-preempt"), params, plan, 200, engine=engine)  # type: ignore[arg-type]
        outs.append((exc.value.slot, exc.value.memory, exc.value.requests, str(exc.value)))
    assert outs[0] == outs[1] and outs[0][0] > 40


def test_huge_blocks_step_every_request_explicitly() -> None:
    """Above LAZY_BMAX the phase histogram would be too large: every running request is stepped
    slot by slot (the slot loop's cost), with the reference's outcome."""
    B = K.LAZY_BMAX + 3
    params = ModelParams(M=4 * B, chunk=4, block=B)
    plan = fixed_arrivals([(0, 5, 20), (1, 9, 30), (2, 3, 12), (2, 6, 40), (3, 2, 9), (30, 4, 4)])
    for rule in COMPILED:
        ref = run(load_scheduler(rule), params, plan, 80, engine="reference").result
        fast, work = _work(rule, params, plan, 80)
        assert ref is not None
        _same(ref, fast)
        assert work["explicit_steps"] == int(ref.running.sum()), work  # every running request, every slot


# --- lookahead's finish tree (kvstab/engine/_finish_tree.py) against brute force
def test_finish_tree_answers_what_brute_force_does() -> None:
    """Random range heats (``h·E + c``), points set and cleared, on a ring whose window wraps:
    the tree's range maximum (and the slot holding it), first present slot and point values
    are a dict's; the profile's value at a slot is the sum of its entries."""
    rng = np.random.default_rng(7)
    W = FT.MIN_W
    H = W // 2
    tree = FT.new(W)
    V: dict[int, int] = {}  # present slot -> V
    t = 0
    for step in range(3000):
        t += int(rng.integers(0, 3))  # the window [t, t + H) moves on and wraps the ring
        for E in [E for E in V if E < t]:
            del V[E]
            FT.tree_clear(tree, E)
        op = int(rng.integers(0, 6))
        lo = t + int(rng.integers(0, H))
        hi = min(t + H - 1, lo + int(rng.integers(0, H)))
        if op <= 1:
            E = t + int(rng.integers(0, H))
            if E in V and op == 1:
                del V[E]
                FT.tree_clear(tree, E)
            else:
                V[E] = int(rng.integers(0, 400))  # close values: lines cross after a few heats
                FT.tree_set(tree, E, V[E])
        elif op <= 3:
            h, c = int(rng.integers(0, 2)), int(rng.integers(-50, 200))
            FT.tree_add(tree, lo, hi, h, c)
            for E in V:
                if lo <= E <= hi:
                    V[E] += h * E + c
        else:
            inside = [E for E in V if lo <= E <= hi]
            v, e = FT.tree_max(tree, lo, hi)
            if not inside:
                assert (v, e) == (FT.NEG, -1)
            else:
                assert v == max(V[E] for E in inside) and V[e] == v and lo <= e <= hi, step
            assert FT.tree_first(tree, lo, hi) == (min(inside) if inside else -1)
        if V and step % 7 == 0:
            E = sorted(V)[int(rng.integers(0, len(V)))]
            assert FT.tree_get(tree, E) == V[E]
    # the profile: entries anywhere in the live window, points at slots from t on
    prof = FT.new(W)
    t = 5 * W + 3
    entries: list[tuple[int, int, int]] = []
    points: dict[int, int] = {}
    for _ in range(300):
        E, coef, const = t - H + int(rng.integers(0, W)), int(rng.integers(-3, 4)), int(rng.integers(-99, 99))
        FT.profile_add(prof, E, coef, const)
        entries.append((E, coef, const))
        P, pv = t + int(rng.integers(0, H)), int(rng.integers(-9, 9))
        FT.profile_point(prof, P, pv)
        points[P] = points.get(P, 0) + pv
        Q = t + int(rng.integers(0, H))
        want = sum(coef * Q + const for E2, coef, const in entries if E2 <= Q) + points.get(Q, 0)
        assert FT.profile_at(prof, t, Q) == want


def _brute_test(
    actives: list[tuple[int, int, int]], t: int, s: int, o: int, chunk: int, B: int, M: int
) -> tuple[bool, int]:
    """``lookahead``'s test from its definition: every finish slot up to the head's own and
    the head's own total, each the sum of the projections (``K._proj_held``) alive there."""
    fc = t + -(-s // chunk) + o - 1

    def total(E: int) -> int:
        return sum(K._proj_held(sa, oa, ta, E, chunk, B) for ta, sa, oa in actives)

    own = total(fc) + K._proj_held(s, o, t, fc, chunk, B)
    ok = own <= M
    for ta, sa, oa in actives:
        F = ta + -(-sa // chunk) + oa - 1
        ok = ok and total(F) + (K._proj_held(s, o, t, F, chunk, B) if F <= fc else 0) <= M
    return ok, own


def _table_out_and_back(tree: np.ndarray, actives: list[tuple[int, int, int]], chunk: int, B: int, M: int) -> None:
    """Move the tree's totals into a request table (``K._la_to_table``): each is the definition's,
    and the tree is left empty; then move them back (``K._la_to_tree``)."""
    R = np.zeros((K.NF, max(1, len(actives))), dtype=np.int64)
    for q, (ta, sa, oa) in enumerate(actives):
        R[K.F_TA, q], R[K.F_S, q], R[K.F_O, q] = ta, sa, oa
        R[K.F_FSLOT, q] = ta + -(-sa // chunk) + oa - 1
        R[K.F_NXT, q] = q + 1 if q + 1 < len(actives) else -1
    ah = 0 if actives else -1
    K._la_to_table(tree, R, ah, chunk, B)
    for q in range(len(actives)):
        F = int(R[K.F_FSLOT, q])
        assert R[K.F_TF, q] == sum(K._proj_held(sa, oa, ta, F, chunk, B) for ta, sa, oa in actives)
    assert not tree[:, [FT.PCOEF, FT.PCONST, FT.PPOINT, FT.CNT]].any() and tree[1, FT.MV] == FT.NEG
    K._la_to_tree(tree, R, ah, chunk, B)


@pytest.mark.parametrize("B", [1, 3, 16])
def test_lookahead_tree_test_is_the_rules_on_random_states(B: int) -> None:
    """Admissions and completions on random servers: the tree's test (``K._la_test``) gives the
    definition's answer and total, and a refused head's wake slot is never later than the
    first slot in which it would pass with the same actives; the table moved out of the tree
    and back now and then holds the definition's totals."""
    rng = np.random.default_rng(B)
    for trial in range(30):
        M = int(rng.integers(40, 400)) // B * B + int(rng.integers(0, B))
        chunk = int(rng.integers(1, 30))
        tree = FT.new(FT.MIN_W)
        actives: list[tuple[int, int, int]] = []
        t = int(rng.integers(0, 3 * FT.MIN_W))
        for _ in range(60):
            t += int(rng.integers(0, 4))
            for ta, sa, oa in [a for a in actives if a[0] + -(-a[1] // chunk) + a[2] - 1 < t]:
                K._la_release(tree, ta + -(-sa // chunk) + oa - 1, ta, sa, oa, chunk, B)
                actives.remove((ta, sa, oa))
            if rng.integers(0, 8) == 0:
                _table_out_and_back(tree, actives, chunk, B, M)
            s = int(rng.integers(1, 60))
            o = int(rng.integers(0, 60))
            if K.held(s + o, B) > M:
                continue
            ok, wake, fc, own = K._la_test(tree, t, s, o, chunk, B, M)
            want_ok, want_own = _brute_test(actives, t, s, o, chunk, B, M)
            assert (ok, own) == (want_ok, want_own), (trial, t, s, o)
            if ok:
                K._la_admit(tree, t, s, o, chunk, B, fc, own)
                actives.append((t, s, o))
            else:
                first = next(u for u in range(t, t + 400) if _brute_test(actives, u, s, o, chunk, B, M)[0])
                assert t < wake <= first, (trial, t, wake, first)


def test_the_kernel_is_rebuilt_when_the_finish_tree_changes() -> None:
    """numba keys ``run_builtins``'s cache by the text of ``_kernel.py`` alone: the hash of
    ``_finish_tree.py`` written there makes a change to the tree change the kernel's text.
    After editing ``_finish_tree.py``, write ``sha256sum kvstab/engine/_finish_tree.py | cut -c1-16``
    into ``_kernel.FINISH_TREE_SHA``."""
    import hashlib
    from pathlib import Path

    text = Path(FT.__file__).read_bytes()
    assert hashlib.sha256(text).hexdigest()[:16] == K.FINISH_TREE_SHA


def test_every_kernel_guard_hash_is_current() -> None:
    """Each compiled module's GUARDS name the files whose helpers it inlines, with their hashes:
    a stale one means numba's cache would keep code compiled from an older helper."""
    from kvstab.engine import _guards as G
    from kvstab.engine import _kernel_cache as KC
    from kvstab.engine import _kernel_sglang as KS
    from kvstab.engine import _layout as L
    from kvstab.engine import _plugin_kernel as PK
    from kvstab.engine import _skeleton as S
    from kvstab.fleet import _fleet_kernel as FK  # the fleet's loop compiles the built-ins' kernel in too

    guards = K.GUARDS + KS.GUARDS + PK.GUARDS + G.GUARDS + KC.GUARDS + S.GUARDS + FK.GUARDS
    assert {name for name, _ in guards} >= {"_finish_tree.py", "_layout.py", "_kernel.py", "_opcodes.py", "_skeleton.py"}
    assert not L.stale(guards), L.stale(guards)
