#!/usr/bin/env bash
# Install vLLM 0.33.0 (CPU, scheduler only) and matplotlib into a Python environment, for the
# kvstab.empirical cross-check.  kvstab only drives vLLM's v1 *scheduler* with
# simulated model outputs: no GPU, no weights, no hub.  The full
# `pip install vllm==0.33.0` also works but pulls ~9 GB (CUDA torch, triton);
# this route installs vLLM without its dependencies, the CPU torch build, and
# only the packages the scheduler's import graph needs (~2.2 GB, ~2 minutes).
#
# usage: scripts/install-vllm.sh [PYTHON]
#   PYTHON  interpreter of the target environment (default: python3 on PATH);
#           use a dedicated venv, e.g.  python3 -m venv /work/venv-vllm &&
#           scripts/install-vllm.sh /work/venv-vllm/bin/python
# After it, `pip install -e .` (kvstab itself) into the same environment.
set -euo pipefail

# shellcheck source=scripts/_install_engine.sh
source "$(dirname "$0")/_install_engine.sh" "${1:-python3}"
engine_and_cpu_torch install-vllm vLLM vllm 0.33.0
"${PIP[@]}" packaging pydantic regex numpy cbor2 psutil pyzmq requests \
  "transformers>=5.16.1,<5.21" aiohttp oss-harmony openai pillow pybase64 \
  cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client \
  "fastapi>=0.133,<0.137" partial-json-parser "llguidance>=1.7,<1.8" einops
# xgrammar is imported by the structured-output manager; its declared deps pull
# ~1 GB of triton that the scheduler never uses.
"${PIP[@]}" --no-deps "xgrammar==0.2.8" "apache-tvm-ffi==0.1.11"

# `kvstab empirical compare` draws its plots with matplotlib (also in kvstab's
# `empirical` and `test` extras)
"${PIP[@]}" "matplotlib>=3.8"

"$PY" -c 'import vllm, torch, matplotlib; print("install-vllm: vllm", vllm.__version__, "torch", torch.__version__, "matplotlib", matplotlib.__version__)'
echo "install-vllm: done in $(( $(date +%s) - start )) s"
