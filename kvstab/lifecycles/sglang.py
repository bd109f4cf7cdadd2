"""SGLang's request lifecycle in kvstab's reference engine.

The ``sglang`` rule (:mod:`kvstab.schedulers.sglang`) is SGLang 0.5.23's
scheduling decision; :class:`SglangEngine` maps the request lifecycle around
it, through the engine's extension points only:

* **Arrival** (``init_req_max_new_tokens``, ``srt/managers/scheduler.py:2700``):
  SGLang clips ``max_new_tokens`` so that an empty pool can always admit the
  request — ``min(max_new, max_req_len − s − 1, M − B⌈s/B⌉ − B − 1)`` with
  ``max_req_len = min(context_len − 1, M − 1)`` — and refuses a prompt of
  ``max_req_len − 5`` tokens or more.  The engine does the same.
* **The last prefill step samples output token 1**, as in vLLM: a SGLang
  request ``(s, max_new)`` is the kvstab request ``(s, max_new − 1)``
  (:attr:`min_output` is 0: ``max_new = 1`` ends with its prefill).
* **Retraction keeps the outputs** (``retract_decode``, ``schedule_batch.py:3451``):
  the victim's KV is freed and it later re-prefills its prompt and the ``k``
  tokens it produced, ``(s + k, o − k)`` in kvstab's lengths
  (:func:`~kvstab.lifecycles.vllm.resumed_lengths`), while SGLang keeps
  counting its original prompt and all its outputs.  The engine keeps ``k``
  per request and shows it to the rule as ``prior`` on every view entry.
* **Victims go to the tail of the queue** (``_add_request_to_queue``,
  ``scheduler.py:3480``) in the order SGLang retracted them (:meth:`requeue`).

The server is the run's :class:`~kvstab.model.ModelParams`, passed alongside
the rule (which holds SGLang's own knobs only); :func:`check_server` refuses a
server SGLang cannot be started on.

:func:`replay_reference` steps a plan through it, one SGLang step per slot
(idle steps included: SGLang resets ``new_token_ratio`` when idle), and
returns :class:`~kvstab.steplog.SglangModelLog`, the per-step record the
cross-check against SGLang's own scheduler compares.
(:func:`kvstab.empirical.sglang_replay.replay_sglang_model` gives the same log
from the compiled engine.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import ActiveEntry, Decision, View, WaitingEntry
from kvstab.errors import InvalidArgument
from kvstab.lifecycles.vllm import resumed_lengths
from kvstab.model import ModelParams, tokens_held
from kvstab.prefix import Prompt
from kvstab.prefix_cache import Hit
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import Engine, RequestState, SlotRecord
from kvstab.steplog import SglangModelLog, SglangStep
from kvstab.validation import MAX_SLOTS

__all__ = ["SglangEngine", "SglangActive", "SglangWaiting", "check_server", "clip_max_new", "max_req_len",
           "replay_reference"]


@dataclass(frozen=True, slots=True)
class SglangActive(ActiveEntry):
    """An active entry with the outputs its request produced before its last retraction."""

    prior: int = field(default=0, metadata={"help": "outputs produced before the last retraction"})


@dataclass(frozen=True, slots=True)
class SglangWaiting(WaitingEntry):
    """A waiting entry with the outputs its request produced before its last retraction."""

    prior: int = field(default=0, metadata={"help": "outputs produced before the last retraction"})


def check_server(params: ModelParams, *, radix: bool = False) -> ModelParams:
    """``params`` if SGLang can run on it, else :class:`InvalidArgument` naming the constraint:
    the chunk is a whole number of pages (``chunked_prefill_size % page_size == 0``,
    ``arg_groups/validation_hook.py:244``) and there is no token budget shared by all
    requests (SGLang's ``max_prefill_tokens`` is the rule's knob, a soft cap).  Prefix caching
    is refused unless ``radix``: this module's engine (and the compiled one) run SGLang with
    ``--disable-radix-cache``; the radix cache is :mod:`kvstab.lifecycles.sglang_radix`'s."""
    if params.chunk % params.block:
        raise InvalidArgument(
            f"sglang: chunk={params.chunk} must be a multiple of the page size block={params.block} "
            "(SGLang's chunked_prefill_size % page_size == 0)"
        )
    if params.token_budget is not None:
        raise InvalidArgument(
            f"sglang: SGLang has no token budget shared by all requests, got token_budget={params.token_budget} "
            "(its max_prefill_tokens is the rule's knob)"
        )
    if params.prefix_caching and not radix:
        raise InvalidArgument(
            "sglang: this engine runs SGLang without its radix cache; with prefix caching on, the radix-cache "
            "model (kvstab.lifecycles.sglang_radix, the reference engine) runs instead"
        )
    return params


def max_req_len(rule: Sglang, params: ModelParams) -> int:
    """SGLang's ``max_req_len``: ``min(context_len − 1, M − 1)`` (``M − 1`` without a context length)."""
    return params.M - 1 if rule.context_len is None else min(rule.context_len - 1, params.M - 1)


def clip_max_new(rule: Sglang, params: ModelParams, s: int, max_new: int) -> int:
    """SGLang's ``max_new_tokens`` for a prompt of ``s`` tokens once clipped at arrival
    (``scheduler.py:2700``) on the server ``params``; :class:`InvalidArgument` for a prompt
    SGLang refuses."""
    B = params.block
    limit = max_req_len(rule, params)
    if s >= limit - 5:
        raise InvalidArgument(
            f"a prompt of {s} tokens is refused by SGLang: it must be shorter than max_req_len - 5 = "
            f"{limit - 5} (M={params.M}, context_len={rule.context_len})"
        )
    paged_s = -(-s // B) * B
    return max(0, min(max_new, limit - s - 1, params.M - paged_s - B - 1))


class SglangEngine(Engine):
    """kvstab's engine with SGLang's request lifecycle (see the module docstring).

    Requests are given in SGLang's terms (``max_new_tokens = o``);
    :attr:`sg_max_new` keeps each one after SGLang's arrival clip.  ``params`` is
    the server, which :func:`check_server` checks.
    """

    min_output = 0

    def __init__(self, rule: Sglang, params: ModelParams, *, check: bool = True, window: int = 8) -> None:
        super().__init__(rule, check_server(params), check=check, window=window)
        self.rule = rule
        self.sg_max_new: list[int] = []  # max_new_tokens after the arrival clip
        self.prior: list[int] = []  # outputs produced before the last retraction
        self.recomputed: list[int] = []  # tokens whose KV was thrown away and computed again
        self._retract_key: dict[int, tuple[int, int]] = {}
        self.last_view: View | None = None
        self.last_grants: tuple[int, ...] = ()

    def arrive(self, s: int, o: int, prompt: Prompt | None = None, output: int | None = None) -> int:
        """A SGLang request with prompt ``s`` and ``max_new_tokens = o`` arrives now (its content,
        ``prompt`` and ``output``, matters only with prefix caching, which SGLang's engine refuses)."""
        for name, v in (("s", s), ("o", o)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidArgument(f"request length {name} must be an integer >= 1, got {v!r}")
        max_new = clip_max_new(self.rule, self.params, int(s), int(o))
        if max_new < 1:
            raise InvalidArgument(
                f"request (s={s}, max_new={o}): SGLang clips max_new_tokens to 0 at M={self.params.M}; "
                "use a shorter prompt"
            )
        rid = super().arrive(int(s), max_new - 1)
        self.sg_max_new.append(max_new)
        self.prior.append(0)
        self.recomputed.append(0)
        return rid

    def view(self, window: int | None = None, shown: dict[int, Hit] | None = None) -> View:
        """The view with each entry's ``prior`` outputs (the rule is clairvoyant: ``o`` is shown)."""
        base = super().view(window, shown)
        pri = self.prior
        return replace(
            base,
            active=tuple(SglangActive(a.rid, a.s, a.o, a.progress, a.present, pri[a.rid]) for a in base.active),
            waiting=tuple(SglangWaiting(w.rid, w.s, w.o, w.present, pri[w.rid]) for w in base.waiting),
        )

    def decide(self) -> tuple[View, Decision]:
        """The engine's decision, kept for the step log (which requests worked, and how)."""
        view, decision = super().decide()
        self.last_view = view
        self.last_grants = tuple(int(g) for g in decision.grants) if decision.grants is not None else ()
        return view, decision

    def on_preempt(self, r: RequestState) -> None:
        """A retracted request keeps its outputs: it comes back with them as prompt."""
        k = r.progress - r.s + 1 if r.progress >= r.s else 0
        prior = self.prior[r.rid]
        # SGLang's retraction key, taken before the lengths change (schedule_batch.py:3542)
        self._retract_key[r.rid] = (r.progress - r.s + 1 + prior, -(r.s - prior))
        self.recomputed[r.rid] += r.progress
        self.prior[r.rid] = prior + k
        r.s, r.o = resumed_lengths(r.s, r.o, r.progress)

    def step(self) -> SlotRecord:
        """One step; after a retraction the kept requests run in SGLang's order: ``retract_decode``
        filters the batch to its sorted keep list (``schedule_batch.py:3532``), most outputs
        first, then the shorter original prompt, ties in batch order (a stable sort)."""
        rec = super().step()
        if rec.preempted:
            self.active.sort(key=self.keep_key, reverse=True)
        return rec

    def keep_key(self, r: RequestState) -> tuple[int, int]:
        """SGLang's retraction key ``(outputs, −original prompt)`` of a decoding request (kept first when larger)."""
        pri = self.prior[r.rid]
        return (r.progress - r.s + 1 + pri, -(r.s - pri))

    def requeue(self, victims: list[RequestState]) -> None:
        """Victims join the tail of the queue in SGLang's retraction order: fewest
        outputs first, then longest original prompt, then latest in the batch."""
        order = sorted(range(len(victims)), key=lambda i: (*self._retract_key[victims[i].rid], -i))
        self.waiting.extend(victims[i] for i in order)


def replay_reference(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int | None = None,
    *,
    max_steps: int = MAX_SLOTS,
) -> SglangModelLog:
    """Replay ``plan`` (``o`` = SGLang's ``max_new_tokens``) on :class:`SglangEngine`,
    the ``sglang`` rule with SGLang's lifecycle on the server ``params``: ``steps`` steps, or (``None``) until
    every request has arrived and finished, at most ``max_steps``.  Every step is
    recorded, idle ones too."""
    start = time.perf_counter()
    eng = SglangEngine(rule, params)
    n = len(plan)
    arrival: list[int] = []
    log: list[SglangStep] = []
    i = 0
    t = 0
    while (t < steps) if steps is not None else (i < n or not eng.idle):
        if t >= max_steps:
            raise InvalidArgument(f"the SGLang model did not drain within {max_steps} steps")
        while i < n and int(plan.slot[i]) <= t:
            eng.arrive(int(plan.s[i]), int(plan.o[i]))
            arrival.append(t)
            i += 1
        before = {r.rid: r.progress for r in eng.active}
        prefilling = {r.rid for r in eng.active if r.progress < r.s}
        rec = eng.step()
        view = eng.last_view
        assert view is not None
        rids = [a.rid for a in view.active] + [w.rid for w in view.waiting]
        work: list[tuple[int, int]] = []
        prefill = decode = 0
        for rid, g in zip(rids, eng.last_grants):
            r = eng.requests[rid]
            if rid in rec.preempted or g <= 0:
                continue
            done = r.progress - before.get(rid, 0)
            if done <= 0:
                continue
            work.append((rid, done))
            if rid in prefilling or rid not in before:
                prefill += done
            else:
                decode += done
        if rec.preempted:
            # the batch SGLang decodes after a retraction is its sorted keep list (see SglangEngine.step)
            order = sorted(range(len(work)), key=lambda j: eng.keep_key(eng.requests[work[j][0]]), reverse=True)
            work = [work[j] for j in order]
        kind = "prefill" if prefill else "decode" if decode else "idle"
        retracted = tuple(r.rid for r in eng.waiting if r.rid in set(rec.preempted))
        kv = sum(int(tokens_held(r.progress, params.block)) for r in eng.active)
        ratio, full = rec.state
        log.append(
            SglangStep(
                step=t,
                kind=kind,
                admitted=rec.admitted,
                retracted=retracted,
                finished=rec.completed,
                tokens=tuple(work),
                prefill_tokens=prefill,
                decode_tokens=decode,
                kv_used=kv,
                new_token_ratio=float(ratio),
                batch_is_full=int(full),
                queue=rec.queue,
            )
        )
        t += 1
    reqs = eng.requests
    return SglangModelLog(
        rule=rule,
        params=params,
        steps=tuple(log),
        s=tuple(int(x) for x in plan.s[:i]),
        max_new=tuple(eng.sg_max_new),
        arrival=tuple(arrival),
        first_admit=tuple(r.first_admit for r in reqs),
        finish=tuple(r.finish for r in reqs),
        retractions=tuple(r.preemptions for r in reqs),
        recomputed=tuple(eng.recomputed),
        wall_s=time.perf_counter() - start,
    )
