"""kvstab's vLLM memory accounting (:mod:`kvstab.kv_capacity`) against vLLM 0.33.0's own functions, on the CPU.

The shipped Llama-3-8B ``config.json`` goes through vLLM's ``ModelConfig`` (its layers, KV heads,
head size and dtype), the per-layer ``FullAttentionSpec`` gives the page size, and vLLM's
``request_memory``, ``get_kv_cache_configs`` and ``get_kv_cache_capacity`` turn the bytes kvstab
says are available into ``num_gpu_blocks`` and the logged token capacity: they must be kvstab's.
The profiler's reserve (activations, CUDA graphs) needs a GPU and is not checked here.

Needs the vLLM extra (``scripts/install-vllm.sh``); skips without it unless ``KVSTAB_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import contextlib
import io
import os
from types import SimpleNamespace
from typing import Any

import pytest

from kvstab.data import model_config_path
from kvstab.empirical.vllm_driver import VllmUnavailable, load_vllm
from kvstab.kv_capacity import gpu_spec, load_model_shape, vllm_capacity, vllm_reserve


@pytest.fixture(scope="module")
def vllm_model() -> SimpleNamespace:
    """vLLM's ``ModelConfig`` of the shipped config, or a skip (a failure under ``KVSTAB_REQUIRE_VLLM=1``)."""
    try:
        v = load_vllm()
    except VllmUnavailable as exc:
        if os.environ.get("KVSTAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"KVSTAB_REQUIRE_VLLM=1 but {exc}", pytrace=False)
        pytest.skip(f"{exc} (KVSTAB_REQUIRE_VLLM=1 turns this skip into a failure)")
    folder = str(model_config_path("llama-3-8b").parent)
    with contextlib.redirect_stdout(io.StringIO()):
        mc = v.ModelConfig(model=folder, tokenizer=folder, skip_tokenizer_init=True, max_model_len=8192)
    return SimpleNamespace(v=v, mc=mc)


def _config(vm: SimpleNamespace, util: float, block: int) -> Any:
    cc = vm.v.CacheConfig(block_size=block, gpu_memory_utilization=util)
    cc.kv_cache_layout = "LBNHC"  # the engine core resolves it before profiling (vLLM's first preference)
    return vm.v.VllmConfig(model_config=vm.mc, cache_config=cc)


def test_kv_bytes_per_token_is_vllms(vllm_model: SimpleNamespace) -> None:
    mc, v = vllm_model.mc, vllm_model.v
    vc = _config(vllm_model, 0.92, 16)
    layers = mc.get_num_layers(vc.parallel_config)
    spec = v.FullAttentionSpec(block_size=16, num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
                               head_size=mc.get_head_size(), dtype=mc.dtype)
    shape = load_model_shape("llama-3-8b")
    assert layers * spec.page_size_bytes // 16 == shape.kv_bytes_per_token == 131_072


@pytest.mark.parametrize(("gpu", "util", "block"), [("A100-80GB", 0.92, 16), ("A100-40GB", 0.9, 16),
                                                     ("H200", 0.85, 32), ("L40S", 0.95, 16)])
def test_num_blocks_is_vllms(vllm_model: SimpleNamespace, gpu: str, util: float, block: int) -> None:
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity
    from vllm.v1.worker.utils import request_memory

    mc, v = vllm_model.mc, vllm_model.v
    vc = _config(vllm_model, util, block)
    shape = load_model_shape("llama-3-8b")
    g = gpu_spec(gpu)
    ours = vllm_capacity(shape, g, util, block_size=block, reserve_bytes=vllm_reserve(shape, 2048, 256))
    snapshot = SimpleNamespace(total_memory=g.total_bytes, free_memory=g.total_bytes, device_="cuda:0")
    assert request_memory(snapshot, vc.cache_config) == ours.requested
    n = mc.get_num_layers(vc.parallel_config)
    spec = v.FullAttentionSpec(block_size=block, num_kv_heads=mc.get_num_kv_heads(vc.parallel_config),
                               head_size=mc.get_head_size(), dtype=mc.dtype)
    specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(n)}
    groups = get_global_kv_cache_groups(vc, [specs])
    (config,) = get_kv_cache_configs(vc, [specs], [ours.available], groups)
    assert config.num_blocks == ours.num_blocks
    tokens, _concurrency = get_kv_cache_capacity(vc, config)  # the "GPU KV cache size: N tokens" log line
    assert tokens == ours.num_blocks * block == ours.M + block
