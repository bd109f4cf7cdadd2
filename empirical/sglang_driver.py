"""Drive SGLang 0.5.23's own scheduler on a CPU, with simulated model outputs.

No GPU, no weights, no network.  The scheduling decision is SGLang's own
code: ``Scheduler.get_next_batch_to_run`` and the methods it calls
(``get_new_batch_prefill``, ``_get_new_batch_prefill_raw``,
``update_running_batch``, ``_add_request_to_queue``, ``stash_chunked_request``;
``srt/managers/scheduler.py:3894-4560``) run as unbound methods on an object
made with ``Scheduler.__new__`` — its ``__init__`` builds the model worker and
ZMQ sockets — that carries the attributes those methods read.  Under them run
SGLang's real ``PrefillAdder``/``SchedulePolicy`` (FCFS), ``ScheduleBatch``
(``prepare_for_extend``, ``check_decode_mem``, ``retract_decode``,
``prepare_for_decode``, ``filter_batch``, ``merge_batch``), ``ReqToTokenPool``,
the token (or paged) KV allocator without KV tensors, the radix cache with
``disable=True`` (what ``--disable-radix-cache`` builds,
``mem_cache/registry.py:91``) and ``NewTokenRatioTracker``.

What is kvstab's glue, not SGLang's code, and why:

* the subsystems the scheduler consults that a CPU replay has none of
  (DP attention, n-gram embeddings, grammars, beams, metrics, the load
  reporter) are pass-through objects (:class:`_PassThrough`): each returns
  the batch it is given, nothing, or zero;
* the *model's output*: ``event_loop_normal`` (``scheduler.py:2026``) runs
  the batch and calls ``process_batch_result``, which needs logits; instead
  every request of an extend batch that is not the in-flight chunk gets one
  sampled token, every request of a decode batch one token, then
  ``Req.update_finish_state`` (the real finish test: ``max_new_tokens`` with
  ``ignore_eos=False``, the EOS id never sampled) and, for finished ones,
  ``release_kv_cache`` — what ``process_batch_result_prefill/decode``
  (``scheduler_components/batch_result_processor.py:258``, ``:952``) do for a
  plain generation request;
* arrival: ``init_req_max_new_tokens`` (``scheduler.py:2693``) is SGLang's
  own method, called on the same object; the request is then queued by the
  real ``_add_request_to_queue``;
* an idle step (no batch) calls ``NewTokenRatioTracker.reset`` when nothing
  runs or waits, which is what ``on_idle`` (``scheduler.py:5241``) does to the
  scheduling state (the rest of it is health checks and metrics).

SGLang is imported here and nowhere else in kvstab, and only when a replay
asks for it; a missing SGLang, or another version, is one line naming
``scripts/install-sglang.sh``.  Two modules SGLang's import graph reaches but
the scheduler never uses are stubbed for the duration of that import only:
``torchvision`` (its PyPI wheel does not load against the CPU torch) and, when
it is not installed, ``tvm_ffi``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
import types
import warnings
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from kvstab.arrivals import ArrivalPlan
from kvstab.empirical.sglang_replay import replay_sglang_model
from kvstab.empirical.vllm_driver import _cpu_offline_env, _one_line
from kvstab.errors import InvalidArgument, KvstabError
from kvstab.lifecycles.sglang import check_server
from kvstab.lifecycles.sglang_radix import answer_tokens, request_tokens
from kvstab.model import ModelParams
from kvstab.prefix import PromptSet
from kvstab.schedulers.sglang import Sglang
from kvstab.steplog import STEP_FIELDS, SglangModelLog, SglangStep
from kvstab.validation import MAX_SLOTS

__all__ = [
    "SglangUnavailable",
    "SglangDriver",
    "SglangRun",
    "load_sglang",
    "replay_sglang",
    "run_sglang",
    "IgnoreEosCheck",
    "check_ignore_eos",
    "first_differing_step",
    "TRACED",
    "SGLANG_VERSION",
    "INSTALL_HINT",
]

#: The SGLang release the cross-check is written against.
SGLANG_VERSION = "0.5.23"
#: How to get it (kept in one place: every "missing SGLang" message quotes it).
INSTALL_HINT = "run scripts/install-sglang.sh (SGLang 0.5.23's scheduler for CPU, about 2 minutes)"

#: The token id every simulated step samples: never SGLang's EOS (see ``_model_config``).
_TOKEN = 7
_EOS = 2


class SglangUnavailable(KvstabError):
    """SGLang is not installed, or not the version the cross-check is written against."""


class _Placeholder:
    """Any attribute of a stubbed module: itself callable, its attributes placeholders too."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder(f"{self._name}()")

    def __repr__(self) -> str:
        return f"<kvstab stub {self._name}>"


class _StubModule(types.ModuleType):
    """A stubbed module: every attribute is a :class:`_Placeholder`."""

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of the stubbed packages (and their sub-modules) with :class:`_StubModule`."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        # transformers parses torchvision's version (is_torchvision_greater_or_equal)
        mod.__version__ = "0.0.0"  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextmanager
def _stubs() -> Iterator[None]:
    """Stub ``torchvision`` (and ``tvm_ffi`` when absent) for one import, then take the stubs away
    again, so that nothing imported later in the process sees them."""
    roots: tuple[str, ...] = ("torchvision",) if importlib.util.find_spec("tvm_ffi") else ("torchvision", "tvm_ffi")
    if "torchvision" in sys.modules:
        # already imported for real by someone else: SGLang shares it.  An installed but not yet
        # imported one is stubbed anyway: PyPI's wheel fails against the CPU torch at import
        roots = roots[1:]
    finder = _StubFinder(roots)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if isinstance(sys.modules[m], _StubModule)]:
            del sys.modules[name]


_SGL: SimpleNamespace | None = None


def load_sglang() -> SimpleNamespace:
    """Import the parts of SGLang the driver uses (once), or raise :class:`SglangUnavailable`."""
    global _SGL
    if _SGL is not None:
        return _SGL
    # SGLang's import graph imports vLLM when it is installed (CI's environment has both), and vLLM
    # picks its platform once per process: it must see the CPU target first, as vllm_driver sets it
    _cpu_offline_env()
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    try:
        import importlib.metadata as md

        version = md.version("sglang")
    except Exception:
        raise SglangUnavailable(f"SGLang is not installed (no distribution 'sglang'); {INSTALL_HINT}") from None
    if version != SGLANG_VERSION:
        raise SglangUnavailable(
            f"SGLang {version} is installed but the cross-check is written against SGLang {SGLANG_VERSION}; "
            f"{INSTALL_HINT}"
        )
    try:
        with _stubs(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            from sglang.srt import runtime_context
            from sglang.srt.managers import scheduler as sched_mod
            from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
            from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
            from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
            from sglang.srt.managers.utils import validate_input_length
            from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
            from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
            from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
            from sglang.srt.mem_cache.unified_cache.components import ComponentType
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
            from sglang.srt.sampling.sampling_params import SamplingParams
            from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # ImportError, or a broken binary wheel failing at import time
        raise SglangUnavailable(f"SGLang {version} is installed incompletely ({_one_line(exc)}); {INSTALL_HINT}") from None
    for name in ("sglang", "torch", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    _SGL = SimpleNamespace(
        torch=torch,
        runtime_context=runtime_context,
        sched_mod=sched_mod,
        Scheduler=sched_mod.Scheduler,
        Req=Req,
        ScheduleBatch=ScheduleBatch,
        SchedulePolicy=SchedulePolicy,
        PrefillAdder=PrefillAdder,
        NewTokenRatioTracker=NewTokenRatioTracker,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        CacheInitParams=CacheInitParams,
        release_kv_cache=release_kv_cache,
        checkpoint_kv_cache=checkpoint_kv_cache,
        ReqToTokenPool=ReqToTokenPool,
        ComponentType=ComponentType,
        UnifiedRadixCache=UnifiedRadixCache,
        SamplingParams=SamplingParams,
        ServerArgs=ServerArgs,
        validate_input_length=validate_input_length,
    )
    return _SGL


class _PassThrough:
    """A subsystem the CPU replay has none of: hands back the batch it is given, else nothing."""

    num_retracted_reqs = 0
    enable_metrics = False

    def maybe_prepare_mlp_sync_batch(self, batch: Any, need_sync: bool = False) -> Any:
        return batch

    def maybe_convert_decode_to_extend(self, batch: Any) -> Any:
        return batch

    def prepare_for_forward(self, batch: Any, chunked_req: Any = None) -> Any:
        return batch

    def has_waiting_grammars(self) -> bool:
        return False

    def pending_member_rows(self, batch: Any) -> int:
        return 0

    def retire_group(self, req: Any) -> None:
        return None

    def _get_num_pending_tokens(self, chunk_deduct: int = 0) -> int:
        return 0


#: SGLang's environment knobs of the ratio and the clip (``srt/environ.py:646-650``), from the rule's fields
_ENV_KNOBS = {
    "SGLANG_INIT_NEW_TOKEN_RATIO": "init_new_token_ratio",
    "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR": "min_new_token_ratio_factor",
    "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "new_token_ratio_decay_steps",
    "SGLANG_RETRACT_DECODE_STEPS": "retract_decode_steps",
    "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "clip_max_new_tokens",
}


class SglangDriver:
    """One SGLang scheduler (a ``Scheduler.__new__`` object, see the module docstring) with a
    rule's knobs on the server ``params``."""

    def __init__(self, rule: Sglang, params: ModelParams, max_requests: int, *, ignore_eos: bool = False) -> None:
        check_server(params, radix=True)
        g = load_sglang()
        self.g = g
        self.rule = rule
        self.params = params
        self.ignore_eos = ignore_eos
        # SGLang's radix cache, on with the run's prefix caching (SGLang's server default is on)
        self.caching = bool(params.prefix_caching)
        policy = rule.schedule_policy if self.caching else "fcfs"
        self._answers: dict[int, list[int]] = {}
        for env, attr in _ENV_KNOBS.items():
            os.environ[env] = str(getattr(rule, attr))
        M, B = params.M, params.block
        # no cap (None): a request-row table no replay fills
        rows = params.max_num_seqs if params.max_num_seqs is not None else max(max_requests, 1) + 1
        context = rule.context_len if rule.context_len is not None else M + 8
        try:
            args = g.ServerArgs(
                model_path="dummy",  # "dummy" skips resolving a model (arg_groups/pipeline.py:104)
                device="cpu",
                disable_radix_cache=not self.caching,
                chunked_prefill_size=params.chunk,
                max_prefill_tokens=rule.max_prefill_tokens,
                page_size=B,
                max_running_requests=rows,
                schedule_conservativeness=float(rule.schedule_conservativeness),
                schedule_policy=policy,
                max_total_tokens=M,
                # no context_length: publishing one makes SGLang read the model's config.json;
                # the scheduler's max_req_len below carries it instead
            )
            g.runtime_context.publish(args, role="scheduler")
            # what Scheduler.__init__ does when pp_max_micro_batch_size is unset (scheduler.py:1237)
            g.runtime_context.get_context().override(
                "scheduler.pp_max_micro_batch_size_default", pp_max_micro_batch_size=max(rows, 1)
            )
        except Exception as exc:  # SGLang validates its arguments with assertions and ValueErrors
            raise InvalidArgument(f"SGLang rejects the server configuration: {_one_line(exc)}") from None
        pool = g.ReqToTokenPool(rows, context + B, "cpu", False)
        if B == 1:
            alloc = g.TokenToKVPoolAllocator(M, g.torch.int64, "cpu", None, False)
        else:
            alloc = g.PagedTokenToKVPoolAllocator(M, B, g.torch.int64, "cpu", None, False)
        cache = g.CacheInitParams(
            disable=not self.caching, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=B
        )
        cache.tree_components = (g.ComponentType.FULL,)
        # with the cache on, registry.py:146 builds the same UnifiedRadixCache with only the FULL component
        tree = g.UnifiedRadixCache(cache)
        self.s = self._scheduler(args, pool, alloc, tree, rows, context, policy)

    def _scheduler(self, args: Any, pool: Any, alloc: Any, tree: Any, rows: int, context: int, policy: str) -> Any:
        """The ``Scheduler`` object without its ``__init__``: the attributes its scheduling methods read."""
        g = self.g
        rule, p = self.rule, self.params
        s = g.Scheduler.__new__(g.Scheduler)
        nothing = _PassThrough()
        model_config = SimpleNamespace(
            vocab_size=32_000,
            is_encoder_decoder=False,
            hf_eos_token_id={_EOS},
            is_multimodal=False,
            context_len=context,
        )
        sched = g.runtime_context.get_schedule()
        values: dict[str, Any] = {
            "server_args": args,
            "model_config": model_config,
            "page_size": p.block,
            "max_total_num_tokens": p.M,
            "max_req_len": min(context - 1, p.M - 1),
            "max_running_requests": rows,
            "chunked_prefill_size": p.chunk,
            "max_prefill_tokens": rule.max_prefill_tokens,
            "req_to_token_pool": pool,
            "token_to_kv_pool_allocator": alloc,
            "tree_cache": tree,
            "policy": g.SchedulePolicy(policy, tree, False, False, False),
            "new_token_ratio_tracker": g.NewTokenRatioTracker.from_config(),
            "waiting_queue": [],
            "running_batch": g.ScheduleBatch(reqs=[], batch_is_full=False),
            "last_batch": None,
            "chunked_req": None,
            "dp_attn_adapter": nothing,
            "ngram_embedding_manager": nothing,
            "grammar_manager": nothing,
            "beam_coordinator": nothing,
            "metrics_reporter": nothing,
            "load_inquirer": nothing,
            # every optional feature off: what `--disable-radix-cache` and the defaults give
            "disaggregation_mode": g.sched_mod.DisaggregationMode.NULL,
            "spec_algorithm": g.sched_mod.SpeculativeAlgorithm.NONE,
            "max_new_tokens_limit": None,
            "sliding_window_size": None,
            "enable_priority_scheduling": False,
            "max_queued_requests": None,
            "scheduler_stage_metrics": None,
            "processed_tokens_counter": 0,
            "enable_hicache_storage": False,
            "enable_lmcache": False,
            "_pending_chunked_abort_req": None,
            "enable_hierarchical_cache": False,
            "enable_unified_cache_external_linker": False,
            "dllm_config": None,
            "enable_hisparse": False,
            "_prefill_decode_interval_remaining": 0,
            "prefill_decode_interval": 0,
            "prefill_decode_interval_min_bs": 0,
            "prefill_delayer": None,
            "enable_priority_preemption": False,
            "is_hybrid_swa": False,
            "min_free_slots_delayer": None,
            "is_mixed_chunk": False,
            "max_prefill_bs": 0,
            "truncation_align_size": None,
            "enable_overlap": False,
            "enable_skip_finishing_decode": False,
            "forward_ct": 0,
            "require_mlp_sync": False,
            "dynamic_chunk_sizer": None,
            "enable_lora": False,
            "decode_offload_manager": None,
            "hisparse_coordinator": None,
            # the schedule group of the published ServerArgs, as Scheduler.__init__ reads it (scheduler.py:486)
            "priority_scheduling_preemption_threshold": sched.priority_scheduling_preemption_threshold,
            "abort_on_priority_when_disabled": sched.abort_on_priority_when_disabled,
            "schedule_low_priority_values_first": sched.schedule_low_priority_values_first,
            "tp_worker": SimpleNamespace(
                model_runner=SimpleNamespace(attn_backend=SimpleNamespace(), prefill_aware_swa=False)
            ),
        }
        for k, v in values.items():
            setattr(s, k, v)
        # an abort (a request SGLang cannot serve at all) ends the replay with SGLang's reason
        s.send_abort_output = self._aborted
        # batch_is_full as each prefill pass starts (after the start-of-step filters clear it):
        # the value the step log reports for the step before (see replay_sglang)
        self.flag_at_prefill: list[bool] = []
        real = g.Scheduler.get_new_batch_prefill

        def get_new_batch_prefill(running_batch: Any) -> Any:
            self.flag_at_prefill.append(bool(running_batch.batch_is_full))
            return real(s, running_batch)

        s.get_new_batch_prefill = get_new_batch_prefill
        return s

    def _aborted(self, abort_req: Any, req: Any = None) -> None:
        reason = getattr(getattr(req, "to_finish", None), "message", None) or getattr(abort_req, "finished_reason", "")
        raise InvalidArgument(f"SGLang aborts request {getattr(req, 'rid', '?')}: {reason}")

    def add_request(self, rid: int, s: int, max_new: int, prompts: PromptSet | None = None) -> Any:
        """A request arrives: SGLang's arrival clip (``init_req_max_new_tokens``), then the queue.
        With the radix cache on its token ids are its content (``prompts``, else its own), and so are
        the tokens it samples (:func:`~kvstab.lifecycles.sglang_radix.answer_tokens`)."""
        g = self.g
        sp = g.SamplingParams(max_new_tokens=max_new, ignore_eos=self.ignore_eos)
        sp.normalize(None)
        sp.verify(32_000)
        if self.caching:
            ids = array("q", request_tokens(prompts, rid, s))
            self._answers[rid] = answer_tokens(prompts, rid, max_new)
        else:
            ids = array("q", [1 + (rid + j) % 1000 for j in range(s)])  # any ids: no radix cache to match
        req = g.Req(str(rid), "", ids, sp, eos_token_ids={_EOS}, vocab_size=32_000)
        # the tokenizer-side length check (tp_worker.py:572: max_req_len - 5), then the arrival clip
        error = self.g.validate_input_length(req, self.s.max_req_len - 5, False)
        if error is not None:
            raise InvalidArgument(f"request {rid} (s={s}): SGLang refuses it: {error}")
        self.s.init_req_max_new_tokens(req)
        if req.to_finish is not None or req.sampling_params.max_new_tokens < 1:
            raise InvalidArgument(
                f"request {rid} (s={s}, max_new={max_new}): SGLang clips max_new_tokens to "
                f"{req.sampling_params.max_new_tokens} at M={self.params.M}; use a shorter prompt"
            )
        self.s._add_request_to_queue(req)
        return req

    def step(self) -> Any:
        """One iteration of ``event_loop_normal`` (``scheduler.py:2026``) with simulated outputs."""
        s = self.s
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch:
            self._result(batch)
        elif not s.running_batch.reqs and not s.waiting_queue and s.chunked_req is None:
            s.new_token_ratio_tracker.reset()  # on_idle, scheduler.py:5316
        s.last_batch = batch
        return batch

    def _result(self, batch: Any) -> None:
        """What ``process_batch_result_prefill/decode`` do to a plain generation request, the token simulated."""
        g = self.g
        s = self.s
        extend = batch.forward_mode.is_extend()
        for req in batch.reqs:
            if extend and req is s.chunked_req:
                continue  # a middle chunk samples nothing
            token = self._answers[int(req.rid)][len(req.output_ids)] if self.caching else _TOKEN
            req.output_ids.append(token)
            req.update_finish_state(1)
            if req.finished():
                g.release_kv_cache(req, s.tree_cache, checkpoint=True)
            elif extend and self.caching:
                # a completed prefill publishes its KV (batch_result_processor.py:394); without the
                # cache this only moves prefix_len, which the next round resets
                g.checkpoint_kv_cache(req, s.tree_cache)


#: SGLang's scheduling methods a replay counts the calls of: which admission path ran
#: (``add_one_req_ignore_eos`` is the ``ignore_eos`` path; ``_select_prefill_admission`` the
#: ratio path's test), the in-flight chunk, and retraction.
TRACED = (
    "PrefillAdder.add_one_req",
    "PrefillAdder.add_one_req_ignore_eos",
    "PrefillAdder._select_prefill_admission",
    "PrefillAdder.add_chunked_req",
    "ScheduleBatch.retract_decode",
)


@contextmanager
def _traced(g: SimpleNamespace) -> Iterator[dict[str, int]]:
    """Count the calls of the :data:`TRACED` methods for one replay: each is wrapped on its
    class (the real method still runs) and put back afterwards."""
    counts = dict.fromkeys(TRACED, 0)
    saved: list[tuple[type, str, Any]] = []
    try:
        for name in TRACED:
            cls_name, meth = name.split(".")
            cls = getattr(g, cls_name)
            real = cls.__dict__[meth]

            def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                counts[_name] += 1
                return _real(*args, **kwargs)

            saved.append((cls, meth, real))
            setattr(cls, meth, counted)
        yield counts
    finally:
        for cls, meth, real in saved:
            setattr(cls, meth, real)


@dataclass(frozen=True, slots=True, eq=False)
class SglangRun:
    """One replay on SGLang's own scheduler and the SGLang code it ran."""

    log: SglangModelLog
    ignore_eos: bool  # the requests' SamplingParams.ignore_eos
    calls: dict[str, int]  # calls of each TRACED method during the replay

    @property
    def admission_path(self) -> str:
        """``"ignore_eos"`` or ``"ratio"``: the admission test that ran (``"none"`` if no request was tried)."""
        eos = self.calls["PrefillAdder.add_one_req_ignore_eos"]
        ratio = self.calls["PrefillAdder._select_prefill_admission"]
        if eos and ratio:
            return "mixed"
        return "ignore_eos" if eos else "ratio" if ratio else "none"


def replay_sglang(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int | None = None,
    *,
    max_steps: int = MAX_SLOTS,
    ignore_eos: bool | None = None,
) -> SglangModelLog:
    """Replay ``plan`` (``o`` = SGLang's ``max_new_tokens``) on SGLang 0.5.23's own scheduler
    with ``rule``'s knobs on the server ``params``: ``steps`` steps, or (``None``) until every request has arrived and
    finished, at most ``max_steps``.  The log has the fields of
    :func:`~kvstab.empirical.sglang_replay.replay_sglang_model`'s, so that
    :meth:`~kvstab.steplog.SglangModelLog.first_difference` compares them.
    ``ignore_eos`` as for :func:`run_sglang`."""
    return run_sglang(plan, rule, params, steps, max_steps=max_steps, ignore_eos=ignore_eos).log


def run_sglang(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int | None = None,
    *,
    max_steps: int = MAX_SLOTS,
    ignore_eos: bool | None = None,
) -> SglangRun:
    """:func:`replay_sglang`, with the SGLang code that ran (:class:`SglangRun`).

    ``ignore_eos``: every request's ``SamplingParams.ignore_eos``.  ``False``
    (``max_new_tokens`` is the stop; SGLang's ratio path) or ``True`` (SGLang
    admits through ``PrefillAdder.add_one_req_ignore_eos`` and reserves running
    requests at ratio 1.0; the log's source is then ``"sglang (ignore_eos)"``);
    ``None`` takes the rule's ``ignore_eos`` knob when it has one, else ``False``.
    """
    eos = bool(getattr(rule, "ignore_eos", False)) if ignore_eos is None else bool(ignore_eos)
    g = load_sglang()
    with _traced(g) as calls:
        log = _replay(plan, rule, params, steps, max_steps, eos)
    return SglangRun(log=log, ignore_eos=eos, calls=dict(calls))


def _replay(
    plan: ArrivalPlan, rule: Sglang, params: ModelParams, steps: int | None, max_steps: int, ignore_eos: bool
) -> SglangModelLog:
    n = len(plan)
    drv = SglangDriver(rule, params, n, ignore_eos=ignore_eos)
    s = drv.s
    alloc = s.token_to_kv_pool_allocator
    start = time.perf_counter()
    reqs: list[Any] = []
    arrival: list[int] = []
    first_admit: list[int] = []
    finish: list[int] = []
    recomputed: list[int] = []
    log: list[SglangStep] = []
    flags: list[int] = []
    i = t = 0

    def in_system() -> bool:
        return bool(s.waiting_queue or s.running_batch.reqs or s.chunked_req is not None
                    or (s.last_batch is not None and s.last_batch.forward_mode.is_extend() and s.last_batch.reqs))

    while (t < steps) if steps is not None else (i < n or any(f < 0 for f in finish)):
        if t >= max_steps:
            raise InvalidArgument(f"SGLang's scheduler did not drain within {max_steps} steps")
        while i < n and int(plan.slot[i]) <= t:
            reqs.append(drv.add_request(i, int(plan.s[i]), int(plan.o[i]), plan.prompts))
            arrival.append(t)
            first_admit.append(-1)
            finish.append(-1)
            recomputed.append(0)
            i += 1
        # the in-flight chunk before the step: every other request of an extend batch was admitted
        # from the queue (not a scan of the queue, which grows without bound above μ)
        chunk_before = s.chunked_req
        # KV each request holds before the step: its prompt and outputs but the last sampled one
        held_before = {int(r.rid): len(r.origin_input_ids) + len(r.output_ids) - 1 for r in s.running_batch.reqs}
        n_flags = len(drv.flag_at_prefill)
        batch = drv.step()
        if len(drv.flag_at_prefill) > n_flags and log:
            flags[-1] = int(drv.flag_at_prefill[-1])
        kind = "idle"
        admitted: list[int] = []
        work: list[tuple[int, int]] = []
        done: list[int] = []
        prefill = decode = 0
        if batch:
            extend = batch.forward_mode.is_extend()
            kind = "prefill" if extend else "decode"
            for j, r in enumerate(batch.reqs):
                k = int(r.rid)
                n_tok = int(batch.extend_lens[j]) if extend else 1
                work.append((k, n_tok))
                if extend:
                    prefill += n_tok
                    if r is not chunk_before:
                        admitted.append(k)
                        if first_admit[k] < 0:
                            first_admit[k] = t
                else:
                    decode += n_tok
                if r.finished():
                    done.append(k)
                    finish[k] = t
        # retracted requests were running and rejoin the queue at its tail (_add_request_to_queue)
        q = s.waiting_queue
        k = len(q)
        while k > 0 and int(q[k - 1].rid) in held_before:
            k -= 1
        retracted = [int(r.rid) for r in q[k:]]
        for k in retracted:
            recomputed[k] += held_before[k]
        flags.append(int(s.running_batch.batch_is_full))
        # batch_is_full is filled in below from the next step's view of the flag
        after = (params.M - int(alloc.available_size()), s.new_token_ratio_tracker.current, 0, len(s.waiting_queue))
        log.append(SglangStep.collected(t, kind, (admitted, retracted, done, work), (prefill, decode), after))
        t += 1
    # the flag after the last step, as one more pass would see it
    if log:
        n_flags = len(drv.flag_at_prefill)
        if in_system() or s.last_batch is not None:
            drv.step()
        if len(drv.flag_at_prefill) > n_flags:
            flags[-1] = int(drv.flag_at_prefill[-1])
    steps_out = tuple(replace(st, batch_is_full=f) for st, f in zip(log, flags))
    return SglangModelLog(
        rule=rule,
        params=params,
        steps=steps_out,
        s=tuple(int(x) for x in plan.s[:i]),
        max_new=tuple(int(r.sampling_params.max_new_tokens) for r in reqs),
        arrival=tuple(arrival),
        first_admit=tuple(first_admit),
        finish=tuple(finish),
        retractions=tuple(int(r.retraction_count) for r in reqs),
        recomputed=tuple(recomputed),
        source="sglang (ignore_eos)" if ignore_eos else "sglang",
        wall_s=time.perf_counter() - start,
    )


@dataclass(frozen=True, slots=True, eq=False)
class IgnoreEosCheck:
    """kvstab's ``sglang`` model against SGLang's own ``ignore_eos`` path on one plan."""

    real: SglangRun  # SGLang with every request ignore_eos=True (PrefillAdder.add_one_req_ignore_eos)
    model: SglangModelLog  # replay_sglang_model with the same rule
    difference: str | None  # SglangModelLog.first_difference (None: step-identical)
    first_step: int | None  # the first step where a step field differs (None: none does)


def first_differing_step(a: SglangModelLog, b: SglangModelLog) -> int | None:
    """The first step at which a step field of ``a`` and ``b`` differs, or the shorter
    log's length when one ran longer; ``None`` when every step agrees."""
    for x, y in zip(a.steps, b.steps):
        if any(getattr(x, f) != getattr(y, f) for f in STEP_FIELDS):
            return x.step
    return None if len(a.steps) == len(b.steps) else min(len(a.steps), len(b.steps))


def check_ignore_eos(
    plan: ArrivalPlan,
    rule: Sglang,
    params: ModelParams,
    steps: int | None = None,
    *,
    max_steps: int = MAX_SLOTS,
    model: SglangModelLog | None = None,
) -> IgnoreEosCheck:
    """Replay ``plan`` on SGLang's ``ignore_eos`` path and on :func:`replay_sglang_model` with
    ``rule`` on ``params``, and name where they first differ: the cross-check of an ``ignore_eos`` regime in
    kvstab's model.  Today's ``sglang`` rule models the ratio path only, so the two depart
    (``docs/empirical.md``, "SGLang's ignore_eos regime"); a rule with an ``ignore_eos`` knob
    set passes here when it models the path exactly.  ``model``: the model's replay of this
    plan and rule when already run (it is not run again)."""
    real = run_sglang(plan, rule, params, steps, max_steps=max_steps, ignore_eos=True)
    if model is None:
        model = replay_sglang_model(plan, rule, params, steps, max_steps=max_steps)
    return IgnoreEosCheck(
        real=real,
        model=model,
        difference=model.first_difference(real.log),
        first_step=first_differing_step(model, real.log),
    )
