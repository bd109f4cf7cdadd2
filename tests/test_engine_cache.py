"""The compiled engine with prefix caching against the reference engine: identical outcomes.

``kvstab.engine.cached`` runs vLLM's block pool in numba; the reference engine
(``kvstab/prefix_cache.py``) is the definition.  Every per-slot column and every
per-request outcome must agree, for every rule the compiled path carries, under kvstab's
and vLLM's lifecycles, on random small servers (eviction and preemption all the time) with
prompts drawn from a few shared segments, and on the prefix laws' workloads (shared
prompts, tenants, few-shot templates, conversations) on a pool small enough to evict.
``lookahead`` runs with its finish-time table in the O(n) table, in the finish tree, and
moved between the two at every test.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.contract import ActiveEntry, View, WaitingEntry
from kvstab.engine import _finish_tree
from kvstab.engine import run as engine_run
from kvstab.engine.cached import run_cached
from kvstab.engine.driver import finish_table
from kvstab.errors import InvariantViolation
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.model import ModelParams
from kvstab.ops import CONCRETE
from kvstab.prefix import Prompt, PromptSet, block_hashes, chain_constants, content_id, segment_digests
from kvstab.registry import load_scheduler
from kvstab.schedulers.lookahead import Lookahead
from kvstab.simulator import SimResult, simulate
from kvstab.workload import parse_workload

#: every rule the compiled pool carries
RULES = ["vllm-v1", "current-fit", "reserve", "lookahead"]
#: where ``lookahead`` keeps its finish-time table (``_finish_tree.FORCE``): in the tree from the
#: first request; moved between the table and the tree at every test while 2 run; as shipped
TABLE_MODES: list[tuple[int, int] | None] = [(0, -1), (2, 2), None]




FIELDS = (
    "arrived", "admitted", "preempted", "completed", "running", "memory", "wasted", "tokens", "queue",
    "s", "o", "arrival", "first_admit", "finish", "preemptions", "served", "request_wasted",
)  # fmt: skip


def _same(ref: SimResult, fast: SimResult) -> None:
    assert ref.slots == fast.slots, (ref.slots, fast.slots)
    for f in FIELDS:
        a, b = getattr(ref, f), getattr(fast, f)
        if a.shape != b.shape or not np.array_equal(a, b):
            i = int(np.flatnonzero(a != b)[0]) if a.shape == b.shape else -1
            raise AssertionError(f"{f} differs first at {i}: reference {a[max(i, 0):i + 4]}, fast {b[max(i, 0):i + 4]}")


def _prompts(rng: np.random.Generator, n: int, most: int) -> PromptSet:
    """A few shared segments at every depth, whole prompts shared too."""
    system = [(content_id("shared", 7_000 + k), int(rng.integers(1, most))) for k in range(3)]
    template = [(content_id("fewshot", 7_000 + k), int(rng.integers(1, most))) for k in range(3)]
    out = []
    for i in range(n):
        segs = [system[int(rng.integers(0, 3))]]
        if rng.random() < 0.6:
            segs.append(template[int(rng.integers(0, 3))])
        if rng.random() < 0.7:
            segs.append((content_id("message", 7_000 + i), int(rng.integers(1, most))))
        out.append(Prompt(tuple(segs)))
    return PromptSet.from_prompts(out, output=None if rng.random() < 0.5 else
                                  [content_id("answer", int(k)) for k in rng.integers(0, 4, n)])


def _case(seed: int, rule: str, life: str) -> tuple[ModelParams, ArrivalPlan]:
    rng = np.random.default_rng(seed)
    B = int(rng.choice([1, 2, 4, 16]))
    blocks = int(rng.integers(12, 90))
    vllm = rule == "vllm-v1"
    budget = int(rng.choice([8, 32, 128])) if vllm else None
    seqs = int(rng.integers(2, 10)) if vllm or rng.random() < 0.5 else None
    chunk = budget if vllm else int(rng.choice([4, 16, 64]))
    params = ModelParams(M=blocks * B, chunk=chunk or 16, block=B, token_budget=budget, max_num_seqs=seqs,
                         bbar=1.0, prefix_caching=True)
    n = int(rng.integers(5, 40))
    prompts = _prompts(rng, n, max(2, blocks * B // 6))
    s = prompts.lengths()
    least = 1 if life == "vllm" else 1
    o = np.array([int(rng.integers(least, max(least + 1, blocks * B - int(x) + 1))) for x in s], dtype=np.int64)
    o = np.minimum(o, blocks * B - s - (0 if life == "vllm" else 0))
    o = np.maximum(o, 1)
    keep = s + o - (1 if life == "vllm" else 0) <= blocks * B
    slot = np.sort(rng.integers(0, 60, n)).astype(np.int64)
    return params, ArrivalPlan(slot[keep], s[keep], o[keep], prompts=prompts.take(keep))


def _reference(rule: str, params: ModelParams, plan: ArrivalPlan, life: str, slots: int | None) -> SimResult:
    if life == "vllm":
        eng = VllmEngine(load_scheduler(rule), params)
        eng.run(plan, slots, drain=slots is None)
        return eng.result(dropped=plan.dropped)
    return simulate(load_scheduler(rule), params, plan, slots, drain=slots is None)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    case=st.sampled_from([("vllm-v1", "kvstab"), ("vllm-v1", "vllm"), ("current-fit", "kvstab"), ("reserve", "kvstab"),
                          ("lookahead", "kvstab")]),
    drain=st.booleans(),
    mode=st.sampled_from(TABLE_MODES),
)
def test_the_compiled_pool_is_the_reference_pool(
    seed: int, case: tuple[str, str], drain: bool, mode: tuple[int, int] | None
) -> None:
    rule, life = case
    params, plan = _case(seed, rule, life)
    slots = None if drain else 150
    try:
        ref = _reference(rule, params, plan, life, slots)
    except InvariantViolation:
        # a rule that never preempts may meet a full pool: the compiled loop must hand over, not guess
        with finish_table(mode):
            assert run_cached(load_scheduler(rule), params, plan, slots, drain=drain, lifecycle=life,
                              max_slots=100_000) is None
        return
    with finish_table(mode):
        out = run_cached(load_scheduler(rule), params, plan, slots, drain=drain, lifecycle=life, max_slots=100_000)
    assert out is not None and out[1] is not None
    _same(ref, out[1])
    # streamed (no rows kept): the same summary as the recorded run's
    with finish_table(mode):
        streamed = run_cached(load_scheduler(rule), params, plan, slots, drain=drain, lifecycle=life,
                              max_slots=100_000, record=False)
    assert streamed is not None and streamed[1] is None
    assert (streamed[0].completed, streamed[0].preemptions) == (out[0].completed, out[0].preemptions)


@pytest.mark.parametrize("rule", RULES)
def test_a_shared_prompt_workload_is_identical_and_hits(rule: str) -> None:
    server = ModelParams(M=4096, chunk=256, block=16, token_budget=256 if rule == "vllm-v1" else None,
                         max_num_seqs=64 if rule == "vllm-v1" else None, bbar=1.0, prefix_caching=True)
    plan = poisson_arrivals(parse_workload("s=U(300,700),o=U(10,200),prefix=shared(256)"), 0.5, server, 600, seed=4)
    ref = simulate(load_scheduler(rule), server, plan, 600)
    out = engine_run(load_scheduler(rule), server, plan, 600)
    assert out.engine == "fast" and out.result is not None
    _same(ref, out.result)
    off = simulate(load_scheduler(rule), replace(server, prefix_caching=False), plan, 600)
    assert ref.tokens.sum() < off.tokens.sum() or ref.completed.sum() > off.completed.sum()


#: the prefix laws (``kvstab.prefix_laws``) on lengths that a pool of 40 blocks of 16 evicts from
LAWS = [
    "s=U(100,200),o=U(5,150),prefix=shared(96)",
    "s=U(40,200),o=U(5,150),prefix=tenants(5,U(16,40),1.0)",
    "s=U(40,200),o=U(5,150),prefix=fewshot(3,16,24,0.5)",
    "s=U(10,60),o=U(5,50),prefix=chat(U(1,5),2)",
]


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("rule", RULES)
def test_the_prefix_laws_on_a_small_pool_are_identical(rule: str, law: str) -> None:
    """Every law's sharing (a system prompt, tenants, templates, a conversation's earlier turns)
    on a pool small enough that cached blocks are evicted, at a load that keeps a queue."""
    vllm = rule == "vllm-v1"
    server = ModelParams(M=640, chunk=64, block=16, token_budget=64 if vllm else None,
                         max_num_seqs=8 if vllm else None, bbar=1.0, prefix_caching=True)
    plan = poisson_arrivals(parse_workload(law), 0.2, server, 300, seed=11)
    ref = simulate(load_scheduler(rule), server, plan, 300)
    modes = TABLE_MODES if rule == "lookahead" else [None]
    for mode in modes:
        with finish_table(mode):
            out = engine_run(load_scheduler(rule), server, plan, 300)
        assert out.engine == "fast" and out.result is not None
        _same(ref, out.result)
    assert int(ref.queue.max()) > 0  # the head waited: the rule's test was the binding one


def _rule_admits(
    actives: list[tuple[int, int, int, int]], now: list[tuple[int, int, int]], t: int, M: int, chunk: int, B: int,
    rng: np.random.Generator,
) -> bool:
    """``lookahead``'s own decision in slot ``t`` for the last of the waiting entries ``now``
    (``(s, o, hit)``; those before it were admitted in this slot), with ``actives`` ``(ta, s, o,
    hit)`` each granted a full unit every slot since its admission, each entry shown with a
    random ``shared`` taken off (the rule must add it back)."""

    def progress(ta: int, sa: int, hit: int) -> int:  # at the start of slot t: the grants of slots ta … t − 1
        p = hit
        for _ in range(t - ta):
            p += min(sa - p, chunk) if p < sa else 1
        return p

    def shared(most: int) -> int:
        return B * int(rng.integers(0, most // B + 1))

    active = []
    for k, (ta, sa, oa, hit) in enumerate(actives):
        p = progress(ta, sa, hit)
        sh = shared(p)
        active.append(ActiveEntry(k, sa - sh, oa, p - sh, True, 0, sh))
    waiting = []
    for k, (sw, ow, hit) in enumerate(now):
        sh = shared(hit)
        waiting.append(WaitingEntry(len(actives) + k, sw - sh, ow, True, 0, hit - sh, sh))
    view = View(tuple(active), tuple(waiting), M, chunk, B, None, None, len(waiting))
    return bool(Lookahead().decide(view, CONCRETE).admit[-1])


@pytest.mark.parametrize("B", [1, 3, 16])
@pytest.mark.parametrize("mode", ["table", "tree", "moving"])
def test_the_kernels_lookahead_test_with_hits_is_the_rules(B: int, mode: str) -> None:
    """The prefix-cache kernel's lookahead test (``_la_admits``) against the rule's own
    ``decide`` on random states: heads with random hits (changing while they wait), several
    admissions in one slot, completions; kept in the O(n) table, in the finish tree, or moved
    between them at every test.  A head the kernel does not test (before its wake slot, same
    hit) is one the rule refuses."""
    from kvstab.engine import _kernel_cache as KC

    rng = np.random.default_rng(B)
    n = 400
    for trial in range(12):
        M = int(rng.integers(80, 600)) // B * B + int(rng.integers(0, B))
        chunk = int(rng.integers(1, 30))
        FT = {"table": np.zeros((1, 1), dtype=np.int64), "tree": _finish_tree.new(_finish_tree.MIN_W, 0, -1),
              "moving": _finish_tree.new(_finish_tree.MIN_W, 2, 2)}[mode]
        la = np.zeros((n, KC.L_SIZE), dtype=np.int64)
        run = np.zeros(n, dtype=np.int64)
        stt = np.zeros(KC.CS_SIZE, dtype=np.int64)
        stt[KC.CS_LAH] = -1
        info: dict[int, tuple[int, int, int, int]] = {}  # rid: (ta, s, o, hit)
        actives: list[int] = []
        now: list[tuple[int, int, int]] = []  # admitted in this slot
        t = int(rng.integers(0, 3 * _finish_tree.MIN_W))
        rid = 0
        s = o = hit = 0
        fresh = True
        for _ in range(80):
            if rng.random() < 0.6:
                t += int(rng.integers(1, 5))
                now = []
                for q in [q for q in actives if la[q, KC.L_F] < t]:  # released at the end of their finish slot
                    if stt[KC.CS_TREE]:
                        KC._la_gone(FT, la, q, chunk, B)
                    actives.remove(q)
            new = fresh or rng.random() < 0.1
            if new:
                rid += 1
                s = int(rng.integers(1, 60))
                o = int(rng.integers(1, 40))
            if new or rng.random() < 0.3:
                hit = B * int(rng.integers(0, (s - 1) // B + 1))
            run[: len(actives)] = actives
            skipped = rid == stt[KC.CS_LAH] and hit // B == stt[KC.CS_LAHIT] and t < stt[KC.CS_LAW]
            ok = KC._la_admits(rid, s, o, hit, hit // B, t, M // B * B, chunk, B, run, len(actives), la, FT, stt)
            want = _rule_admits([info[q] for q in actives if info[q][0] < t], [*now, (s, o, hit)], t, M, chunk, B, rng)
            assert ok == want and not (skipped and want), (trial, t, rid, skipped)
            fresh = bool(ok)
            if ok:
                info[rid] = (t, s, o, hit)
                assert la[rid, KC.L_F] == t + -(-(s - hit) // chunk) + o - 1
                actives.append(rid)
                now.append((s, o, hit))


def test_the_compiled_hash_chain_is_the_prefix_modules() -> None:
    """The kernel hashes blocks itself from segment digests and the chain constants; the chain it
    builds is :func:`kvstab.prefix.block_hashes` (a lookup of a cached chain finds every block)."""
    from kvstab.engine import _kernel_cache as KC

    rng = np.random.default_rng(3)
    for B in (1, 3, 16):
        p = Prompt(tuple((int(rng.integers(-2**62, 2**62)), int(rng.integers(1, 40))) for _ in range(5)))
        want = block_hashes(p, B)
        d = segment_digests([c for c, _ in p.segments])
        lens = np.array([n for _, n in p.segments], dtype=np.int64)
        R, SEED, K1, K2 = (np.uint64(x) for x in chain_constants())
        seg, off, P = 0, 0, SEED
        got = []
        for _ in want:
            # numba hands a uint64 back as a Python int: keep it uint64 (as the kernel's arrays do)
            h, P, seg, off = KC._block_hash(d, lens, seg, off, np.uint64(P), B, R, K1, K2)
            got.append(int(h))
        assert tuple(got) == want
