"""The reference engine with prefix caching (``ModelParams.prefix_caching``): vLLM's block pool
under every rule, what a rule is shown of it, and the invariants that must survive sharing.

Step-for-step identity with vLLM's own scheduler is ``tests/empirical/test_vllm_prefix_caching.py``;
these tests need no vLLM.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.contract import View, used_now
from kvstab.engine import run as engine_run
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.lifecycles.vllm import VllmEngine
from kvstab.model import ModelParams, tokens_held
from kvstab.ops import CONCRETE
from kvstab.prefix import Prompt, PromptSet, content_id
from kvstab.registry import load_scheduler
from kvstab.simulator import Engine, simulate
from kvstab.workload import parse_workload

B = 16
SERVER = ModelParams(M=64 * B, chunk=64, block=B, token_budget=64, max_num_seqs=16, bbar=1.0, prefix_caching=True)
#: the paper's rules ignore vLLM's token budget and sequence cap: their server has neither
PAPER_SERVER = replace(SERVER, token_budget=None, max_num_seqs=None)
SYSTEM = (content_id("shared", 1), 48)  # three full blocks every prompt below starts with


def _prompt(own: int, n: int) -> Prompt:
    return Prompt((SYSTEM, (content_id("message", own), n)))


def test_a_shared_prefix_is_held_once_and_not_computed_again() -> None:
    eng = Engine(load_scheduler("vllm-v1"), SERVER)
    eng.arrive(80, 40, _prompt(0, 32))
    eng.step()  # request 0 computes its 64-token first chunk; its three system blocks are cached
    eng.arrive(80, 40, _prompt(1, 32))
    rec = eng.step()
    assert rec.admitted == (1,)
    r1 = eng.requests[1]
    assert r1.cached == 48  # the three shared blocks
    # request 0 computes its last 16 prompt tokens, request 1 its own 32 (past the hit)
    assert rec.tokens == 16 + 32
    # memory: request 0's 5 blocks, request 1's 2 own blocks; the 3 shared blocks count once
    assert rec.memory == (5 + 2) * B
    assert rec.memory < tokens_held(80, B) + tokens_held(80, B)


def test_a_whole_cached_prompt_still_computes_its_last_block() -> None:
    eng = Engine(load_scheduler("vllm-v1"), SERVER)
    eng.arrive(48, 10, Prompt((SYSTEM,)))
    eng.step()
    eng.arrive(48, 10, Prompt((SYSTEM,)))
    rec = eng.step()
    assert eng.requests[1].cached == 32  # at most s − 1 tokens, in whole blocks: 47 → 2 blocks
    assert rec.tokens == 1 + 16  # request 0 decodes one token, request 1 recomputes its last block


def test_the_view_charges_each_shared_block_to_its_oldest_holder() -> None:
    eng = Engine(load_scheduler("vllm-v1"), SERVER)
    for i in range(3):
        eng.arrive(80, 40, _prompt(i, 32))
    eng.step()
    eng.step()
    view = eng.view()
    assert [a.shared for a in view.active][:1] == [0]
    assert all(a.shared == 48 for a in view.active[1:])
    # Σ of what the rule is shown equals the pool's distinct blocks
    assert used_now(view, CONCRETE) == eng.cache.used_tokens  # type: ignore[union-attr]


def test_a_waiting_request_is_shown_its_hit() -> None:
    eng = Engine(load_scheduler("reserve"), replace(PAPER_SERVER, M=8 * B))
    eng.arrive(60, 60, _prompt(0, 12))  # peak 120 → 8 blocks: fills the pool
    eng.step()
    eng.arrive(60, 4, _prompt(1, 12))
    view: View = eng.view()
    (w,) = view.waiting
    # the three system blocks are held by request 0: shared, shown off its s
    assert (w.s, w.cached, w.shared) == (60 - 48, 0, 48)


def test_a_preempted_request_finds_its_own_blocks_again() -> None:
    # vLLM's lifecycle: the victim keeps its outputs, and its cached blocks are found on resumption
    params = ModelParams(M=10 * B, chunk=64, block=B, token_budget=64, max_num_seqs=8, bbar=1.0, prefix_caching=True)
    eng = VllmEngine(load_scheduler("vllm-v1"), params)
    eng.arrive(40, 100)
    eng.arrive(40, 100)
    hits = []
    for _ in range(300):
        rec = eng.step()
        hits += [eng.requests[r].cached for r in rec.admitted if eng.requests[r].preemptions]
        if eng.idle:
            break
    assert eng.idle and sum(r.preemptions for r in eng.requests) > 0
    assert hits and max(hits) >= B, hits  # at least its first block survived the survivor's growth


def _shared_plan(seed: int, n: int = 150) -> ArrivalPlan:
    w = parse_workload("s=U(50,200),o=U(10,150),prefix=tenants(3,U(20,48),1.0)")
    return poisson_arrivals(w, 0.6, SERVER, n, seed=seed)


@pytest.mark.parametrize("name", ["current-fit", "reserve", "lookahead", "vllm-v1"])
def test_without_sharing_caching_changes_nothing_until_a_preemption(name: str) -> None:
    """Prompts of their own and no preemption: the pool holds exactly what each request would."""
    w = parse_workload("s=U(20,200),o=U(10,100)")
    plain = replace(SERVER if name == "vllm-v1" else PAPER_SERVER, M=400 * B, prefix_caching=False)
    plan = poisson_arrivals(w, 0.1, plain, 400, seed=3)
    off = simulate(load_scheduler(name), plain, plan, 400)
    on = simulate(load_scheduler(name), replace(plain, prefix_caching=True), plan, 400)
    assert off.preempted.sum() == 0
    for col in ("admitted", "completed", "memory", "tokens", "queue"):
        assert np.array_equal(getattr(on, col), getattr(off, col)), col


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["current-fit", "reserve", "lookahead", "vllm-v1"]))
def test_every_rule_keeps_the_memory_invariant_with_sharing(seed: int, name: str) -> None:
    """The built-ins under caching on a small pool shared by tenants: the engine checks the
    pool's distinct blocks against M every slot (simulate raises on a violation)."""
    server = SERVER if name == "vllm-v1" else PAPER_SERVER
    res = simulate(load_scheduler(name), server, _shared_plan(seed), 150)
    assert res.memory.max() <= server.M


def test_the_negative_control_is_still_caught() -> None:
    with pytest.raises(InvariantViolation):
        simulate(load_scheduler("current-fit-no-preempt"), PAPER_SERVER, _shared_plan(1, 400), 400)


def test_sharing_raises_the_saturated_rate() -> None:
    w = parse_workload("s=const(160),o=const(16),prefix=shared(128)")
    plan = poisson_arrivals(w, 2.0, SERVER, 600, seed=0)
    on = simulate(load_scheduler("vllm-v1"), SERVER, plan, 600)
    off = simulate(load_scheduler("vllm-v1"), replace(SERVER, prefix_caching=False), plan, 600)
    assert on.completed[300:].mean() > 1.5 * off.completed[300:].mean()


def test_the_engines_refuse_what_they_do_not_model() -> None:
    plan = _shared_plan(0, 50)
    # the compiled pool runs the paper's rules under kvstab's lifecycle only
    with pytest.raises(InvalidArgument, match="no compiled prefix-cache path"):
        engine_run(load_scheduler("lookahead"), PAPER_SERVER, plan, 50, engine="fast", lifecycle="vllm")
    with pytest.raises(InvalidArgument, match="radix cache is not modelled"):
        engine_run(load_scheduler("sglang"), SERVER, plan, 50)
    auto = engine_run(load_scheduler("lookahead"), PAPER_SERVER, plan, 50, lifecycle="vllm")
    assert auto.engine == "reference" and "prefix caching" in auto.reason
    for name, server in (("vllm-v1", SERVER), ("lookahead", PAPER_SERVER)):
        fast = engine_run(load_scheduler(name), server, plan, 50)
        assert fast.engine == "fast" and "prefix-cache" in fast.reason


def test_a_prompt_of_the_wrong_length_is_refused() -> None:
    eng = Engine(load_scheduler("vllm-v1"), SERVER)
    with pytest.raises(InvalidArgument, match="prompt content has 80 tokens, but s=81"):
        eng.arrive(81, 10, _prompt(0, 32))


def test_a_plan_carries_its_prompts_into_the_engine() -> None:
    prompts = PromptSet.from_prompts([_prompt(i, 16) for i in range(4)])
    plan = ArrivalPlan(np.array([0, 0, 1, 1]), prompts.lengths(), np.array([5, 5, 5, 5]), prompts=prompts)
    res = simulate(load_scheduler("current-fit"), PAPER_SERVER, plan, drain=True)
    no_share = simulate(load_scheduler("current-fit"), PAPER_SERVER, ArrivalPlan(plan.slot, plan.s, plan.o), drain=True)
    assert res.tokens.sum() < no_share.tokens.sum()  # the later requests skip the shared 48 tokens' prefill


# ---- the command line ----

SHARED_SIM = [
    "simulate", "--workload", "s=const(160),o=const(16),prefix=shared(128)", "--M", "1024", "--chunk", "64",
    "--block", "16", "--token-budget", "64", "--max-num-seqs", "16", "--slots", "400", "--load", "3",
    "--no-progress",
]  # fmt: skip


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from kvstab.cli import main

    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse errors exit directly
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_simulate_follows_the_engine_and_says_mu_is_the_no_sharing_formula(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    rc, out, err = _cli([*SHARED_SIM, "--scheduler", "vllm-v1", "--json"], capsys)
    assert rc == 0, err
    on = json.loads(out)
    assert on["prefix_caching"] is True and on["engine"] == "fast"
    rc, out, err = _cli([*SHARED_SIM, "--scheduler", "vllm-v1", "--prefix-caching", "off", "--json"], capsys)
    assert rc == 0, err
    off = json.loads(out)
    assert off["prefix_caching"] is False and off["engine"] == "fast"
    assert on["throughput_per_slot"] > 1.5 * off["throughput_per_slot"]
    rc, out, err = _cli([*SHARED_SIM, "--scheduler", "current-fit", "--token-budget", "4096"], capsys)
    assert rc == 0, err
    assert "prefix caching" not in out  # the paper's rules run without unless asked
    rc, out, err = _cli([*SHARED_SIM, "--scheduler", "vllm-v1"], capsys)
    assert rc == 0, err
    said = " ".join(out.split())
    assert "μ above is the paper's no-sharing formula" in said and "measured / μ" in said
    assert "μ with sharing (docs/theory.md, 'Prefix caching') =" in said and "measured / μ_share =" in said


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--prefix-caching", "maybe"], "expected on or off"),
        (["--scheduler", "sglang", "--prefix-caching", "on"], "radix cache is not modelled"),
        (["--scheduler", "lookahead", "--prefix-caching", "on", "--engine", "fast"], "no compiled prefix-cache path"),
    ],
)
def test_simulate_refuses_in_one_line(extra: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli([*SHARED_SIM, *extra], capsys)
    assert rc == 2
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


# ---- kvstab replay / check ----


def test_a_replay_line_names_the_shared_prefix_and_replays_the_same_run(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstab.replay import parse_requests, replay, replay_command

    plan = parse_requests("0:100:20:96,0:100:20:96,1:120:10:96,2:50:5")
    assert plan.prompts is not None
    server = ModelParams(M=256, chunk=64, block=16, token_budget=64, max_num_seqs=8, prefix_caching=True)
    line = replay_command("vllm-v1", server, plan)
    assert "--prefix-caching on" in line and "0:100:20:96" in line and "2:50:5" in line
    first = replay("vllm-v1", server, plan)
    again = replay("vllm-v1", server, parse_requests(line.split("--requests ")[1].strip("'")))
    assert [r.memory for r in first.records] == [r.memory for r in again.records]
    plain = replay("vllm-v1", replace(server, prefix_caching=False), plan)
    assert max(r.memory for r in first.records) < max(r.memory for r in plain.records)  # the 96 tokens held once
    rc, out, err = _cli(["replay", *line.split()[2:]], capsys)
    assert rc == 0 and "prefix caching" in out, err


@pytest.mark.parametrize(
    "argv,match",
    [
        (["replay", "--requests", "0:10:2:11"], "shared prefix P=11 exceeds S=10"),
        (["replay", "--requests", "0:10:2:x"], "--requests item"),
        (["check", "--prefix-caching", "on", "--requests", "0:10:2:5"], "without shared blocks"),
    ],
)
def test_replay_and_check_refuse_in_one_line(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli([argv[0], "--scheduler", "vllm-v1", "--M", "256", "--chunk", "64", *argv[1:]], capsys)
    assert rc == 2 and match in err and "Traceback" not in err, err
