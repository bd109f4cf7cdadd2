"""Refuting a rule under prefix caching: a concrete search over shared-prefix workloads.

With caching on, ``kvstab prove`` proves the per-slot memory invariant by the
prefix-fold theorem over views with shared blocks (:mod:`kvstab.proofs.unbounded`).
When that theorem does not apply, the bounded encoding cannot stand in: it has no
block pool, so a run it decodes (without sharing) need not behave the same on the
reference engine with caching on (a preempted request finds its own cached blocks
again, rule 10 of ``docs/MODEL.md``).  This module looks for a counterexample where
it can be replayed exactly: small workloads whose prompts share one prefix (the
``SLOT:S:O:P`` items ``kvstab replay --prefix-caching on`` reads), run on the
reference engine with its block pool, which checks the pool's invariant every slot.

The search is deterministic (a seeded generator, a fixed number of tries) and
shrinks what it finds greedily (fewer requests, then smaller ``M``, lengths,
shared prefixes and arrival slots), so the replay line is short.  Finding nothing
is an ``Unknown``, never a pass.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

from kvstab.contract import Scheduler
from kvstab.errors import InvalidScheduler
from kvstab.proofs.encoding import Setting
from kvstab.proofs.verdicts import Trace
from kvstab.replay import parse_requests, replay, replay_command

__all__ = ["SEARCH_TRIES", "Workload", "search_shared", "violates"]

#: workloads drawn before the search gives up (each runs a few slots on the reference engine)
SEARCH_TRIES = 600

#: slots a drawn workload may run before it counts as safe
SEARCH_SLOTS = 200


@dataclass(frozen=True, slots=True)
class Workload:
    """A server size and ``(slot, s, o, P)`` requests: ``P`` tokens of one shared prefix."""

    M: int
    rows: tuple[tuple[int, int, int, int], ...]

    def text(self) -> str:
        """The ``--requests`` form."""
        return ",".join(f"{a}:{s}:{o}:{p}" if p else f"{a}:{s}:{o}" for a, s, o, p in self.rows)


def violates(sched: Scheduler, spec: str | None, setting: Setting, w: Workload) -> tuple[int, int] | None:
    """``(slot, memory)`` of the first broken invariant when ``w`` runs on the reference
    engine with caching on, else ``None`` (a rule the engine rejects counts as safe here)."""
    if any(p > s for _, s, _, p in w.rows) or not w.rows:
        return None
    params = setting.params(w.M)
    if any(-(-(s + o) // params.block) * params.block > w.M for _, s, o, _ in w.rows):
        return None  # the engine rejects a request whose peak does not fit
    try:
        out = replay(sched, params, parse_requests(w.text()), max_slots=SEARCH_SLOTS, spec=spec)
    except InvalidScheduler:
        return None
    v = out.violation
    return None if v is None else (v.slot, v.memory)


def _draws(setting: Setting, seed: int) -> Iterator[Workload]:
    """Small shared-prefix workloads: a few blocks of memory, a few requests a slot apart."""
    rng = random.Random(seed)
    B = setting.block
    while True:
        M = B * rng.randint(2, 12)
        n = rng.randint(2, 4)
        rows = []
        for _ in range(n):
            s = rng.randint(1, max(1, M - 1))
            o = rng.randint(1, max(1, min(6, M - s)))
            p = rng.choice([0, s, B * (s // B), B * rng.randint(0, s // B)])
            rows.append((rng.randint(0, 3), s, o, min(p, s)))
        rows.sort(key=lambda r: r[0])
        yield Workload(M, tuple(rows))


def _smaller(w: Workload, B: int) -> Iterator[Workload]:
    """Each one-step simplification of ``w``, most drastic first."""
    rows = list(w.rows)
    for i in range(len(rows)):
        yield Workload(w.M, tuple(rows[:i] + rows[i + 1 :]))
    if w.M > B:
        yield Workload(w.M - B, w.rows)
    for i, (a, s, o, p) in enumerate(rows):
        for r in ((a, s, o - 1, p), (a, s - 1, o, min(p, s - 1)), (a, s, o, p - 1), (a - 1, s, o, p)):
            if min(r[1], r[2]) >= 1 and r[0] >= 0 and r[3] >= 0:
                yield Workload(w.M, tuple(sorted(rows[:i] + [r] + rows[i + 1 :], key=lambda x: x[0])))


def search_shared(
    sched: Scheduler, spec: str | None, setting: Setting, *, seed: int = 0, tries: int = SEARCH_TRIES,
    seconds: float | None = None,
) -> Trace | None:
    """The first drawn shared-prefix workload that breaks the invariant, shrunk, as a
    replayed :class:`Trace` with its ``kvstab replay … --prefix-caching on`` line; ``None``
    when ``tries`` draws (or ``seconds``) find none.  A fixed ``setting.M`` is used as is."""
    t0 = time.perf_counter()
    found: Workload | None = None
    for k, w in enumerate(_draws(setting, seed)):
        if k >= tries or (seconds is not None and time.perf_counter() - t0 > seconds):
            return None
        if setting.M is not None:
            w = Workload(setting.M, w.rows)
        if violates(sched, spec, setting, w):
            found = w
            break
    assert found is not None
    shrinking = True
    while shrinking:
        shrinking = False
        for smaller in _smaller(found, setting.block):
            if setting.M is not None and smaller.M != setting.M:
                continue
            if violates(sched, spec, setting, smaller):
                found, shrinking = smaller, True
                break
    hit = violates(sched, spec, setting, found)
    assert hit is not None
    slot, memory = hit
    name = spec if spec is not None else getattr(sched, "name", "?")
    plan = parse_requests(found.text())
    return Trace(
        kind="reachable",
        M=found.M,
        chunk=setting.chunk,
        block=setting.block,
        arrivals=tuple((a, s, o) for a, s, o, _ in found.rows),
        initial_active=(),
        initial_waiting=(),
        slots=(),
        violation_slot=slot,
        violation_memory=memory,
        replay_command=replay_command(name, setting.params(found.M), plan),
        replayed=True,
        replay_message=f"(found by a search over shared-prefix workloads; shared prefixes P = "
        f"{[p for *_, p in found.rows]})",
    )
