#!/usr/bin/env bash
# Install SGLang 0.5.23 (CPU, scheduler only) into a Python environment, for the
# kvstab.empirical cross-check against SGLang's own scheduling objects.  kvstab
# drives SGLang's PrefillAdder, SchedulePolicy, ScheduleBatch, memory pools and
# new-token-ratio tracker with simulated model outputs: no GPU, no weights, no hub.
# `pip install sglang==0.5.23` with its dependencies pulls CUDA torch, torchvision
# and the CUDA kernels; this route installs SGLang without its dependencies, the
# CPU torch build, triton as a plain wheel (SGLang imports it at module level) and
# only the pure-Python packages the scheduler's import graph needs.
# torchvision and tvm_ffi are never installed: kvstab.empirical.sglang_driver
# stubs them for its own import of SGLang (torchvision's wheel does not load
# against the CPU torch, and pip with deps would replace torch by a CUDA one).
#
# The pins are the ones vLLM 0.33.0's route (scripts/install-vllm.sh) also
# accepts, so that both can live in one environment (CI uses one).
#
# usage: scripts/install-sglang.sh [PYTHON]
#   PYTHON  interpreter of the target environment (default: python3 on PATH)
# Idempotent: a second run only checks what is there.
set -euo pipefail

# shellcheck source=scripts/_install_engine.sh
source "$(dirname "$0")/_install_engine.sh" "${1:-python3}"
engine_and_cpu_torch install-sglang SGLang sglang 0.5.23
# triton has no dependencies of its own; a stub of it breaks SGLang's imports
"${PIP[@]}" --no-deps "triton==3.8.0"
# transformers: SGLang pins 5.19.0; vLLM 0.33.0 takes >=5.16.1,<5.21, and the
# scheduler path of either works with 5.19.0
"${PIP[@]}" numpy msgspec orjson psutil pybase64 requests packaging pillow starlette pydantic \
  pyzmq tqdm ipython aiohttp "transformers==5.19.0" dill sentencepiece gguf openai \
  partial-json-parser setproctitle einops uvicorn "fastapi>=0.133,<0.137" loguru
# compressed-tensors declares torch as a dependency: --no-deps keeps the CPU build
"${PIP[@]}" --no-deps compressed-tensors

if "$PY" -m pip list 2>/dev/null | grep -i -E '^(nvidia-|cuda-|torchvision)' >/dev/null; then
  echo "install-sglang: CUDA or torchvision packages are present; remove them (pip list | grep -i -E 'nvidia|cuda|torchvision')" >&2
  exit 1
fi
"$PY" -c 'import importlib.metadata as m, torch; print("install-sglang: sglang", m.version("sglang"), "torch", torch.__version__, "triton", m.version("triton"), "transformers", m.version("transformers"))'
echo "install-sglang: done in $(( $(date +%s) - start )) s"
