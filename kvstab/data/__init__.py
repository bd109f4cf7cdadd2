"""The data kvstab ships: six real length traces (two with prefix structure), an A100 batch-time profile and a model shape.

Every file here is public data kept with its licence (``LICENSE-*`` beside it;
``kvstab/data/README.md`` says where each came from).  Code never builds a path
into this folder by hand: it asks :func:`data_dir` (or :func:`trace_path`,
:func:`profile_dir`), which honours the ``KVSTAB_DATA`` environment variable so
a user can point kvstab at another copy laid out the same way.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from kvstab.errors import InvalidArgument

__all__ = ["data_dir", "trace_path", "profile_dir", "model_config_path", "TRACES", "PROFILE", "MODELS"]

#: the shipped traces, by short name
TRACES: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "sharegpt": "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "arxiv": "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
    # Mooncake's FAST'25 release (JSON Lines with hash_ids: prefix structure in 512-token blocks)
    "mooncake-conversation": "mooncake_conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl",
}

#: the shipped batch-time profile (Meta-Llama-3-8B on an A100, from microsoft/vidur)
PROFILE = "a100-llama-3-8b"

#: the shipped model shapes (``models/NAME/config.json``, written from public facts), by short name
MODELS: tuple[str, ...] = ("llama-3-8b",)


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``override`` if given, else ``$KVSTAB_DATA``, else the
    copy installed with the package.  It must hold ``traces/`` and ``profiles/``."""
    chosen = override if override is not None else os.environ.get("KVSTAB_DATA") or None
    if chosen is None:
        return Path(str(resources.files("kvstab.data")))
    d = Path(chosen)
    where = "--data" if override is not None else "KVSTAB_DATA"
    if not d.is_dir():
        raise InvalidArgument(f"data folder {str(d)!r} (from {where}) is not a directory; it must hold traces/ and profiles/")
    if not (d / "traces").is_dir() and not (d / "profiles").is_dir():
        raise InvalidArgument(f"data folder {str(d)!r} (from {where}) has neither traces/ nor profiles/ in it")
    return d


def trace_path(name: str, override: str | os.PathLike[str] | None = None) -> Path:
    """Path of a shipped trace, by short name (``azure-conv``, …) or file name."""
    file = TRACES.get(name, name)
    p = data_dir(override) / "traces" / file
    if not p.is_file():
        known = ", ".join(sorted(TRACES))
        raise InvalidArgument(f"trace {name!r} not found at {p}; shipped traces: {known}")
    return p


def profile_dir(name: str = PROFILE, override: str | os.PathLike[str] | None = None) -> Path:
    """Folder of a batch-time profile (default: the shipped A100 / Llama-3-8B one)."""
    p = data_dir(override) / "profiles" / name
    if not p.is_dir():
        raise InvalidArgument(f"profile {name!r} not found at {p}")
    return p


def model_config_path(name_or_path: str, override: str | os.PathLike[str] | None = None) -> Path:
    """A Hugging Face ``config.json``: a shipped model's by short name (``llama-3-8b``), a file, or a
    folder holding one."""
    if name_or_path in MODELS:
        p = data_dir(override) / "models" / name_or_path / "config.json"
    else:
        p = Path(name_or_path)
        if p.is_dir():
            p = p / "config.json"
    if not p.is_file():
        raise InvalidArgument(f"config {name_or_path!r}: no such file (a config.json, a folder holding one, or a "
                              f"shipped model: {', '.join(MODELS)})")
    return p
