"""Workloads with prefix structure: prompt content, block-hash chains, Mooncake
``hash_ids``, the synthetic prefix laws and their specs (issue 25, item 1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, conversation_arrivals, poisson_arrivals, trace_arrivals
from kvstab.cli import main
from kvstab.errors import InvalidArgument, TraceError
from kvstab.model import ModelParams
from kvstab.prefix import Prompt, PromptSet, block_hashes, common_prefix, concat, content_id, token_ids
from kvstab.prefix_laws import Conversation, FewShot, Shared, Tenants, zipf_weights
from kvstab.traces import MOONCAKE_BLOCK, load_trace
from kvstab.workload import Fixed, Uniform, parse_workload


def tokens(p: Prompt) -> list[tuple[int, int]]:
    """The prompt's tokens, spelled out: ``(content, offset)``."""
    return [(c, j) for c, n in p.segments for j in range(n)]


# a small alphabet of contents and short lengths, so that shared prefixes and truncations are frequent
prompts_st = st.builds(
    Prompt, st.lists(st.tuples(st.integers(-2, 2), st.integers(1, 12)), min_size=1, max_size=6).map(tuple)
)
blocks_st = st.integers(1, 20)


@settings(max_examples=300, deadline=None)
@given(a=prompts_st, b=prompts_st, B=blocks_st)
def test_chains_equal_iff_prefixes_equal_at_block_granularity(a: Prompt, b: Prompt, B: int) -> None:
    ha, hb = block_hashes(a, B), block_hashes(b, B)
    assert len(ha) == a.s // B and len(hb) == b.s // B
    ta, tb = tokens(a), tokens(b)
    for k in range(1, min(len(ha), len(hb)) + 1):
        assert (ha[:k] == hb[:k]) == (ta[: k * B] == tb[: k * B])
    # the chain's k-th hash is a function of the prefix: equal hashes at k mean equal chains up to k
    for k in range(min(len(ha), len(hb))):
        if ha[k] == hb[k]:
            assert ha[:k] == hb[:k]


@settings(max_examples=300, deadline=None)
@given(a=prompts_st, b=prompts_st)
def test_common_prefix_is_the_token_match(a: Prompt, b: Prompt) -> None:
    ta, tb = tokens(a), tokens(b)
    n = 0
    while n < min(len(ta), len(tb)) and ta[n] == tb[n]:
        n += 1
    assert common_prefix(a, b) == n == common_prefix(b, a)


@settings(max_examples=100, deadline=None)
@given(ps=st.lists(prompts_st, min_size=1, max_size=12), B=blocks_st, data=st.data())
def test_prompt_set_chains_match_one_prompt_at_a_time(ps: list[Prompt], B: int, data: st.DataObject) -> None:
    pset = PromptSet.from_prompts(ps)
    assert list(pset.lengths()) == [p.s for p in ps]
    assert [pset.prompt(i) for i in range(len(ps))] == ps
    start = data.draw(st.integers(0, len(ps)))
    stop = data.draw(st.integers(start, len(ps)))
    off, h = pset.block_hashes(B, start, stop)
    for i in range(start, stop):
        got = h[off[i - start] : off[i - start + 1]]
        assert tuple(got.tolist()) == block_hashes(ps[i], B)
    idx = data.draw(st.lists(st.integers(0, len(ps) - 1), max_size=8))
    assert [pset.take(np.asarray(idx, dtype=np.int64)).prompt(j) for j in range(len(idx))] == [ps[i] for i in idx]
    both = concat([pset, pset.take(np.arange(len(ps))[::-1])])
    assert both.prompt(len(ps)) == ps[-1]


def test_hashes_and_token_ids_are_deterministic_and_typed() -> None:
    p = Prompt(((content_id("shared", 0), 40), (7, 9)))
    # fixed values: no salted hash(); the same on every machine and run
    assert block_hashes(p, 16) == block_hashes(Prompt(p.segments), 16)
    assert all(isinstance(h, int) and -(2**63) <= h < 2**63 for h in block_hashes(p, 16))
    ids = token_ids(p, 32_000)
    assert ids.shape == (49,) and ids.min() >= 0 and ids.max() < 32_000
    assert np.array_equal(ids[:40], token_ids(Prompt(((content_id("shared", 0), 45),)), 32_000)[:40])
    assert np.array_equal(PromptSet.from_prompts([p]).token_ids(0, 32_000), ids)
    with pytest.raises(InvalidArgument, match="block size B"):
        block_hashes(p, 0)
    with pytest.raises(InvalidArgument, match="segment 0: length"):
        Prompt(((1, 0),))


# --- Mooncake hash_ids -----------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_mooncake_block_covers_engine_blocks(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 3 * 512, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 1, "input_length": 2 * 512 + 100, "output_length": 5, "hash_ids": [1, 2, 9]},
        {"timestamp": 2, "input_length": 2 * 512 + 300, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 3, "input_length": 4 * 512, "output_length": 5, "hash_ids": [1]},  # a short chain
    ]
    tr = load_trace(write_jsonl(tmp_path / "m.jsonl", rows))
    assert tr.prompts is not None and MOONCAKE_BLOCK == 512
    assert np.array_equal(tr.prompts.lengths(), tr.s)
    off, h = tr.prompts.block_hashes(16)
    chain = [h[off[i] : off[i + 1]] for i in range(4)]
    assert [c.size for c in chain] == [96, 70, 82, 128]  # ⌊s/16⌋
    # two shared 512-token blocks are 64 shared engine blocks; then the third id differs
    assert np.array_equal(chain[0][:64], chain[1][:64]) and chain[0][64] != chain[1][64]
    # a partial last block of id 3 (300 tokens) is the start of the full block 3: 18 more full blocks shared
    assert np.array_equal(chain[2], chain[0][:82])
    # the tokens past a short chain are the row's own
    assert np.array_equal(chain[3][:32], chain[0][:32]) and chain[3][32] != chain[0][32]
    # the same at Mooncake's own block size: one hash per published id (full blocks only)
    off, h = tr.prompts.block_hashes(512)
    assert list(np.diff(off)) == [3, 2, 2, 4]


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([{"input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}], "3 ids but input_length=600 is only 2 blocks"),
        ([{"input_length": 600, "output_length": 1, "hash_ids": [1, 2.5]}], r"hash_ids\[1\]=2.5 is not a 64-bit integer"),
        ([{"input_length": 600, "output_length": 1, "hash_ids": ["a"]}], r"hash_ids\[0\]='a' is not"),
        ([{"input_length": 600, "output_length": 1, "hash_ids": [True]}], r"hash_ids\[0\]=True is not"),
        ([{"input_length": 600, "output_length": 1, "hash_ids": 5}], "is not a list of integers"),
        (
            [{"input_length": 600, "output_length": 1, "hash_ids": [1]}, {"input_length": 60, "output_length": 1}],
            "hash_ids is missing here but present on line 1",
        ),
        (
            [{"input_length": 600, "output_length": 1}, {"input_length": 60, "output_length": 1, "hash_ids": [1]}],
            "present here but missing on line 1",
        ),
    ],
)
def test_bad_hash_ids_are_one_line_naming_the_row(tmp_path: Path, rows: list[dict[str, object]], reason: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TraceError, match=reason) as info:
        load_trace(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}:{len(rows)}: ")
    assert isinstance(info.value, InvalidArgument)  # exit 2 on the command line


@pytest.mark.parametrize(("name", "rows", "reuse"), [("mooncake-conversation", 12_031, 0.37), ("mooncake-synthetic", 3_993, None)])
def test_shipped_mooncake_traces(name: str, rows: int, reuse: float | None) -> None:
    tr = load_trace(name)
    assert len(tr) == rows and tr.format == "mooncake" and tr.prompts is not None and tr.arrival is not None
    assert np.array_equal(tr.prompts.lengths(), tr.s)
    plan = trace_arrivals(tr, ModelParams(bbar=0.04))
    assert plan.prompts is tr.prompts
    if reuse is not None:
        # the probe's figure: 37 % of prompt tokens are a prefix seen before (infinite cache, 512-token blocks)
        off, h = tr.prompts.block_hashes(512)
        seen: set[int] = set()
        hit = 0
        for i in range(len(tr)):
            c = h[off[i] : off[i + 1]].tolist()
            k = 0
            while k < len(c) and c[k] in seen:
                k += 1
            hit += k
            seen.update(c)
        assert abs(hit * 512 / tr.s.sum() - reuse) < 0.01  # as a share of prompt tokens


def test_mu_takes_the_mooncake_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mu", "--trace", "mooncake-conversation"]) == 0
    assert "μ = M/(b̄·E[g])" in capsys.readouterr().out


# --- the synthetic laws --------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "s=U(1100,2000),o=U(10,500),prefix=shared(1024)",
        "s=U(600,2000),o=geom(0.01,2000),prefix=tenants(16,U(100,500),1.1)",
        "s=U(600,2000),o=const(5),prefix=tenants(4,300,0)",
        "paper-1:1,prefix=fewshot(8,4,6,1)",
        "s=U(20,200),o=U(50,400),prefix=chat(U(1,8),30)",
        "s=const(20),o=const(5),prefix=chat(3,0)",
        "trace(sharegpt),prefix=shared(1)",
    ],
)
def test_prefix_specs_parse_and_describe_back(spec: str) -> None:
    w = parse_workload(spec)
    assert w.prefix is not None
    again = parse_workload(w.describe())
    assert again.describe() == w.describe() and type(again.prefix) is type(w.prefix)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("paper-1:1,prefix=shared(1024)", "P=1024 shared tokens exceed the shortest prompt s=10"),
        ("s=U(20,90),o=U(1,9),prefix=fewshot(4,50,50,1)", "H\\+E=100 shared tokens exceed"),
        ("s=U(20,90),o=U(1,9),prefix=tenants(4,U(10,500),1)", "P \\(the largest tenant's\\)=.* exceed"),
        ("s=U(20,90),o=U(1,9),prefix=tenants(0,5,1)", "tenants\\(n,P,a\\): n must be"),
        ("s=U(20,90),o=U(1,9),prefix=tenants(3,5,-1)", "Zipf exponent"),
        ("s=U(20,90),o=U(1,9),prefix=chat(3,-1)", "T \\(think time, seconds\\)"),
        ("s=U(20,90),o=U(1,9),prefix=chat(0,1)", "chat\\(K,T\\): K"),
        ("trace(sharegpt),prefix=chat(3,1)", "needs s and o laws"),
        ("s=U(20,90),o=U(1,9),prefix=shared(3,4)", "takes 1 argument,"),
        ("s=U(20,90),o=U(1,9),prefix=lru(3)", "unknown prefix law 'lru'"),
    ],
)
def test_bad_prefix_specs_are_one_line_naming_the_parameter(spec: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says) as info:
        parse_workload(spec)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"workload {spec!r}")


def test_prefix_law_keeps_the_plan_lengths_and_shares_its_prompt() -> None:
    plain = poisson_arrivals(parse_workload("s=U(1100,2000),o=U(10,500)"), 20.0, ModelParams(bbar=0.05), 2000, seed=3)
    w = parse_workload("s=U(1100,2000),o=U(10,500),prefix=shared(1024)")
    plan = poisson_arrivals(w, 20.0, ModelParams(bbar=0.05), 2000, seed=3)
    assert plain.prompts is None and plan.prompts is not None
    assert np.array_equal(plan.s, plain.s) and np.array_equal(plan.o, plain.o) and np.array_equal(plan.slot, plain.slot)
    first = plan.prompts.prompt(0).segments[0]
    for i in range(len(plan)):
        p = plan.prompts.prompt(i)
        assert p.segments[0] == first == (content_id("shared", 0), 1024)
        assert p.s == plan.s[i]
    # B = 16: the 64 blocks of the system prompt are every request's first 64 hashes, then they differ
    off, h = plan.prompts.block_hashes(16, 0, 2)
    assert np.array_equal(h[:64], h[off[1] : off[1] + 64]) and h[64] != h[off[1] + 64]
    # dropping requests that cannot fit keeps each prompt with its request
    fitted = plan.fit_to(ModelParams(M=2200), drop_oversize=True)
    assert fitted.dropped > 0 and fitted.prompts is not None
    assert np.array_equal(fitted.prompts.lengths(), fitted.s)


def zipf_within_bound(picks: np.ndarray, n: int, a: float) -> None:
    """Each item's frequency within 5 standard deviations of its Zipf probability."""
    p = zipf_weights(n, a)
    count = np.bincount(picks, minlength=n)
    sd = np.sqrt(picks.size * p * (1 - p))
    assert np.all(np.abs(count - picks.size * p) <= 5 * sd + 1), (count, picks.size * p)


def test_tenants_follow_zipf() -> None:
    law = Tenants(6, Uniform(100, 400), 1.2)
    assert law.sizes == Tenants(6, Uniform(100, 400), 1.2).sizes  # drawn once, seed 0
    s = np.full(40_000, 500, dtype=np.int64)
    ps = law.prompts(np.random.default_rng(1), s)
    ids = {content_id("tenant", t): t for t in range(6)}
    picks = np.array([ids[int(ps.content[ps.offsets[i]])] for i in range(len(ps))])
    zipf_within_bound(picks, 6, 1.2)
    for i in range(50):
        c, n = ps.prompt(i).segments[0]
        assert n == law.sizes[ids[c]]
    assert np.array_equal(ps.lengths(), s)


def test_fewshot_shares_its_header_and_follows_zipf() -> None:
    law = FewShot(5, 30, 70, 0.8)
    s = np.random.default_rng(0).integers(100, 300, size=30_000)
    ps = law.prompts(np.random.default_rng(2), s)
    assert np.array_equal(ps.lengths(), s)
    header = (content_id("fewshot-header", 0), 30)
    ids = {content_id("fewshot", t): t for t in range(5)}
    picks = []
    for i in range(len(ps)):
        segs = ps.prompt(i).segments if i < 200 else None
        if segs is not None:
            assert segs[0] == header and segs[1][1] == 70 and sum(n for _, n in segs[2:]) == s[i] - 100
        picks.append(ids[int(ps.content[ps.offsets[i] + 1])])
    zipf_within_bound(np.asarray(picks), 5, 0.8)
    # two requests of one template share H + E tokens exactly (s > 100: each has a question of its own)
    same = [i for i in range(200) if picks[i] == picks[0]]
    assert common_prefix(ps.prompt(same[0]), ps.prompt(same[1])) == 100


def test_shared_law_shared_fraction() -> None:
    s = np.array([1024, 1500, 4096], dtype=np.int64)
    ps = Shared(1024).prompts(np.random.default_rng(0), s)
    assert [common_prefix(ps.prompt(0), ps.prompt(i)) for i in range(3)] == [1024, 1024, 1024]
    assert ps.prompt(0).segments == ((content_id("shared", 0), 1024),)  # nothing of its own
    assert common_prefix(ps.prompt(1), ps.prompt(2)) / 1500 == pytest.approx(1024 / 1500)


def test_conversations_grow_turn_by_turn() -> None:
    law = Conversation(Uniform(1, 6), 5.0, Uniform(10, 80), Uniform(5, 50))
    d = law.draw(np.random.default_rng(4), 300)
    assert d.prompts.output is not None
    for i in range(1, d.s.size):
        if d.turn[i] == 0:
            assert d.prompts.prompt(i).segments[0][1] == d.s[i]
            continue
        prev, cur = d.prompts.prompt(i - 1), d.prompts.prompt(i)
        assert d.conversation[i] == d.conversation[i - 1]
        # turn k = turn k−1's prompt + its answer (named as its output) + a new message
        assert cur.segments[:-2] == prev.segments
        assert cur.segments[-2] == (int(d.prompts.output[i - 1]), int(d.o[i - 1]))
        assert d.s[i] == d.s[i - 1] + d.o[i - 1] + cur.segments[-1][1]
        assert common_prefix(prev.extended(int(d.prompts.output[i - 1]), int(d.o[i - 1])), cur) == d.s[i - 1] + d.o[i - 1]
    assert law.max_total == 6 * (80 + 50)


def test_conversation_arrivals() -> None:
    law = Conversation(Fixed(4), 2.0, Uniform(10, 80), Uniform(5, 50))
    rate, bbar, slots = 8.0, 0.05, 40_000
    plan = conversation_arrivals(law, rate, ModelParams(bbar=bbar), slots, seed=5)
    assert isinstance(plan, ArrivalPlan) and plan.prompts is not None
    assert np.all(np.diff(plan.slot) >= 0) and plan.slot.max() < slots
    # rate requests/s on average (the horizon cuts a few late turns): within 5 sd of a Poisson count of conversations
    conv = rate * bbar * slots / 4
    assert abs(len(plan) / 4 - conv) <= 5 * math.sqrt(conv) + 4
    # the workload spec goes the same way through poisson_arrivals
    w = parse_workload("s=U(10,80),o=U(5,50),prefix=chat(4,2)")
    again = poisson_arrivals(w, rate, ModelParams(bbar=bbar), slots, seed=5)
    assert np.array_equal(again.s, plan.s) and np.array_equal(again.slot, plan.slot)
    # its (s, o) law is the request stream's, and knows the largest request exactly
    assert w.max_total == 4 * (80 + 50)


def test_with_outputs_chain_is_where_the_next_turn_starts() -> None:
    law = Conversation(Fixed(3), 1.0, Uniform(10, 80), Uniform(5, 50))
    d = law.draw(np.random.default_rng(6), 40)
    done = d.prompts.with_outputs(d.o)
    assert np.array_equal(done.lengths(), d.s + d.o)
    for B in (1, 7, 16):
        off, h = d.prompts.block_hashes(B)
        doff, dh = done.block_hashes(B)
        for i in range(1, d.s.size):
            if d.turn[i] == 0:
                continue
            held = dh[doff[i - 1] : doff[i]]  # every full block turn k−1 holds when it finishes
            assert np.array_equal(h[off[i] : off[i] + held.size], held)
    # outputs of plain requests are their own
    ps = Shared(5).prompts(np.random.default_rng(0), np.array([9, 9]))
    assert ps.output is not None and ps.output[0] != ps.output[1]
    assert PromptSet.from_prompts([Prompt(((1, 4),))]).with_outputs([3]).prompt(0).s == 7


@pytest.mark.parametrize(
    "argv",
    [
        ["mu", "--workload", "paper-1:1,prefix=shared(1024)"],
        ["mu", "--workload", "s=U(20,90),o=U(1,9),prefix=tenants(3,5,inf)"],
    ],
)
def test_bad_prefix_spec_on_the_command_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "prefix=" in err
