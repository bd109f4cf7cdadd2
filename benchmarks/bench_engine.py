"""The fast engine: speed targets, the scaling table, and the differential checks it must pass.

    python benchmarks/bench_engine.py                 # everything (minutes on a shared 2-core machine)
    python benchmarks/bench_engine.py --only targets  # one section: targets | events | vllm | plugin | sglang | scaling | check | python

Sections (issue 11; no timed tests — figures are printed here):

* ``targets``  10⁶ requests of paper 1:1 at λ = 1.2·μ, M = 131000, each compiled built-in (the
  negative control with ``check=False``, so that it runs the whole horizon) and
  ``vllm-v1`` with vLLM's lifecycle; streamed (no per-slot arrays); target ≤ 10 s each.
* ``events``   the event engine's cost: CPU ns per slot and per event as M grows 16k → 8M at
  λ = 1.2·μ (the number running grows with M) and at λ = 0.9·μ, 0.5·μ; slots run one by one
  and skipped, events processed; how often vLLM's default token budget stalls decoders;
  lookahead with its finish-time table as the O(n) table (the engine before the finish tree),
  in the finish tree from the first request, and as shipped, with B = 1 and B = 16.
* ``vllm``     the vLLM-matched model (fast) vs vLLM 0.33's own scheduler and vs the
  reference model on one plan: steps/s, and step-for-step identity (check (c)).
* ``plugin``   a plug-in rule (current-fit's rule in an outside class) on the plug-in path vs
  the reference engine on the same run: speed-up in CPU seconds (target ≥ 10× cold), cold
  (every view shape asked of the rule or taped during the run) and again with the tapes kept
  (a sweep's later points), and identity of every SimResult array; then ``--plugin-long``
  requests (10⁵) streamed, each in a process of its own for its peak RSS (target < 1 GB):
  current-fit's rule (the reference extrapolated from its slots/s, not run) and sglang's
  rule behind an outside class (O(K²) tapes: the stress case of the tapes' memory bound).
* ``sglang``   the built-in ``sglang`` on its compiled engine vs its rule on the plug-in path (behind an
  outside class; cold: every shape taped or asked during the run) vs the reference engine, same run;
  ``--sglang-reference-max`` requests at most are also run on the reference engine (it takes
  ~0.8 ms a slot at paper scale), above that its time is not measured.  ``targets`` runs sglang at
  10⁶ requests under kvstab's and SGLang's lifecycles, ``events`` at M = 16k/131k/1M, ``check`` both
  lifecycles against the reference (SGLang's: every step of the step log).
* ``scaling``  10⁴/10⁵/10⁶ requests × M = 16k/131k/1M (current-fit and lookahead): seconds and ns
  per request.
* ``check``    fast vs reference engine, every SimResult array, on the paper's three workloads
  and the four shipped traces, every built-in, ≥ 10⁵ slots (check (b)).
* ``python``   the same compiled loop run as plain Python (numba disabled): why numba.

Each section prints the machine load (``uptime``) when it starts; pin to one core
with ``taskset -c 1 python benchmarks/bench_engine.py`` to measure one core.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from kvstab.arrivals import ArrivalPlan, poisson_arrivals
from kvstab.contract import (
    Decision,
    Scheduler,
    StateVar,
    Traits,
    View,
    WaitingEntry,
    fcfs_admit,
    held_first,
    preempt_newest,
    state_vars_of,
)
from kvstab.data import trace_path
from kvstab.engine import run
from kvstab.engine import sglang as sgl
from kvstab.engine._drive import Reporting
from kvstab.engine.driver import Lifecycle, _run_fast, fast_rule, finish_table
from kvstab.engine.stream import Summary
from kvstab.errors import InvalidArgument, InvariantViolation
from kvstab.model import PAPER_BBAR, ModelParams
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.registry import builtin_names, load_scheduler
from kvstab.simulator import Horizon, SimResult
from kvstab.theory import mu
from kvstab.workload import PAPER_WORKLOADS, Workload, parse_workload

FIELDS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "s o arrival first_admit finish preemptions served request_wasted"
).split()


def load() -> str:
    """The machine load now (``uptime``'s load averages)."""
    return os.getloadavg().__repr__()


def header(title: str) -> None:
    print(f"\n== {title}   (load averages {load()}, pid {os.getpid()})", flush=True)


def plan_for(w: Workload, params: ModelParams, requests: int, load_factor: float = 1.2, seed: int = 0) -> ArrivalPlan:
    """Poisson arrivals at ``load_factor``·μ for about ``requests`` requests."""
    rate = load_factor * mu(w, params)
    slots = max(1, int(round(requests / (rate * PAPER_BBAR))))
    return poisson_arrivals(w, rate, ModelParams(), slots, seed=seed).fit_to(params, drop_oversize=True)


def horizon(plan: ArrivalPlan) -> int:
    return int(plan.slot[-1]) + 1 if len(plan) else 1


def fast_run(
    rule: str, params: ModelParams, plan: ArrivalPlan, T: int, life: Lifecycle = "kvstab", check: bool = True
) -> tuple[Summary, dict[str, int], float]:
    """A streamed fixed-horizon run on the compiled engine: its summary, what it did
    (``_State.work``: slots run one by one and skipped, events) and its CPU seconds."""
    sched = load_scheduler(rule)
    work: dict[str, int] = {}
    h = Horizon(T, False, max(T, 10_000_000))
    rep = Reporting(record=False)
    if sgl.is_fast(sched):  # sglang's own compiled engine
        c0 = time.process_time()
        summary, _ = sgl.run_fast(sched, params, plan, h, rep, check, life, work)  # type: ignore[arg-type]
        return summary, work, time.process_time() - c0
    pol = fast_rule(sched)
    assert pol is not None, rule
    c0 = time.process_time()
    summary, _ = _run_fast(pol, rule, params, plan, h, rep, check, life, work)
    return summary, work, time.process_time() - c0


def events_of(work: dict[str, int], arrived: int) -> int:
    """The events a run processed: arrivals, admissions, preemptions, completions, and the
    request-slots stepped one by one (prefill chunks, budget stalls)."""
    return arrived + work["admissions"] + work["preemptions"] + work["completions"] + work["explicit_steps"]


def section_targets(requests: int) -> None:
    header(f"targets: {requests:.0e} requests, paper 1:1, λ = 1.2·μ, M = 131000 (target ≤ 10 s each)")
    params = ModelParams()
    plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, requests)
    T = horizon(plan)
    print(
        f"{len(plan)} requests over {T} slots; the compiled built-ins (sglang, its own engine, below)"
    )
    print(
        f"{'rule':<52}{'CPU s':>7}{'slots/s':>11}{'completed':>10}{'preempt':>9}{'stepped':>9}{'events':>10}"
        "  throughput/slot [95% CI]"
    )
    cases: list[tuple[str, Lifecycle]] = [
        (n, "kvstab") for n in builtin_names(include_negative=True) if fast_rule(load_scheduler(n)) is not None
    ]
    cases.append(("vllm-v1", "vllm"))
    for name, life in cases:
        # the negative control overflows M at once; check=False lets it run the whole horizon
        check = name != "current-fit-no-preempt"
        run(load_scheduler(name), params, plan, 10, lifecycle=life, record=False)  # compile / load the cache
        s, work, cpu = fast_run(name, params, plan, T, life, check)
        thr = s.throughput
        ci = f"{thr.value:.4f} [{thr.low:.4f}, {thr.high:.4f}]" if thr else "-"
        label = f"{name} ({life} lifecycle{'' if check else ', check=False'})"
        print(
            f"{label:<52}{cpu:>7.2f}{T / cpu:>11.0f}{s.completed:>10}{s.preemptions:>9}{work['full_slots']:>9}"
            f"{events_of(work, s.arrived):>10}  {ci}",
            flush=True,
        )
    print("stepped: slots run one by one (the others were skipped in quiet stretches); events: arrivals,")
    print("admissions, preemptions, completions and request-slots stepped one by one (prefill chunks)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process so far: {rss:.0f} MB (target < 1 GB for 10⁶ requests)")
    print("sglang (its own compiled engine), each lifecycle in a process of its own (peak RSS of the run):")
    print(f"{'rule':<36}{'CPU s':>7}{'slots/s':>11}{'completed':>10}{'retract':>9}{'stepped':>9}{'events':>10}"
          f"{'exact sums':>11}{'RSS MB':>8}  throughput/slot [95% CI]")  # fmt: skip
    for life in ("kvstab", "sglang"):
        r = _subprocess_json(["--sglang-case", life, str(requests)])
        if r is None:
            continue
        print(
            f"{'sglang (' + life + ' lifecycle)':<36}{r['cpu']:>7.2f}{r['slots'] / r['cpu']:>11.0f}{r['completed']:>10}"
            f"{r['preemptions']:>9}{r['full_slots']:>9}{r['events']:>10}{r['exact_sums']:>11}{r['rss_mb']:>8.0f}  "
            f"{r['ci']}",
            flush=True,
        )
    print("retract: requests retracted (SGLang's preemption); exact sums: slots whose float test fell within the")
    print("rounding bound and were decided on total_offset recomputed in Python's order")


def _subprocess_json(args: list[str]) -> dict[str, object] | None:
    """Run this script with ``args`` in a process of its own; its last stdout line, as JSON."""
    import json

    res = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"failed: {res.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def sglang_case(life: Lifecycle, requests: int) -> None:
    """One streamed sglang run of paper 1:1 at λ = 1.2·μ, M = 131000 on its compiled engine, as
    one JSON line (run in its own process by ``section_targets`` for its peak RSS)."""
    import json

    params = ModelParams()  # the server, under every lifecycle (the rule carries SGLang's knobs only)
    plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, requests)
    T = horizon(plan)
    fast_run("sglang", params, plan_for(PAPER_WORKLOADS["paper-1:1"], params, 100), 50, life)  # load the cache
    s, work, cpu = fast_run("sglang", params, plan, T, life)
    thr = s.throughput
    print(json.dumps({
        "cpu": cpu, "slots": T, "completed": s.completed, "preemptions": s.preemptions,
        "full_slots": work["full_slots"], "events": events_of(work, s.arrived), "exact_sums": work["exact_sums"],
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "ci": f"{thr.value:.4f} [{thr.low:.4f}, {thr.high:.4f}]" if thr else "-",
    }))  # fmt: skip




#: lookahead's finish-time table: the O(n) table only (the engine before the finish tree), the
#: tree from the first request, and as shipped (the table while few run)
LOOKAHEAD_TABLES: list[tuple[str, tuple[int, int] | None]] = [
    ("lookahead/table", (1 << 62, -1)),
    ("lookahead/tree", (0, -1)),
    ("lookahead", None),
]


def section_events(requests: int) -> None:
    """The cost per slot and per event as the number running grows with M, and as the load falls."""
    header(f"events: CPU per slot and per event ({requests} requests per point, paper 1:1, streamed)")
    w = PAPER_WORKLOADS["paper-1:1"]
    print(
        f"{'rule':<16}{'M':>9}{'λ/μ':>5}{'slots':>10}{'running':>9}{'stepped':>8}{'events':>10}{'ev/slot':>8}"
        f"{'CPU s':>7}{'ns/slot':>9}{'ns/event':>9}{'req-slots/ev':>13}"
    )
    points = [(M, 1.2) for M in (16_000, 131_000, 1_000_000, 8_000_000)] + [(131_000, 0.9), (131_000, 0.5)]
    cases: list[tuple[str, str, tuple[int, int] | None]] = [(r, r, None) for r in ("current-fit", "vllm-v1")]
    cases += [("lookahead", label, mode) for label, mode in LOOKAHEAD_TABLES]
    for rule, label, mode in cases:
        run(load_scheduler(rule), ModelParams(), plan_for(w, ModelParams(), 100), 10)  # compile / load the cache
        for M, lf in points if rule != "lookahead" else [(M, lf) for M, lf in points if lf == 1.2]:
            params = ModelParams(M=M)
            plan = plan_for(w, params, requests, lf)
            T = horizon(plan)
            with finish_table(mode):
                s, work, cpu = fast_run(rule, params, plan, T)
            ev = events_of(work, s.arrived)
            print(
                f"{label:<16}{M:>9}{lf:>5}{T:>10}{work['request_slots'] / T:>9.1f}"
                f"{work['full_slots'] / T:>7.0%} {ev:>10}{ev / T:>8.2f}{cpu:>7.2f}{cpu / T * 1e9:>9.0f}"
                f"{cpu / ev * 1e9:>9.0f}{work['request_slots'] / ev:>13.1f}",
                flush=True,
            )
    for M in (16_000, 131_000, 1_000_000):  # sglang on its own compiled engine (kvstab's lifecycle)
        params = ModelParams(M=M)
        plan = plan_for(w, params, requests, 1.2)
        T = horizon(plan)
        fast_run("sglang", params, plan_for(w, params, 100), 50)  # compile / load the cache
        s, work, cpu = fast_run("sglang", params, plan, T)
        ev = events_of(work, s.arrived)
        print(
            f"{'sglang':<16}{M:>9}{1.2:>5}{T:>10}{work['request_slots'] / T:>9.1f}"
            f"{work['full_slots'] / T:>7.0%} {ev:>10}{ev / T:>8.2f}{cpu:>7.2f}{cpu / T * 1e9:>9.0f}"
            f"{cpu / ev * 1e9:>9.0f}{work['request_slots'] / ev:>13.1f}   ({work['preemptions']} retracted, "
            f"{work['exact_sums']} exact sums)",
            flush=True,
        )
    print("running: mean requests running per slot (what a slot-by-slot loop steps each slot); stepped: share")
    print("of slots run one by one; req-slots/ev: request-slots a slot loop would step per event processed")
    # the token budget's per-slot fallback at vLLM's defaults (B = 16, budget = chunk = 2048, 256 seqs)
    params = ModelParams(M=131_000, chunk=2048, block=16, token_budget=2048, max_num_seqs=256)
    for life in ("kvstab", "vllm"):
        plan = plan_for(w, params, requests, 1.2)
        T = horizon(plan)
        s, work, cpu = fast_run("vllm-v1", params, plan, T, life)  # type: ignore[arg-type]
        print(
            f"vllm-v1 at vLLM's defaults ({life} lifecycle, λ = 1.2·μ): {T} slots, {work['full_slots']} stepped, "
            f"budget stalled a lazy decoder in {work['budget_slots']} slots ({work['budget_stalls']} request-slots); "
            f"{cpu:.2f} CPU s",
            flush=True,
        )
    # lookahead with blocks (B = 16): the tree adds a head's decode as one range per block
    print(f"{'lookahead, B=16':<16}{'M':>9}{'running':>9}{'CPU s':>7}{'ns/event':>9}  (table / tree / shipped)")
    for M in (131_000, 1_000_000, 8_000_000):
        params = ModelParams(M=M, block=16)
        plan = plan_for(w, params, requests, 1.2)
        T = horizon(plan)
        cells = []
        for _, mode in LOOKAHEAD_TABLES:
            with finish_table(mode):
                s, work, cpu = fast_run("lookahead", params, plan, T)
            cells.append(f"{cpu:.2f} s {cpu / events_of(work, s.arrived) * 1e9:.0f} ns")
        print(f"{'':<16}{M:>9}{work['request_slots'] / T:>9.1f}  " + " / ".join(cells), flush=True)


def section_vllm(steps: int) -> None:
    from kvstab.empirical.replay import replay_model as reference_model
    from kvstab.empirical.replay import replay_vllm
    from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
    from kvstab.engine import replay_model as fast_model
    from kvstab.steplog import ReplayConfig
    from kvstab.theory.area import expected_g

    header(f"vllm: the vLLM-matched model on one plan, {steps} steps (target ≥ 1000× vLLM's steps/s)")
    w = parse_workload("paper-1:1")
    cfg = ReplayConfig.for_capacity(131_000, 16, max_num_batched_tokens=512, max_num_seqs=256)
    rate = cfg.M / expected_g(w, ModelParams(M=cfg.M, chunk=512, g="continuous"))
    plan = poisson_arrivals(w, 1.3 * rate, ModelParams(bbar=1.0), steps, seed=0)
    fast_model(plan, cfg, 10)  # compile / load the cache
    fast = fast_model(plan, cfg, steps)
    print(f"fast model       {fast.wall_s:8.3f} s  {steps / fast.wall_s:12.0f} steps/s", flush=True)
    ref = reference_model(plan, cfg, steps)
    diff = ref.first_difference(fast)
    print(
        f"reference model  {ref.wall_s:8.3f} s  {steps / ref.wall_s:12.0f} steps/s   "
        f"fast vs reference: {'identical, step for step' if diff is None else 'DIFFER: ' + diff}",
        flush=True,
    )
    try:
        load_vllm()
        real = replay_vllm(plan, cfg, steps)
    except VllmUnavailable as exc:
        print(f"vllm: not installed ({exc}); install with scripts/install-vllm.sh .venv/bin/python")
        return
    diff = real.first_difference(fast)
    print(
        f"vLLM scheduler   {real.wall_s:8.3f} s  {steps / real.wall_s:12.0f} steps/s   "
        f"fast vs vLLM: {'identical, step for step' if diff is None else 'DIFFER: ' + diff}"
    )
    print(f"fast model / vLLM speed ratio: {real.wall_s / fast.wall_s:.0f}×")


def _outside(rule: str) -> Scheduler:
    """A rule behind a class kvstab does not know (so it runs on the plug-in path)."""
    return OutsideCurrentFit() if rule == "current-fit" else Outside(load_scheduler(rule))


def _plugin_counts(sched: Scheduler, params: ModelParams) -> str:
    """What the plug-in path's bank for ``sched`` holds: shapes taped, slots asked, tape memory."""
    from kvstab.engine import plugin

    bank = plugin._bank(sched, params)
    met = sum(bank.rental.met.values())
    return (
        f"{bank.count} view shapes taped ({bank.nbytes / 2**20:.1f} MB of tapes, {bank.evicted} evicted), "
        f"{met - bank.rental.taped_count} decisions asked of the rule itself"
    )


def plugin_case(rule: str, requests: int) -> None:
    """One long plug-in run, cold then again with the tapes kept, streamed (``record=False``):
    CPU seconds and the process's peak RSS, as one JSON line (run in its own process by
    ``section_plugin``, so that the peak is this case's)."""
    import json

    from kvstab.engine import _guards, plugin

    if rule.endswith("-full"):  # every row of every tape kept (no ASK rows): the tape budget does the bounding
        rule = rule[: -len("-full")]
        _guards.ASK_SHARE = None  # type: ignore[assignment]
    sched = _outside(rule)
    params = ModelParams()
    plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, requests)
    T = horizon(plan)
    run(sched, ModelParams(M=params.M + 1), plan_for(PAPER_WORKLOADS["paper-1:1"], params, 50), 10, engine="fast")
    plugin._TAPES.clear()
    c0 = time.process_time()
    cold = run(sched, params, plan, T, engine="fast", record=False)
    cc = time.process_time() - c0
    counts = _plugin_counts(sched, params)
    c0 = time.process_time()
    warm = run(sched, params, plan, T, engine="fast", record=False)
    cw = time.process_time() - c0
    print(json.dumps({
        "slots": T, "requests": len(plan), "engine": cold.engine, "cold": cc, "taped": cw, "counts": counts,
        "same": cold.summary == warm.summary, "preemptions": cold.summary.preemptions,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))  # fmt: skip


def section_plugin(requests: int, long: list[int], cases: list[str]) -> None:
    from kvstab.engine import plugin

    header(f"plugin: an outside rule on the plug-in path vs the reference engine ({requests} requests, paper 1:1)")
    sched = OutsideCurrentFit()
    params = ModelParams()
    plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, requests)
    T = horizon(plan)
    path, why = plugin.plugin_path(sched, "kvstab")
    print(f"plug-in path: {'yes' if path else 'no'} ({why})")
    # load the compiled loop from numba's cache on another M, so no tape is shared with the timed run
    run(sched, ModelParams(M=params.M + 1), plan, 10, engine="fast")
    plugin._TAPES.clear()
    c0 = time.process_time()
    t0 = time.perf_counter()
    cold = run(sched, params, plan, T)  # every view shape asked of the rule or taped during the run
    tc, cc = time.perf_counter() - t0, time.process_time() - c0
    counts = _plugin_counts(sched, params)
    c0 = time.process_time()
    t0 = time.perf_counter()
    warm = run(sched, params, plan, T)  # the tapes kept (a sweep's later points)
    tw, cw = time.perf_counter() - t0, time.process_time() - c0
    c0 = time.process_time()
    t0 = time.perf_counter()
    ref = run(sched, params, plan, T, engine="reference")
    tr, cr = time.perf_counter() - t0, time.process_time() - c0
    same = _first_difference(ref.result, cold.result) or _first_difference(ref.result, warm.result)
    print(f"{T} slots, {len(plan)} requests; engine: {cold.engine}; cold run: {counts}")
    print(f"reference         {tr:7.2f} s wall {cr:7.2f} s CPU {T / cr:10.0f} slots/s")
    print(
        f"plug-in (cold)    {tc:7.2f} s wall {cc:7.2f} s CPU {T / cc:10.0f} slots/s   speed-up {cr / cc:6.1f}× (CPU), "
        f"{tr / tc:.1f}× (wall)  (target ≥ 10× cold)"
    )
    print(f"plug-in (taped)   {tw:7.2f} s wall {cw:7.2f} s CPU {T / cw:10.0f} slots/s   speed-up {cr / cw:6.1f}× (CPU)")
    print(
        f"outcome: {'identical, every SimResult array' if same is None else 'DIFFER: ' + same}; "
        f"load averages now {load()}",
        flush=True,
    )
    for n in long:
        for rule in cases:
            what = (
                f"{rule[: -len('-full')]}'s rule, every tape row kept" if rule.endswith("-full") else f"{rule}'s rule"
            )
            header(f"plugin: {what} behind an outside class, {n} requests, streamed, in a process of its own")
            res = subprocess.run(
                [sys.executable, __file__, "--plugin-case", rule, str(n)], capture_output=True, text=True
            )
            if res.returncode != 0:
                print(f"failed: {res.stderr.strip().splitlines()[-1:]}")
                continue
            import json

            r = json.loads(res.stdout.strip().splitlines()[-1])
            slots = r["slots"]
            print(f"{slots} slots, {r['requests']} requests, {r['preemptions']} preemptions; engine {r['engine']}; "
                  f"cold run: {r['counts']}")  # fmt: skip
            print(f"plug-in (cold)    {r['cold']:7.2f} s CPU {slots / r['cold']:10.0f} slots/s")
            print(f"plug-in (taped)   {r['taped']:7.2f} s CPU {slots / r['taped']:10.0f} slots/s   "
                  f"(cold and taped summaries {'identical' if r['same'] else 'DIFFER'})")  # fmt: skip
            if rule.startswith("current-fit"):
                est = slots / (T / cr)  # the reference at its slots/s on the run above
                print(f"reference         {est:7.1f} s CPU (extrapolated from its {T / cr:.0f} slots/s above, not run)"
                      f"   speed-up cold {est / r['cold']:.1f}×, taped {est / r['taped']:.1f}×")  # fmt: skip
            print(f"peak RSS of the process {r['rss_mb']:.0f} MB (target < 1 GB); load averages now {load()}",
                  flush=True)  # fmt: skip


class Outside:
    """A built-in rule (sglang's) behind a class kvstab does not know, as a plug-in author might wrap
    it: no compiled path of its own, so the plug-in path runs it."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.name = f"outside-{inner.name}"
        self.description = f"{inner.name}'s rule behind an outside class"
        self.state_vars: tuple[StateVar, ...] = state_vars_of(inner)

    def decide(self, view: View, ops: Ops) -> Decision:
        """The wrapped rule's decision."""
        return self.inner.decide(view, ops)


def section_sglang(requests: list[int], reference_max: int) -> None:
    from kvstab.engine import plugin

    sched = load_scheduler("sglang")
    outside = Outside(sched)  # sglang's rule on the plug-in path
    params = ModelParams()
    # load the compiled loops from numba's cache on another M, so no tape is shared with the timed runs
    warm_plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, 50)
    for rule in (sched, outside):
        run(rule, ModelParams(M=params.M + 1), warm_plan, 10, engine="fast")
    for n in requests:
        header(f"sglang: its compiled engine vs its rule on the plug-in path vs the reference ({n} requests, paper 1:1)")
        plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, n)
        T = horizon(plan)
        c0, t0 = time.process_time(), time.perf_counter()
        comp = run(sched, params, plan, T)
        tf, cf = time.perf_counter() - t0, time.process_time() - c0
        assert comp.engine == "fast", comp.reason
        plugin._TAPES.clear()
        c0, t0 = time.process_time(), time.perf_counter()
        cold = run(outside, params, plan, T, engine="fast")
        tc, cc = time.perf_counter() - t0, time.process_time() - c0
        shapes = _plugin_counts(outside, params)
        print(f"{T} slots, {len(plan)} requests; plug-in engine: {cold.engine}; cold run: {shapes}")
        cf = max(cf, 1e-6)  # below the clock's resolution on a short run
        print(f"compiled          {tf:7.2f} s wall {cf:7.2f} s CPU {T / cf:10.0f} slots/s")
        print(f"plug-in (cold)    {tc:7.2f} s wall {cc:7.2f} s CPU {T / cc:10.0f} slots/s")
        same = _first_difference(comp.result, cold.result)
        if n <= reference_max:
            c0, t0 = time.process_time(), time.perf_counter()
            ref = run(sched, params, plan, T, engine="reference")
            tr, cr = time.perf_counter() - t0, time.process_time() - c0
            same = same or _first_difference(ref.result, comp.result)
            print(f"reference         {tr:7.2f} s wall {cr:7.2f} s CPU {T / cr:10.0f} slots/s")
            print(f"speed-up (CPU): compiled {cr / cf:.0f}×, plug-in cold {cr / cc:.1f}×")
        else:
            print(f"(reference engine not run above {reference_max} requests)")
        print(f"outcome: {'identical, every SimResult array' if same is None else 'DIFFER: ' + same}; retractions "
              f"{int(comp.result.preemptions.sum()) if comp.result is not None else '?'}; load averages now {load()}",
              flush=True)  # fmt: skip


@dataclass(frozen=True, slots=True)
class OutsideCurrentFit:
    """A plug-in as an outside author writes one: current-fit's rule, in a class kvstab
    does not know (so it has no compiled fast path of its own)."""

    name: str = "outside-current-fit"
    description: str = "current-fit's rule written outside kvstab (a plug-in)"
    traits: Traits = Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)

    def decide(self, view: View, ops: Ops) -> Decision:
        """Preempt the newest that do not fit; admit by current fit only if nothing was preempted."""
        preempt, kept = preempt_newest(view, ops)

        def fits(w: WaitingEntry, acc: IntLike) -> tuple[BoolLike, IntLike]:
            after = acc + held_first(view, w, ops)
            return ops.le(after, view.M), after

        return Decision(admit=fcfs_admit(view, ops, fits, kept, allowed=ops.not_(ops.or_(*preempt))), preempt=preempt)


def section_scaling(sizes: list[int], capacities: list[int], rules: list[str]) -> None:
    for rule in rules:
        header(f"scaling: {rule}, paper 1:1, λ = 1.2·μ; CPU seconds (ns per request)")
        print(f"{'requests':>10}" + "".join(f"{'M=' + str(M):>22}" for M in capacities))
        run(load_scheduler(rule), ModelParams(), plan_for(PAPER_WORKLOADS["paper-1:1"], ModelParams(), 100), 10)
        for n in sizes:
            row = f"{n:>10}"
            for M in capacities:
                params = ModelParams(M=M)
                plan = plan_for(PAPER_WORKLOADS["paper-1:1"], params, n)
                c0 = time.process_time()
                T = horizon(plan)
                run(load_scheduler(rule), params, plan, T, record=False, max_slots=max(T, 10_000_000))
                cpu = time.process_time() - c0
                row += f"{cpu:>12.2f} ({cpu / max(len(plan), 1) * 1e9:>6.0f} ns)"
            print(row, flush=True)


def _first_difference(a: SimResult | None, b: SimResult | None) -> str | None:
    assert a is not None and b is not None
    if a.slots != b.slots:
        return f"slots {a.slots} vs {b.slots}"
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        if x.shape != y.shape:
            return f"{f}: {x.size} vs {y.size} entries"
        bad = np.flatnonzero(x != y)
        if bad.size:
            return f"{f}[{int(bad[0])}]: reference {int(x[bad[0]])}, fast {int(y[bad[0]])}"
    return None


def section_check(slots: int, M: int, rules: list[str] | None = None, only: list[str] | None = None) -> None:
    header(f"check (b): fast vs reference engine, {slots} slots each, M = {M}, λ = 1.2·μ, every built-in")
    sources = {k: v for k, v in PAPER_WORKLOADS.items()}
    for name in ("azure-conv", "azure-code", "sharegpt", "arxiv"):
        sources[name] = parse_workload(f"trace({trace_path(name)})")
    params = ModelParams(M=M)
    bad = 0
    for wname, w in sources.items():
        if only is not None and wname not in only:
            continue
        rate = 1.2 * mu(w, params)
        plan = poisson_arrivals(w, rate, ModelParams(), slots, seed=1).fit_to(params, drop_oversize=True)
        cases: list[tuple[str, Lifecycle]] = [(n, "kvstab") for n in builtin_names(include_negative=True)]
        cases.append(("vllm-v1", "vllm"))
        for rule, life in cases:
            if rules is not None and rule not in rules:
                continue
            # lookahead: every place of its finish-time table (the O(n) table, the tree, as shipped)
            modes = LOOKAHEAD_TABLES if rule == "lookahead" else [(rule, None)]
            outs: list[object] = []
            t0 = time.perf_counter()
            # the negative control overflows early; check=False compares it over the whole horizon too
            check = rule != "current-fit-no-preempt"
            for engine, mode in [("reference", None)] + [("fast", m) for _, m in modes]:
                try:
                    with finish_table(mode):
                        outs.append(
                            run(
                                load_scheduler(rule), params, plan, slots, engine=engine, lifecycle=life, check=check
                            ).result  # type: ignore[arg-type]
                        )
                except InvariantViolation as exc:
                    outs.append(("violation", exc.slot, exc.requests))
                except InvalidArgument as exc:
                    outs.append(("refused", str(exc)))
            wall = time.perf_counter() - t0
            for (label, _), fast in zip(modes, outs[1:]):
                ref = outs[0]
                if isinstance(ref, SimResult) and isinstance(fast, SimResult):
                    diff = _first_difference(fast, ref)
                    what = f"{int(ref.completed.sum())} completed, {int(ref.preemptions.sum())} preemptions"
                else:
                    diff = None if ref == fast else f"{fast} vs {ref}"
                    what = str(ref)[:60]
                bad += diff is not None
                verdict = "identical" if diff is None else "DIFFER: " + diff
                print(
                    f"{wname:<11}{label + ' (' + life + ')':<34}{len(plan):>7} req  {wall:7.1f} s  {verdict}; {what}",
                    flush=True,
                )
        if rules is None or "sglang" in rules:
            bad += _check_sglang_log(wname, plan, M, slots)
    print(f"check (b): {'all identical' if bad == 0 else f'{bad} case(s) differ'}")


def _check_sglang_log(wname: str, plan: ArrivalPlan, M: int, slots: int) -> bool:
    """sglang under SGLang's lifecycle: every step of the compiled engine's step log against the
    reference engine's (the requests SGLang accepts); whether they differ."""
    from kvstab.empirical.sglang_replay import replay_sglang_model
    from kvstab.schedulers.sglang import Sglang

    rule, params = Sglang(), ModelParams(M=M)
    max_req_len = M - 1
    s = plan.s
    keep = (s < max_req_len - 5) & (np.minimum(np.minimum(plan.o, max_req_len - s - 1), M - s - 2) >= 1)
    kept = ArrivalPlan(plan.slot[keep], plan.s[keep], plan.o[keep])
    t0 = time.perf_counter()
    fast = replay_sglang_model(kept, rule, params, slots)
    ref = replay_sglang_model(kept, rule, params, slots, engine="reference")
    diff = ref.first_difference(fast)
    verdict = "identical, every step" if diff is None else "DIFFER: " + diff
    print(
        f"{wname:<11}{'sglang (sglang lifecycle, step log)':<34}{len(kept):>7} req  {time.perf_counter() - t0:7.1f} s  "
        f"{verdict}; engines {fast.engine}/{ref.engine}, {sum(ref.retractions)} retractions",
        flush=True,
    )
    return diff is not None


def section_python(slots: int) -> None:
    header(f"python: the compiled loop vs the same loop as plain Python ({slots} slots, current-fit, M = 131000)")
    code = (
        "import time;from kvstab.engine import run;from kvstab.registry import load_scheduler;"
        "from kvstab.model import ModelParams;from kvstab.arrivals import poisson_arrivals;"
        "from kvstab.workload import PAPER_WORKLOADS;from kvstab.theory import mu;"
        "w=PAPER_WORKLOADS['paper-1:1'];p=ModelParams();"
        f"pl=poisson_arrivals(w,1.2*mu(w,p),p,{slots},seed=0);"
        "run(load_scheduler('current-fit'),p,pl,10);t=time.perf_counter();"
        f"run(load_scheduler('current-fit'),p,pl,{slots});print(time.perf_counter()-t)"
    )
    for label, env in (("numba", {}), ("plain Python (NUMBA_DISABLE_JIT=1)", {"NUMBA_DISABLE_JIT": "1"})):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
        wall = float(res.stdout.strip() or "nan")
        print(f"{label:<36}{wall:8.2f} s  {slots / wall:10.0f} slots/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        choices=["targets", "events", "vllm", "plugin", "sglang", "scaling", "check", "python"],
        action="append",
    )
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests for the targets section")
    ap.add_argument("--events-requests", type=int, default=200_000, help="requests per point of the events section")
    ap.add_argument("--vllm-steps", type=int, default=4000)
    ap.add_argument("--plugin-requests", type=int, default=3000)
    ap.add_argument(
        "--plugin-long", default="100000", help="request counts of the plugin section's long runs ('' for none)"
    )
    ap.add_argument(
        "--plugin-cases",
        default="current-fit,sglang",
        help="rules of the long runs: current-fit, sglang (O(K²) tapes), sglang-full (the same, no ASK rows)",
    )
    ap.add_argument("--plugin-case", nargs=2, metavar=("RULE", "REQUESTS"), help=argparse.SUPPRESS)
    ap.add_argument("--sglang-case", nargs=2, metavar=("LIFECYCLE", "REQUESTS"), help=argparse.SUPPRESS)
    ap.add_argument("--sglang-requests", default="3000,100000", help="request counts of the sglang section")
    ap.add_argument("--sglang-reference-max", type=int, default=3000)
    ap.add_argument("--check-slots", type=int, default=100_000)
    ap.add_argument("--check-M", type=int, default=16_000)
    ap.add_argument("--check-rules", default="", help="built-ins of the check section (default: every one)")
    ap.add_argument("--check-sources", default="", help="workloads and traces of the check section (default: all)")
    ap.add_argument("--scaling", default="10000,100000,1000000", help="request counts of the scaling table")
    ap.add_argument("--scaling-rules", default="current-fit,lookahead", help="rules of the scaling tables")
    args = ap.parse_args()
    if args.plugin_case:  # one long run of the plugin section, in a process of its own
        plugin_case(args.plugin_case[0], int(args.plugin_case[1]))
        return
    if args.sglang_case:  # one sglang run of the targets section, in a process of its own
        sglang_case(args.sglang_case[0], int(args.sglang_case[1]))
        return
    todo = args.only or ["python", "targets", "events", "vllm", "plugin", "sglang", "scaling", "check"]
    print(f"bench_engine: {' '.join(todo)}; CPU affinity {sorted(os.sched_getaffinity(0))}")
    for name in todo:
        if name == "targets":
            section_targets(args.requests)
        elif name == "events":
            section_events(args.events_requests)
        elif name == "vllm":
            section_vllm(args.vllm_steps)
        elif name == "plugin":
            section_plugin(
                args.plugin_requests,
                [int(x) for x in args.plugin_long.split(",") if x],
                [x for x in args.plugin_cases.split(",") if x],
            )
        elif name == "sglang":
            section_sglang([int(x) for x in args.sglang_requests.split(",")], args.sglang_reference_max)
        elif name == "scaling":
            section_scaling(
                [int(x) for x in args.scaling.split(",")],
                [16_000, 131_000, 1_000_000],
                [x for x in args.scaling_rules.split(",") if x],
            )
        elif name == "check":
            section_check(
                args.check_slots,
                args.check_M,
                [x for x in args.check_rules.split(",") if x] or None,
                [x for x in args.check_sources.split(",") if x] or None,
            )
        elif name == "python":
            section_python(20_000)


if __name__ == "__main__":
    main()
