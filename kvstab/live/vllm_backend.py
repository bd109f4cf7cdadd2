"""The emulator's batching by vLLM's own v1 scheduler (needs the vLLM extra, ``scripts/install-vllm.sh``).

:class:`VllmBackend` drives ``vllm.v1.core.sched.scheduler.Scheduler`` through
:class:`kvstab.empirical.vllm_driver.VllmDriver` one step at a time, the way
:meth:`VllmDriver.replay` does for a whole plan: ``schedule()``, then a
``ModelRunnerOutput`` that samples one token for every request whose
computed tokens reach its length, then ``update_from_output``.  No model
runs; only the scheduling decisions, the KV pool and the request lifecycle
are vLLM's.  With prefix caching on, a prompt sent as token ids is given to
vLLM as those ids (so its own block pool finds shared prefixes), and vLLM's
own prefix-cache counters feed ``/metrics``.
"""

from __future__ import annotations

from typing import Any

from kvstab.empirical.replay import composition
from kvstab.empirical.vllm_driver import VllmDriver
from kvstab.errors import InvalidArgument
from kvstab.live.emulator import StepOutcome
from kvstab.steplog import ReplayConfig

__all__ = ["VllmBackend"]


class VllmBackend:
    """vLLM 0.33.0's scheduler as an emulator backend (``kvstab serve --emulate --scheduler vllm``)."""

    name = "vLLM scheduler"

    def __init__(self, config: ReplayConfig, max_model_len: int) -> None:
        self.driver = VllmDriver(config, max_model_len)
        self.sched: Any = self.driver.sched
        self.block = config.block_size
        self.max_model_len = max_model_len
        self._next = 0
        self._o: dict[int, int] = {}
        self._prompt_end: dict[str, int] = {}  # where each request's (re)prefill ends
        self.caching = config.enable_prefix_caching
        kv = self.sched.kv_cache_manager
        if self.caching and kv.prefix_cache_stats is None:
            # the driver's scheduler logs no stats; vLLM's own counting (kv_cache_manager.py:255-264) needs them
            from vllm.v1.metrics.stats import PrefixCacheStats

            kv.log_stats = True
            kv.prefix_cache_stats = PrefixCacheStats()

    def arrive(self, s: int, o: int, ids: list[int] | None = None) -> int:
        if s + o > self.max_model_len:
            raise InvalidArgument(f"s + o = {s + o} exceeds max_model_len={self.max_model_len}")
        rid = self._next
        self._next += 1
        request = self.driver.request(rid, s, o)
        if self.caching and ids is not None:
            v = self.driver.v
            request = v.Request(str(rid), list(ids), v.SamplingParams(max_tokens=o, ignore_eos=True), None,
                                arrival_time=0.0, block_hasher=self.driver.hasher)
        self.sched.add_request(request)
        self._prompt_end[str(rid)] = s
        self._o[rid] = o
        return rid

    @property
    def idle(self) -> bool:
        return not self.sched.requests

    @property
    def waiting(self) -> int:
        return len(self.sched.waiting) + len(getattr(self.sched, "kv_holding_waiting", ()))

    def step(self) -> StepOutcome:
        v, sched = self.driver.v, self.sched
        out = sched.schedule()
        preempted = out.preempted_req_ids or set()
        for rid in preempted:
            # the resumed request recomputes all its tokens as a prompt
            self._prompt_end[rid] = sched.requests[rid].num_tokens
        scheduled = out.num_scheduled_tokens
        ids = list(scheduled)
        work: list[tuple[int, int, bool]] = []
        sampled: list[list[int]] = []
        for rid in ids:
            new = scheduled[rid]
            r = sched.requests[rid]
            c0 = r.num_computed_tokens - new  # schedule() has already advanced it
            work.append((c0, new, c0 < self._prompt_end[rid]))
            sampled.append([7] if r.num_computed_tokens >= r.num_tokens else [])
        mro = v.ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: j for j, rid in enumerate(ids)},
                                  sampled_token_ids=sampled)
        sched.update_from_output(out, mro)
        done = tuple(int(rid) for rid in ids if rid not in sched.requests)
        for rid in done:
            self._prompt_end.pop(str(rid), None)
        free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        stats = sched.kv_cache_manager.make_prefix_cache_stats() if self.caching else None
        return StepOutcome(
            completed=done,
            preempted=len(preempted),
            tokens=int(out.total_num_scheduled_tokens),
            composition=composition(work),
            running=len(sched.running),
            waiting=self.waiting,
            kv_tokens=(self.driver.usable - free) * self.block,
            prefix_queries=0 if stats is None else int(stats.queries),
            prefix_hits=0 if stats is None else int(stats.hits),
        )

    def emitted(self, rid: int) -> int:
        r = self.sched.requests.get(str(rid))
        return self._o[rid] if r is None else int(r.num_output_tokens)

    def abort(self, rid: int) -> None:
        from vllm.v1.request import RequestStatus

        if str(rid) in self.sched.requests:
            self.sched.finish_requests(str(rid), RequestStatus.FINISHED_ABORTED)
