# shellcheck shell=bash
# Sourced by scripts/install-vllm.sh and scripts/install-sglang.sh with the target
# interpreter as its argument: the pip command both routes install with, and the
# two steps they begin with (the engine without its dependencies, then the CPU torch).
PY="${1:-python3}"
PIP=("$PY" -m pip install --disable-pip-version-check --progress-bar off -q)

# engine_and_cpu_torch TAG LABEL DIST VERSION: say what goes where, start the clock
# ($start, for the caller's last line), install DIST==VERSION without its
# dependencies, then the CPU torch build
engine_and_cpu_torch() {
  echo "$1: $2 $4 (no deps) + CPU torch 2.13.0 into $("$PY" -c 'import sys; print(sys.prefix)')"
  start=$(date +%s)

  "${PIP[@]}" --no-deps "$3==$4"
  # The CPU build: on this project's machines it lies in pip's find-links
  # (/opt/wheels) as 2.13.0+cpu, which sorts above PyPI's CUDA 2.13.0.
  "${PIP[@]}" "torch==2.13.0"
}
