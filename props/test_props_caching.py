"""Prefix caching: shared-prefix workloads keep the block pool's invariant.

With ``--prefix-caching on`` memory is vLLM's block pool (``docs/MODEL.md``, "The model
with prefix caching"): a block shared by several requests is held once, and cached
blocks no request holds are free.  For every scheduler under audit that runs with
vLLM's block pool (``sglang`` runs SGLang's radix cache instead: there memory ``≤ M`` and
every request finishing are checked), Hypothesis draws small
servers and requests whose prompts start with a prefix of one shared prompt
(``SLOT:S:O:P``), runs them through the reference engine with its pool, and checks
after every slot:

* memory ``≤ M`` (the engine raises when the pool lacks a block a decision needs);
* the pool is consistent: a free block has no reference, and every block's reference
  count is the number of block tables holding it;
* the view the rule is shown next charges exactly the pool's blocks (each block to its
  oldest holder: ``Σ tokens_held`` over the view is the pool's memory), with ``shared``
  whole blocks and a queued entry's cached prefix whole blocks of at most ``s − 1``
  tokens — the premises ``kvstab prove --prefix-caching on`` proves the invariant under.

A failure names the slot and prints the ``kvstab replay … --prefix-caching on`` line.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstab.contract import Scheduler
from kvstab.errors import InvariantViolation
from kvstab.model import ModelParams, tokens_held
from kvstab.replay import parse_requests, replay_command
from kvstab.simulator import Engine
from kvstab.testing.pytest_plugin import AuditTarget, Budget

__all__ = ["pool_problems", "radix_workloads", "run_radix", "run_shared", "shared_workloads"]

#: rules whose cache is SGLang's radix tree, not vLLM's block pool (checked by :func:`run_radix`)
NO_CACHING = {"sglang"}


@st.composite
def shared_workloads(draw: st.DrawFn, max_requests: int = 6) -> tuple[ModelParams, str]:
    """A small server with prefix caching and a ``--requests`` line whose prompts share
    prefixes of one prompt (``P`` whole blocks, a partial block, or the whole prompt)."""
    B = draw(st.sampled_from([1, 2, 4]))
    M = B * draw(st.integers(2, 12))
    chunk = draw(st.sampled_from([2, 3, 8, 512]))
    n = draw(st.integers(1, max_requests))
    rows = []
    for _ in range(n):
        s = draw(st.integers(1, max(1, M - 1)))
        o = draw(st.integers(1, max(1, min(6, M - s))))
        if -(-(s + o) // B) * B > M:
            o = 1
            s = max(1, min(s, (M // B) * B - 1))
        P = draw(st.sampled_from([s, (s // B) * B, 0, max(0, s - 1)]))
        rows.append((draw(st.integers(0, 5)), s, o, P))
    rows.sort(key=lambda r: r[0])
    text = ",".join(f"{a}:{s}:{o}:{p}" if p else f"{a}:{s}:{o}" for a, s, o, p in rows)
    return ModelParams(M=M, chunk=chunk, block=B, prefix_caching=True), text


@st.composite
def radix_workloads(draw: st.DrawFn, max_requests: int = 6) -> tuple[ModelParams, str]:
    """A small SGLang server (page size 1) with prefix caching and a ``--requests`` line whose
    prompts share prefixes of one prompt; prompts stay below SGLang's ``max_req_len − 5``
    (``kvstab.lifecycles.sglang.clip_max_new``), which refuses longer ones at arrival."""
    M = draw(st.integers(16, 64))
    chunk = draw(st.sampled_from([2, 3, 8, 512]))
    rows = []
    for _ in range(draw(st.integers(1, max_requests))):
        s = draw(st.integers(1, M - 8))
        o = draw(st.integers(1, 6))
        P = draw(st.sampled_from([s, 0, max(0, s - 1), s // 2]))
        rows.append((draw(st.integers(0, 5)), s, o, P))
    rows.sort(key=lambda r: r[0])
    text = ",".join(f"{a}:{s}:{o}:{p}" if p else f"{a}:{s}:{o}" for a, s, o, p in rows)
    return ModelParams(M=M, chunk=chunk, block=1, prefix_caching=True), text


def pool_problems(engine: Engine) -> list[str]:
    """What is wrong with ``engine``'s pool and the view it would show now (empty: nothing)."""
    cache = engine.cache
    assert cache is not None
    kv, B = cache.kv, engine.params.block
    pool = kv.pool
    out: list[str] = []
    holders: dict[int, int] = {}
    for r in engine.active:
        for b in kv.get_blocks(r.rid):
            holders[b] = holders.get(b, 0) + 1
    for b in pool.free_queue():
        if pool.ref_count(b) != 0:
            out.append(f"block {b} is free (evictable) but {pool.ref_count(b)} request(s) reference it")
    for b in range(1, pool.config.num_blocks):
        if pool.ref_count(b) != holders.get(b, 0):
            out.append(f"block {b}: reference count {pool.ref_count(b)}, held by {holders.get(b, 0)} request(s)")
    for r in engine.active:
        if r.cached > r.s - 1:
            out.append(f"request {r.rid} was admitted with a cache hit of {r.cached} tokens, more than s − 1 = {r.s - 1} "
                       "(its last prompt token, the first output's logits, is never computed)")
    if cache.used_tokens > engine.params.M:
        out.append(f"the pool holds {cache.used_tokens} tokens, M={engine.params.M}")
    view = engine.view()
    charged = sum(int(tokens_held(int(a.progress), B)) for a in view.active)
    if charged != cache.used_tokens:
        out.append(f"the view charges {charged} tokens, the pool holds {cache.used_tokens}")
    for a in view.active:
        if int(a.shared) < 0 or int(a.shared) % B:
            out.append(f"request {a.rid}: shared {a.shared} is not whole blocks")
    for w in view.waiting:
        hit = int(w.cached) + int(w.shared)
        if int(w.cached) < 0 or hit % B or hit > engine.requests[int(w.rid)].s - 1:
            out.append(f"queued request {w.rid}: a cache hit of {hit} tokens (whole blocks, at most s − 1 = "
                       f"{engine.requests[int(w.rid)].s - 1})")
    return out


def run_shared(
    scheduler: Scheduler, spec: str, params: ModelParams, requests: str, *, install: object = None, max_slots: int = 300
) -> str | None:
    """Run the ``--requests`` line on the reference engine with caching and check the pool
    after every slot; the failure (with its replay line) or ``None``.  ``install`` may
    change the fresh engine first (a test installs a mutant pool)."""
    plan = parse_requests(requests)
    eng = Engine(scheduler, params, spec=spec)
    if callable(install):
        install(eng)
    bad: list[str] = []
    try:
        bad += eng.drain_checked(plan, lambda t: [f"slot {t}: {p}" for p in pool_problems(eng)], max_slots)
    except InvariantViolation as exc:
        bad.append(str(exc))
    except (AssertionError, ValueError, KeyError) as exc:  # a pool whose own bookkeeping breaks
        bad.append(f"slot {eng.slot}: the engine broke: {type(exc).__name__}: {exc}")
    if not bad:
        return None
    return f"{bad[0]}\n  replay: {replay_command(spec, params, plan)}"



def run_radix(scheduler: Scheduler, spec: str, params: ModelParams, requests: str, *, max_slots: int = 300) -> str | None:
    """Run the ``--requests`` line through the ``sglang`` rule with SGLang's radix cache
    (:func:`kvstab.lifecycles.sglang_radix.simulate_radix`, page size 1) until it drains, and
    check every slot: the allocator's memory (shared tokens once, the evictable cache included)
    stays ``≤ M``, and every request finishes.  The failure (with its replay line) or ``None``."""
    from kvstab.lifecycles.sglang_radix import simulate_radix

    plan = parse_requests(requests)
    res = simulate_radix(scheduler, params, plan, drain=True, max_slots=max_slots, spec=spec)  # type: ignore[arg-type]
    bad = [f"slot {t}: the radix cache's allocator holds {int(m)} tokens, M={params.M}"
           for t, m in enumerate(res.memory) if int(m) > params.M]
    if int(res.completed.sum()) != len(plan):
        bad.append(f"{len(plan) - int(res.completed.sum())} request(s) never finished within {len(res.memory)} slots")
    if not bad:
        return None
    return f"{bad[0]}\n  replay: {replay_command(spec, params, plan)}"


def test_shared_prefix_pool_invariant(audited_scheduler: AuditTarget, props_budget: Budget) -> None:
    """Every slot of every drawn shared-prefix workload keeps the pool's invariant (for ``sglang``:
    its radix cache's, :func:`run_radix`, on servers of page size 1, SGLang's default)."""
    radix = audited_scheduler.spec in NO_CACHING or getattr(audited_scheduler.scheduler, "name", "") in NO_CACHING
    __tracebackhide__ = True

    draws = radix_workloads if radix else shared_workloads

    @settings(max_examples=props_budget.max_examples)
    @given(drawn=draws(max_requests=min(6, props_budget.max_requests)))
    def check(drawn: tuple[ModelParams, str]) -> None:
        __tracebackhide__ = True
        params, requests = drawn
        if radix:
            failure = run_radix(audited_scheduler.scheduler, audited_scheduler.spec, params, requests)
        else:
            failure = run_shared(audited_scheduler.scheduler, audited_scheduler.spec, params, requests)
        assert failure is None, f"the pool's invariant under prefix caching is broken: {failure}"

    check()
