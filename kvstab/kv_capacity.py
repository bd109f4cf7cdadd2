"""From a model's shape and a GPU to the KV capacity ``M``: vLLM's and SGLang's memory accounting.

One place turns hardware into the model's ``M`` (``kvstab tune`` and ``kvstab
plan`` both call it; ``docs/tune.md`` has the numbers).

**KV bytes per token** of a standard attention model (a Hugging Face
``config.json``): ``2 (K and V) · layers · KV heads · head dim · dtype bytes``;
for Llama-3-8B ``2·32·8·128·2 = 131 072``.  This is what vLLM 0.33's
``FullAttentionSpec.page_size_bytes`` gives per layer for one block, divided
by the block size and summed over the layers (``vllm/v1/kv_cache_interface.py``).

**vLLM 0.33** (``v1/worker/gpu_worker.py:641`` ``determine_available_memory``,
``v1/worker/utils.py:716`` ``request_memory``, ``v1/core/kv_cache_planning.py:642``
``get_kv_cache_config_from_groups``)::

    requested = ⌈total · gpu_memory_utilization⌉
    available = requested − (weights + non-torch + activation peak) − CUDA-graph estimate
    num_blocks = ⌊available / (B · kv_bytes_per_token)⌋,      M = (num_blocks − 1) · B

(one block is vLLM's reserved null block; ``kv_cache_planning.py:1525``).  The
profiler measures the non-KV terms on the GPU; without one, kvstab estimates
them (:func:`vllm_reserve`) or takes the user's own number: vLLM's log line
``Available KV cache memory: X GiB`` (``--available-kv-gib``) or its
``--kv-cache-memory-bytes`` flag, which skips the profile.

**SGLang 0.5.23** (``srt/mem_cache/kv_cache_configurator.py:2990``
``_profile_available_bytes``, ``srt/model_executor/pool_configurator.py:637``)::

    available = free after loading the weights − free before loading · (1 − mem_fraction_static)
    M = ⌊available / kv_bytes_per_token⌋ rounded down to the page size

so activations and CUDA graphs live in the ``1 − mem_fraction_static`` slack,
and ``free before loading ≈ total − CUDA context``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstab.errors import InvalidArgument
from kvstab.validation import MAX_TOKENS, positive_float, positive_int, unit_fraction

__all__ = [
    "GIB", "ModelShape", "load_model_shape", "GpuSpec", "GPUS", "gpu_spec", "VllmCapacity", "vllm_capacity",
    "vllm_reserve", "SglangCapacity", "sglang_capacity", "CUDA_CONTEXT_GIB",
]  # fmt: skip

GIB = 2**30

#: bytes of one element of each dtype a ``config.json`` may name
_DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "half": 2, "fp16": 2, "bf16": 2, "float32": 4, "float": 4, "fp32": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the memory accounting needs of a model: KV bytes per token and the weights' size."""

    kv_bytes_per_token: int = field(metadata={"help": "2 · layers · KV heads · head dim · dtype bytes"})
    weights_bytes: int | None = field(default=None, metadata={"help": "bytes of the weights; None: unknown"})
    name: str = field(default="", metadata={"help": "where the shape came from"})
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype_bytes: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    vocab: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kv_bytes_per_token",
                           positive_int("kv_bytes_per_token", self.kv_bytes_per_token, maximum=2**40))  # fmt: skip

    @property
    def is_llama3_8b(self) -> bool:
        """Whether this is Llama-3-8B's shape (the shipped A100 profile's model)."""
        return (self.kv_bytes_per_token == 131_072 and self.layers in (None, 32)
                and self.weights_bytes is not None and abs(self.weights_bytes / 16.06e9 - 1) < 0.05)  # fmt: skip

    def describe(self) -> str:
        """One line: the shape and its KV bytes per token."""
        if self.layers is None:
            return f"{self.kv_bytes_per_token} KV bytes per token (given)"
        return (f"{self.name}: {self.layers} layers × {self.kv_heads} KV heads × head dim {self.head_dim} × "
                f"{self.dtype_bytes} B × 2 (K, V) = {self.kv_bytes_per_token} KV bytes per token")  # fmt: skip


def _field(cfg: dict[str, Any], where: str, *names: str) -> int:
    for n in names:
        if n in cfg and cfg[n] is not None:
            return positive_int(f"{where}: {n}", cfg[n], maximum=10**9)
    raise InvalidArgument(f"{where} lacks {' (or '.join(names)}{')' * (len(names) - 1)}: cannot size the KV cache; "
                          "give --kv-bytes-per-token instead")  # fmt: skip


def load_model_shape(path: str | Path) -> ModelShape:
    """The shape of the model whose Hugging Face ``config.json`` is at ``path`` (a file, a folder holding
    one, or a shipped model's name: ``llama-3-8b``).

    Reads ``num_hidden_layers``, ``num_key_value_heads`` (else ``num_attention_heads``: no GQA),
    ``head_dim`` (else ``hidden_size / num_attention_heads``) and ``torch_dtype`` (or ``dtype``); the
    weights' size when ``hidden_size``, ``intermediate_size`` and ``vocab_size`` are there (a dense
    Llama-style block: QKV, O, gate/up/down, two norms; embeddings tied or not).  A nested
    ``text_config`` (multimodal configs) is read instead of the top level when present."""
    from kvstab.data import model_config_path

    p = model_config_path(str(path))
    where = f"config {str(p)!r}"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read {where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{where} is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise InvalidArgument(f"{where} is not a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    layers = _field(cfg, where, "num_hidden_layers")
    heads = _field(cfg, where, "num_attention_heads")
    kv_heads = _field(cfg, where, "num_key_value_heads", "num_attention_heads")
    if cfg.get("head_dim"):
        head_dim = _field(cfg, where, "head_dim")
    else:
        hidden = _field(cfg, where, "head_dim", "hidden_size")
        if hidden % heads:
            raise InvalidArgument(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if dtype is None:
        raise InvalidArgument(f"{where} lacks torch_dtype (or dtype): cannot size the KV cache; "
                              "give --kv-bytes-per-token instead")  # fmt: skip
    if str(dtype) not in _DTYPE_BYTES:
        raise InvalidArgument(f"{where}: torch_dtype {dtype!r} is not one of {', '.join(sorted(_DTYPE_BYTES))}")
    size = _DTYPE_BYTES[str(dtype)]
    weights = None
    hid, inter, vocab = cfg.get("hidden_size"), cfg.get("intermediate_size"), cfg.get("vocab_size")
    if all(isinstance(x, int) and x > 0 for x in (hid, inter, vocab)):
        assert isinstance(hid, int) and isinstance(inter, int) and isinstance(vocab, int)
        attn = hid * heads * head_dim + 2 * hid * kv_heads * head_dim + heads * head_dim * hid
        block = attn + 3 * hid * inter + 2 * hid
        embeddings = vocab * hid * (1 if cfg.get("tie_word_embeddings") else 2)
        weights = (embeddings + layers * block + hid) * size
    return ModelShape(
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * size, weights_bytes=weights,
        name=p.parent.name or str(p), layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=size,
        hidden=hid if isinstance(hid, int) else None, intermediate=inter if isinstance(inter, int) else None,
        vocab=vocab if isinstance(vocab, int) else None,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU of the menu: its total memory as the CUDA driver reports it (``torch.cuda.mem_get_info()[1]``)."""

    name: str
    total_gib: float = field(metadata={"help": "total device memory, GiB (what vLLM logs as total_gpu_memory)"})
    profile: str | None = field(default=None, metadata={"help": "the shipped batch-time profile that applies, if any"})
    vllm_large_defaults: bool = field(
        default=False,
        metadata={"help": "vLLM's larger batch defaults apply (≥ 70 GiB and not an A100: max_num_seqs 1024, "
                  "max_num_batched_tokens 8192 for the server; engine/arg_utils.py get_batch_defaults)"},
    )  # fmt: skip

    @property
    def total_bytes(self) -> int:
        """Total memory in bytes."""
        return int(round(self.total_gib * GIB))


#: the GPU menu (totals as the driver reports them, to 0.01 GiB; a given card may differ by a few MiB:
#: ``--gpu-memory-gib`` takes your own ``torch.cuda.mem_get_info()[1] / 2**30``)
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("A100-40GB", 39.39, profile="a100-llama-3-8b"),
        GpuSpec("A100-80GB", 79.15, profile="a100-llama-3-8b"),
        GpuSpec("H100-80GB", 79.10, vllm_large_defaults=True),
        GpuSpec("H200", 139.81, vllm_large_defaults=True),
        GpuSpec("L40S", 44.39),
    )
}


def gpu_spec(name: str, total_gib: float | None = None) -> GpuSpec:
    """The menu's GPU ``name`` (case-insensitive), or a custom one with ``total_gib``."""
    if total_gib is not None:
        total = positive_float("--gpu-memory-gib", total_gib, maximum=1e5)
        base = next((g for n, g in GPUS.items() if n.lower() == name.lower()), None)
        if base is None:
            return GpuSpec(name, total)
        return GpuSpec(base.name, total, base.profile, base.vllm_large_defaults)
    for n, g in GPUS.items():
        if n.lower() == name.lower():
            return g
    raise InvalidArgument(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or give --gpu-memory-gib for another)")


#: what the CUDA context and the allocator hold before vLLM's baseline snapshot / SGLang's
#: ``pre_model_load_memory`` (about 0.5 GiB on an A100/H100 with CUDA 12)
CUDA_CONTEXT_GIB = 0.5
#: vLLM's non-torch growth during the profile (cuBLAS/NCCL workspaces) — an estimate
_NON_TORCH_GIB = 0.25
#: vLLM 0.33's CUDA-graph memory estimate (``profile_cudagraph_memory``, subtracted by default:
#: ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``) for a dense 7–8B model — an estimate
_CUDA_GRAPH_GIB = 0.5


def vllm_reserve(shape: ModelShape, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """An estimate, in bytes, of what vLLM's profiler takes besides the weights: the activation peak of
    its dummy forward pass over ``max_num_batched_tokens`` (the MLP's gate/up output and activation,
    ``3·I`` elements per token, and four hidden-size buffers), its dummy sampler run over
    ``max_num_seqs`` fp32 logits (three vocab-sized copies), the non-torch growth and the CUDA-graph
    estimate.  Only a GPU measures it; ``docs/tune.md`` says how to give your own number."""
    dt = shape.dtype_bytes or 2
    hidden = shape.hidden or 4096
    inter = shape.intermediate or 4 * hidden
    vocab = shape.vocab or 32_000
    act = max_num_batched_tokens * (3 * inter + 4 * hidden) * dt + max_num_seqs * vocab * 4 * 3
    return int(act + (_NON_TORCH_GIB + _CUDA_GRAPH_GIB) * GIB)


@dataclass(frozen=True, slots=True)
class VllmCapacity:
    """vLLM's KV pool for one configuration, term by term (bytes)."""

    total: int
    utilisation: float
    requested: int
    weights: int | None
    reserve: int | None
    available: int = field(metadata={"help": "bytes for the KV cache (vLLM's 'Available KV cache memory')"})
    block_size: int
    kv_bytes_per_token: int
    num_blocks: int = field(metadata={"help": "vLLM's num_gpu_blocks, the null block included"})
    source: str = field(metadata={"help": "how 'available' was found: accounting, measured, kv_cache_memory_bytes"})

    @property
    def M(self) -> int:
        """Usable KV tokens: ``(num_blocks − 1)·B``."""
        return (self.num_blocks - 1) * self.block_size

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (GiB and tokens)."""
        def g(x: int | None) -> float | None:
            return None if x is None else x / GIB

        return {"total_gib": g(self.total), "gpu_memory_utilization": self.utilisation,
                "requested_gib": g(self.requested), "weights_gib": g(self.weights), "reserve_gib": g(self.reserve),
                "available_kv_gib": g(self.available), "block_size": self.block_size,
                "kv_bytes_per_token": self.kv_bytes_per_token, "num_gpu_blocks": self.num_blocks, "M_tokens": self.M,
                "source": self.source}  # fmt: skip


def vllm_capacity(
    shape: ModelShape, gpu: GpuSpec, utilisation: float, *, block_size: int = 16,
    weights_bytes: int | None = None, reserve_bytes: int | None = None, available_bytes: int | None = None,
    source: str | None = None,
) -> VllmCapacity:
    """vLLM 0.33's KV pool (module docstring): from the accounting (``weights_bytes`` else the
    shape's, and ``reserve_bytes``), or from ``available_bytes`` when measured or set."""
    util = unit_fraction("gpu_memory_utilization", utilisation)
    B = positive_int("block_size", block_size, maximum=MAX_TOKENS)
    requested = math.ceil(gpu.total_bytes * util)  # request_memory: ceil(total · utilisation)
    weights = weights_bytes if weights_bytes is not None else shape.weights_bytes
    if available_bytes is None:
        if weights is None:
            raise InvalidArgument(f"the weights' size of {shape.name or 'the model'} is unknown (its config lacks "
                                  "hidden_size, intermediate_size or vocab_size): give --weights-gb")  # fmt: skip
        if reserve_bytes is None:
            raise InvalidArgument("vllm_capacity needs reserve_bytes with the accounting")
        available = requested - weights - reserve_bytes
        how = source or "accounting"
        if available <= 0:
            raise InvalidArgument(
                f"no KV cache left on {gpu.name}: {util:g} × {gpu.total_gib:g} GiB = {requested / GIB:.2f} GiB "
                f"requested, the weights take {weights / GIB:.2f} GiB and activations/CUDA graphs about "
                f"{reserve_bytes / GIB:.2f} GiB; raise gpu_memory_utilization or use a larger GPU"
            )
    else:
        available = int(available_bytes)
        how = source or "measured"
    per_block = B * shape.kv_bytes_per_token
    num_blocks = available // per_block  # get_kv_cache_config_from_groups (kv_cache_planning.py:681)
    if num_blocks < 2:
        raise InvalidArgument(f"{available / GIB:.3g} GiB of KV memory holds {num_blocks} block(s) of {B} tokens "
                              f"× {shape.kv_bytes_per_token} B: vLLM needs at least 2 (one is its null block)")  # fmt: skip
    return VllmCapacity(total=gpu.total_bytes, utilisation=util, requested=requested, weights=weights,
                        reserve=reserve_bytes if available_bytes is None else None, available=available,
                        block_size=B, kv_bytes_per_token=shape.kv_bytes_per_token, num_blocks=num_blocks,
                        source=how)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SglangCapacity:
    """SGLang's token pool for one ``mem_fraction_static`` (bytes)."""

    total: int
    mem_fraction_static: float
    weights: int
    pre_load_free: int = field(metadata={"help": "free memory before loading the weights (total − CUDA context)"})
    available: int
    page_size: int
    kv_bytes_per_token: int
    M: int = field(metadata={"help": "max_total_num_tokens"})

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (GiB and tokens)."""
        return {"total_gib": self.total / GIB, "mem_fraction_static": self.mem_fraction_static,
                "weights_gib": self.weights / GIB, "pre_load_free_gib": self.pre_load_free / GIB,
                "available_kv_gib": self.available / GIB, "page_size": self.page_size,
                "kv_bytes_per_token": self.kv_bytes_per_token, "max_total_num_tokens": self.M}  # fmt: skip


def sglang_capacity(
    shape: ModelShape, gpu: GpuSpec, mem_fraction_static: float, *, page_size: int = 1,
    weights_bytes: int | None = None,
) -> SglangCapacity:
    """SGLang 0.5.23's ``max_total_num_tokens`` (module docstring)."""
    f = unit_fraction("mem_fraction_static", mem_fraction_static)
    page = positive_int("page_size", page_size, maximum=MAX_TOKENS)
    weights = weights_bytes if weights_bytes is not None else shape.weights_bytes
    if weights is None:
        raise InvalidArgument(f"the weights' size of {shape.name or 'the model'} is unknown: give --weights-gb")
    pre = gpu.total_bytes - int(CUDA_CONTEXT_GIB * GIB)
    available = (pre - weights) - int(pre * (1 - f))
    if available <= 0:
        raise InvalidArgument(f"no KV cache left on {gpu.name} at mem_fraction_static {f:g}: the weights take "
                              f"{weights / GIB:.2f} GiB of {f:g} × {pre / GIB:.2f} GiB")  # fmt: skip
    M = available // shape.kv_bytes_per_token // page * page
    if M < page:
        raise InvalidArgument(f"SGLang's pool at mem_fraction_static {f:g} holds no page of tokens")
    return SglangCapacity(total=gpu.total_bytes, mem_fraction_static=f, weights=weights, pre_load_free=pre,
                          available=available, page_size=page, kv_bytes_per_token=shape.kv_bytes_per_token, M=M)  # fmt: skip
