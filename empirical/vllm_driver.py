"""Drive vLLM 0.33.0's own v1 scheduler on a CPU, with simulated model outputs.

No GPU, no weights, no network: the model is a hand-written Llama-3-8B-shaped
``config.json`` in a temporary folder (``skip_tokenizer_init``), the KV pool is
a :class:`KVCacheConfig` of one full-attention group, and after each
``schedule()`` the "model" returns one sampled token for every request whose
prefill is complete.  vLLM is imported here and nowhere else in kvstab, and
only when a replay asks for it; a missing vLLM, or another version, is one
line naming the install command.

Configuration the cross-check fixes, and why:

* ``enable_prefix_caching=False`` — with random prompts it would hit nothing,
  except that a preempted request could re-find its own freed blocks, which
  kvstab does not model (``docs/empirical.md``);
* the synchronous ``Scheduler`` (``async_scheduling`` off): one decision per
  step, as in the model;
* ``long_prefill_token_threshold=0`` and chunked prefill on: a prefill chunk
  is capped by the step's token budget only (kvstab's ``ŝ`` = the budget);
* FCFS policy, no watermark, ``scheduler_reserve_full_isl`` left at its
  default (on): these are vLLM 0.33.0's defaults.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.empirical.composition import composition
from kvstab.errors import InvalidArgument, KvstabError
from kvstab.prefix import Prompt, PromptSet, content_id, token_ids
from kvstab.steplog import StepLog, StepRecorder

__all__ = ["VllmUnavailable", "VllmRejected", "VllmDriver", "load_vllm", "VLLM_VERSION", "INSTALL_HINT", "LLAMA3_8B"]

#: The vLLM release the cross-check is written against.
VLLM_VERSION = "0.33.0"
#: How to get it (kept in one place: every "missing vLLM" message quotes it).
INSTALL_HINT = "run scripts/install-vllm.sh (vLLM 0.33.0 for CPU, about 2 minutes)"

#: A Llama-3-8B-shaped model config (the paper's model); vLLM reads only its shape.
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    # Llama-3.1's context, so that long trace requests are accepted
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
}

#: token ids are drawn from the model's vocabulary (kvstab.prefix.token_ids)
VOCAB = int(LLAMA3_8B["vocab_size"])  # type: ignore[call-overload]


class VllmUnavailable(KvstabError):
    """vLLM is not installed, or not the version the cross-check is written against."""


class VllmRejected(InvalidArgument):
    """vLLM refused the configuration; the message is vLLM's reason, in one line."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."


def _cpu_offline_env() -> None:
    """vLLM must infer the CPU platform and must never reach the hub (SGLang's import graph
    imports vLLM too: :mod:`kvstab.empirical.sglang_driver` sets the same)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


_VLLM: SimpleNamespace | None = None


def load_vllm() -> SimpleNamespace:
    """Import the parts of vLLM the driver uses (once), or raise :class:`VllmUnavailable`."""
    global _VLLM
    if _VLLM is not None:
        return _VLLM
    _cpu_offline_env()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    try:
        import vllm
    except ImportError as exc:
        raise VllmUnavailable(f"vLLM is not installed (no module {exc.name or 'vllm'!r}); {INSTALL_HINT}") from None
    version = getattr(vllm, "__version__", "?")
    if version != VLLM_VERSION:
        raise VllmUnavailable(
            f"vLLM {version} is installed but the cross-check is written against vLLM {VLLM_VERSION}; {INSTALL_HINT}"
        )
    try:
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager
    except ImportError as exc:
        raise VllmUnavailable(f"vLLM {version} is installed incompletely ({_one_line(exc)}); {INSTALL_HINT}") from None
    for name in ("vllm", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    init_none_hash(sha256)
    _VLLM = SimpleNamespace(
        torch=torch,
        CacheConfig=CacheConfig,
        ModelConfig=ModelConfig,
        SchedulerConfig=SchedulerConfig,
        VllmConfig=VllmConfig,
        SamplingParams=SamplingParams,
        sha256=sha256,
        get_request_block_hasher=get_request_block_hasher,
        Scheduler=Scheduler,
        FullAttentionSpec=FullAttentionSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        ModelRunnerOutput=ModelRunnerOutput,
        Request=Request,
        StructuredOutputManager=StructuredOutputManager,
    )
    return _VLLM


_MODEL_DIR: tempfile.TemporaryDirectory[str] | None = None
_MODEL_CONFIGS: dict[int, Any] = {}


def _model_config(v: SimpleNamespace, max_model_len: int) -> Any:
    """A ``ModelConfig`` for the Llama-3-8B shape; the first one costs vLLM a
    model-class inspection in a subprocess (~10 s), later ones are cached here."""
    global _MODEL_DIR
    if max_model_len in _MODEL_CONFIGS:
        return _MODEL_CONFIGS[max_model_len]
    if _MODEL_DIR is None:
        _MODEL_DIR = tempfile.TemporaryDirectory(prefix="kvstab-vllm-model-")
        with open(os.path.join(_MODEL_DIR.name, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(LLAMA3_8B, fh)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            mc = v.ModelConfig(
                model=_MODEL_DIR.name,
                tokenizer=_MODEL_DIR.name,
                skip_tokenizer_init=True,
                max_model_len=max_model_len,
                dtype="bfloat16",
            )
    except Exception as exc:  # vLLM raises ValueError / pydantic errors with its reason
        raise VllmRejected(f"vLLM rejects the model configuration: {_one_line(exc)}") from None
    _MODEL_CONFIGS[max_model_len] = mc
    return mc


class VllmDriver:
    """One vLLM v1 ``Scheduler`` for a :class:`~kvstab.steplog.ReplayConfig`."""

    def __init__(self, config: Any, max_model_len: int) -> None:
        v = load_vllm()
        self.v = v
        self.config = config
        B = config.block_size
        mc = _model_config(v, max_model_len)
        try:
            sc = v.SchedulerConfig(
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_num_seqs=config.max_num_seqs,
                max_model_len=max_model_len,
                enable_chunked_prefill=True,
                long_prefill_token_threshold=0,
                is_encoder_decoder=False,
                async_scheduling=False,
            )
            cc = v.CacheConfig(block_size=B, enable_prefix_caching=config.enable_prefix_caching)
            vc = v.VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc)
        except Exception as exc:
            raise VllmRejected(f"vLLM rejects the configuration: {_one_line(exc)}") from None
        vc.cache_config.num_gpu_blocks = config.num_blocks
        spec = v.FullAttentionSpec(block_size=B, num_kv_heads=8, head_size=128, dtype=v.torch.bfloat16)
        kv = v.KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[v.KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
        )
        try:
            self.sched = v.Scheduler(
                vllm_config=vc,
                kv_cache_config=kv,
                structured_output_manager=v.StructuredOutputManager(vc),
                block_size=B,
            )
        except Exception as exc:
            raise VllmRejected(f"vLLM rejects the scheduler configuration: {_one_line(exc)}") from None
        self.hasher = v.get_request_block_hasher(B, v.sha256)
        self.usable = self.sched.kv_cache_manager.block_pool.get_num_free_blocks()
        if self.usable != config.num_blocks - 1:
            raise VllmRejected(
                f"vLLM's pool has {self.usable} free blocks for num_blocks={config.num_blocks}; "
                "expected num_blocks - 1 (one reserved null block)"
            )
        self._blocks = self.sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
        self._answers: dict[int, npt.NDArray[np.int64]] = {}  # each request's answer token ids, once it samples

    def request(self, rid: int, s: int, o: int, prompts: PromptSet | None = None) -> Any:
        """vLLM's ``Request`` for request ``rid`` (prompt ``s``, ``max_tokens = o``): its token ids
        are its prompt's content from ``prompts`` when given, else ids of its own."""
        v = self.v
        if prompts is None and not self.config.enable_prefix_caching:
            ids = [1 + (rid + j) % 1000 for j in range(s)]  # token ids only matter for hashing
        elif prompts is None:
            # a plan without prompts shares no prefix: each request's tokens are its own content
            ids = token_ids(Prompt(((content_id("own", rid), s),)), VOCAB).tolist()
        else:
            ids = prompts.token_ids(rid, VOCAB).tolist()
        return v.Request(
            str(rid),
            ids,
            v.SamplingParams(max_tokens=o, ignore_eos=True),
            None,
            arrival_time=0.0,
            block_hasher=self.hasher,
        )

    def _sampled(self, prompts: PromptSet | None, r: Any) -> list[int]:
        """The token ``r`` samples now.  With caching on, its answer's own content: the plan's
        output id when it names one (a later turn of a conversation holds that answer in its
        prompt, and must hit its blocks), else an id of the request's own — the content
        kvstab's model gives it (``kvstab.simulator.Engine.arrive``), so a resumed request's
        output blocks hash alike on both sides.  With caching off ids do not matter: 7."""
        if not self.config.enable_prefix_caching:
            return [7]
        k = int(r.request_id)
        ids = self._answers.get(k)
        if ids is None:
            out = content_id("output", k) if prompts is None or prompts.output is None else int(prompts.output[k])
            ids = self._answers[k] = token_ids(Prompt(((out, int(r.max_tokens)),)), VOCAB)
        return [int(ids[r.num_output_tokens])]

    def replay(
        self, plan: ArrivalPlan, steps: int, rec: StepRecorder, *, on_step: Callable[[int], None] | None = None
    ) -> StepLog:
        """Run ``steps`` scheduler steps over ``plan``, filling the recorder ``rec``."""
        v = self.v
        sched = self.sched
        B = self.config.block_size
        blocks = self._blocks
        prompt_end: dict[str, int] = {}  # where each request's (re)prefill ends, kvstab's s
        attempt: dict[str, int] = {}  # area of the current attempt
        i, n = 0, len(plan)
        start = time.perf_counter()
        for t in range(steps):
            arrived = 0
            while i < n and plan.slot[i] == t:
                sched.add_request(self.request(i, int(plan.s[i]), int(plan.o[i]), plan.prompts))
                prompt_end[str(i)] = int(plan.s[i])
                rec.arrival[i] = t
                i += 1
                arrived += 1
            rec.at_step_start(t, attempt)
            before = {r.request_id: r.num_computed_tokens for r in sched.running}
            out = sched.schedule()
            preempted = out.preempted_req_ids or set()
            scheduled = out.num_scheduled_tokens
            # KV after this step's allocation: what the model charges for the slot
            used_blocks = self.usable - sched.kv_cache_manager.block_pool.get_num_free_blocks()
            recomputed = wasted = 0
            for rid in preempted:
                k = int(rid)
                rec.preemptions[k] += 1
                lost = attempt.pop(rid, 0)
                rec.wasted[k] += lost
                wasted += lost
                thrown = before.get(rid, 0)
                rec.recomputed[k] += thrown
                recomputed += thrown
                # the resumed request recomputes all its tokens as a prompt
                prompt_end[rid] = sched.requests[rid].num_tokens
            admitted = 0
            running = len(sched.running)
            for r in sched.running:
                rid = r.request_id
                attempt[rid] = attempt.get(rid, 0) + len(blocks.get(rid, ())) * B
                if rid not in before:
                    admitted += 1
                    k = int(rid)
                    if rec.first_admit[k] < 0:
                        rec.first_admit[k] = t
            sampled: list[list[int]] = []
            work: list[tuple[int, int, bool]] = []
            ids = list(scheduled)
            for rid in ids:
                new = scheduled[rid]
                r = sched.requests[rid]
                c0 = r.num_computed_tokens - new  # schedule() has already advanced it
                work.append((c0, new, c0 < prompt_end[rid]))
                sampled.append(self._sampled(plan.prompts, r) if r.num_computed_tokens >= r.num_tokens else [])
            mro = v.ModelRunnerOutput(
                req_ids=ids, req_id_to_index={rid: j for j, rid in enumerate(ids)}, sampled_token_ids=sampled
            )
            sched.update_from_output(out, mro)
            completed = 0
            for rid in ids:
                if rid not in sched.requests:  # finished and freed by update_from_output
                    k = int(rid)
                    rec.finish[k] = t
                    rec.area[k] = attempt.pop(rid)
                    rec.final_s[k] = prompt_end.pop(rid)
                    completed += 1
            rec.step(
                arrived=arrived,
                admitted=admitted,
                preempted=len(preempted),
                completed=completed,
                running=running,
                memory=used_blocks * B,
                wasted=wasted,
                tokens=out.total_num_scheduled_tokens,
                recomputed=recomputed,
                queue=len(sched.waiting) + len(sched.kv_holding_waiting),
                **composition(work),
            )
            if on_step is not None:
                on_step(t)
        rec.at_end(attempt)
        return rec.log("vllm", self.config, time.perf_counter() - start)
