"""Proofs with shared KV blocks (prefix caching): what is proved, what is refuted, and
the encoding checked against ``Engine.step`` on states with shared blocks.

* every built-in that runs with caching is proved for any number of requests over
  views with shared blocks (``kvstab prove --prefix-caching on``);
* the rule mutants of ``tests/mutants`` that misread sharing are refuted with a
  ``kvstab replay … --prefix-caching on --requests SLOT:S:O:P,…`` line that reproduces,
  and caught by the property suite's pool check (``props/test_props_caching.py``);
* the mutant block pools (bugs of the mechanism, ``tests/mutants/pools.py``) are caught
  by the encoding's self-check against the engine and by the same pool check.
"""

from __future__ import annotations

import random
import shlex

import pytest
from mutants import CACHING_MUTANTS
from mutants.pools import POOL_MUTANTS

from kvstab.cli import main as cli_main
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.proofs.encoding import Setting
from kvstab.proofs.prove import prove
from kvstab.proofs.selfcheck import CompiledStep, check_shared_run
from kvstab.proofs.solver import Budget
from kvstab.proofs.unbounded import SUFFIX, WHOLE_TABLES, prove_unbounded
from kvstab.proofs.verdicts import Proved, Refuted
from kvstab.props.test_props_caching import run_shared
from kvstab.registry import load_scheduler
from kvstab.replay import parse_requests, replay

#: a workload whose prompts share one prefix, on a pool small enough to preempt and evict
SHARED = "0:4:3:4,1:4:2:4,2:6:1:4,3:5:2:4"


@pytest.mark.parametrize(
    ("rule", "server"),
    [
        ("current-fit", {}),
        ("lookahead", {}),
        ("vllm-v1", {"token_budget": 64, "max_num_seqs": 4}),
    ],
)
def test_builtins_are_proved_with_shared_blocks(rule: str, server: dict[str, int], budget: Budget) -> None:
    """(``reserve``, and ``vllm-v1`` with ``B = 16``, are proved the same way in about 2 s each, left to
    ``docs/proofs.md``'s commands: test time.)"""
    r = prove_unbounded(load_scheduler(rule), Setting(prefix_caching=True, **server), budget)  # type: ignore[arg-type]
    assert isinstance(r.verdict, Proved), r.verdict
    said = r.verdict.assumptions
    assert any("prefix caching: memory is the pool's distinct blocks" in a for a in said)
    assert (WHOLE_TABLES if rule == "lookahead" else SUFFIX) in said
    if rule in ("current-fit", "vllm-v1"):  # they preempt: the suffix premise is proved, not assumed
        assert any(o.name == "suffix" and "under I every step preempts" in o.conjunct for o in r.obligations)


def test_a_sharing_mutant_is_refuted_with_a_replay_line(budget: Budget) -> None:
    """``full_hit_no_recompute`` through ``prove``: the fold theorem fails, the search refutes, the
    line reproduces (run as ``kvstab replay`` runs it, minus the CLI's start-up).  The other caching
    mutants' refutations are checked cheaply below: each failing theorem costs seconds."""
    spec = "mutants.full_hit_no_recompute:SCHEDULER"
    rep = prove(spec, setting=Setting(prefix_caching=True), budget=budget, unbounded=True)
    assert isinstance(rep.verdict, Refuted) and rep.verdict.trace is not None, rep.verdict
    assert any("not proved for every number of requests" in n for n in rep.notes)
    trace = rep.verdict.trace
    cmd = trace.replay_command
    assert "--prefix-caching on" in cmd and ":" in cmd.split("--requests ")[1]
    argv = shlex.split(cmd)
    assert argv[:4] == ["kvstab", "replay", "--scheduler", spec]
    requests = argv[argv.index("--requests") + 1]
    params = ModelParams(M=trace.M, chunk=512, block=1, prefix_caching=True)
    v = replay(spec, params, parse_requests(requests)).violation
    assert v is not None and (v.slot, v.memory) == (trace.violation_slot, trace.violation_memory)
    # the property suite's pool check catches the same workload
    assert run_shared(load_scheduler(spec), spec, params, requests) is not None


def test_caching_refuses_what_it_does_not_prove(budget: Budget) -> None:
    with pytest.raises(InvalidArgument, match="any number of requests only"):
        prove("current-fit", setting=Setting(prefix_caching=True), budget=budget, unbounded=False)
    assert cli_main(["prove", "--scheduler", "sglang", "--prefix-caching", "on"]) == 2
    assert cli_main(["prove", "--scheduler", "current-fit", "--prefix-caching", "on", "--claims"]) == 2


def _workloads(n: int, B: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        rows = []
        for _ in range(rng.randint(2, 6)):
            s, o = rng.randint(1, 9), rng.randint(1, 5)
            rows.append((rng.randint(0, 4), s, o, rng.choice([0, s, B * (s // B)])))
        rows.sort()
        out.append(",".join(f"{a}:{s}:{o}:{p}" if p else f"{a}:{s}:{o}" for a, s, o, p in rows))
    return out


@pytest.mark.parametrize(
    ("rule", "server"),
    [
        ("current-fit", {"block": 2, "chunk": 4}),
        ("vllm-v1", {"block": 2, "chunk": 4, "token_budget": 6, "max_num_seqs": 3}),
        ("reserve", {"block": 1, "chunk": 3}),
        ("lookahead", {"block": 2, "chunk": 4}),
    ],
)
def test_the_encoding_agrees_with_the_engine_on_shared_blocks(rule: str, server: dict[str, int]) -> None:
    """The encoded slot, evaluated on the view the engine settled on, charges the pool's
    distinct blocks and leaves every request where the engine does, slot by slot."""
    se = Setting(M=16, prefix_caching=True, **server)  # type: ignore[arg-type]
    compiled = CompiledStep(load_scheduler(rule), se, 5, 5)
    slots = sharing = 0
    for text in _workloads(12, se.block, seed=len(rule)):
        r = check_shared_run(compiled, parse_requests(text))
        assert not r.problems, f"{rule} on {text}: {r.problems}"
        slots, sharing = slots + r.slots, sharing + r.sharing
    assert sharing >= 20 and slots >= 60, (slots, sharing)  # the views did share blocks


@pytest.mark.parametrize("pool", sorted(POOL_MUTANTS))
def test_mutant_pools_are_caught_by_the_self_check_and_the_property(pool: str) -> None:
    install, rule = POOL_MUTANTS[pool], "vllm-v1"
    se = Setting(M=12, chunk=4, block=2, prefix_caching=True)
    assert not check_shared_run(CompiledStep(load_scheduler(rule), se, 5, 5), parse_requests(SHARED)).problems
    assert check_shared_run(CompiledStep(load_scheduler(rule), se, 5, 5), parse_requests(SHARED), engine=install).problems
    assert run_shared(load_scheduler(rule), rule, se.params(12), SHARED) is None
    failure = run_shared(load_scheduler(rule), rule, se.params(12), SHARED, install=install)
    assert failure is not None and "--prefix-caching on --requests 0:4:3:4," in failure



def test_the_suffix_premise_has_teeth(budget: Budget) -> None:
    """``keeps_behind_victim`` is proved without caching (its survivors fit; docs/proofs.md) but
    not with it: its victims need not be a suffix, and the suffix obligation is what fails."""
    v = prove_unbounded(load_scheduler("mutants.keeps_behind_victim:SCHEDULER"), Setting(prefix_caching=True), budget).verdict
    assert not isinstance(v, Proved) and "suffix" in str(v) and "a step that preempts leaves I" in str(v), v


#: each caching mutant's refutation (docs/proofs.md): M and the --requests line
REFUTED = {
    "evicts_referenced": (7, "0:4:3:1,1:2:1:1"),
    "full_hit_no_recompute": (7, "0:4:3:1,1:2:1:1"),
    "keeps_behind_victim": (6, "1:1:2:1,2:4:1:3,2:4:1:3"),
}
assert set(REFUTED) == set(CACHING_MUTANTS)


@pytest.mark.parametrize("mutant", CACHING_MUTANTS)
def test_caching_mutants_break_the_pool_check_where_current_fit_does_not(mutant: str) -> None:
    M, requests = REFUTED[mutant]
    params = ModelParams(M=M, chunk=512, block=1, prefix_caching=True)
    spec = f"mutants.{mutant}:SCHEDULER"
    failure = run_shared(load_scheduler(spec), spec, params, requests)
    assert failure is not None and f"--prefix-caching on --requests {requests}" in failure
    assert run_shared(load_scheduler("current-fit"), "current-fit", params, requests) is None
