#!/usr/bin/env bash
# Install everything the whole test suite needs beyond the `test` extra:
#   - vLLM 0.33.0's scheduler on CPU (scripts/install-vllm.sh) for the
#     cross-checks against the real vLLM scheduler;
#   - SGLang 0.5.23's scheduler on CPU (scripts/install-sglang.sh) for the
#     cross-checks against the real SGLang scheduler; both live in one
#     environment (transformers 5.19.0 is inside vLLM's range, the CPU torch
#     and triton serve both);
#   - pdflatex (Debian: texlive-latex-base) for the test that compiles
#     `kvstab derive` output;
#   - Chromium (Debian: chromium) for the test that renders `kvstab audit`'s
#     HTML report in a real headless browser;
#   - the load generators that tests/live/test_live_clients.py points at
#     `kvstab serve --emulate`: `vllm bench serve` (vLLM's CLI also imports
#     watchfiles, which the --no-deps install leaves out), and AIPerf 0.13 and
#     GuideLLM 0.8, each in a virtual environment of its own under
#     <PYTHON's environment>/clients/NAME, where the tests look for them (their
#     pins clash with vLLM's and SGLang's: torch, transformers, pydantic).
# The system packages come from apt and need root; without root, the script
# names what is missing and stops, so the suite never runs half-equipped.
#
# usage: scripts/install-test-tools.sh [PYTHON]   (PYTHON: the target environment)
set -euo pipefail
PY="${1:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"

need=()
command -v pdflatex >/dev/null 2>&1 || need+=(texlive-latex-base)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-tools: missing ${need[*]}; install them (Debian: sudo apt-get install ${need[*]}) and rerun" >&2
    exit 1
  fi
  echo "install-test-tools: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

bash "$here/install-vllm.sh" "$PY"
bash "$here/install-sglang.sh" "$PY"
"$PY" -m pip install -q watchfiles

prefix="$("$PY" -c 'import sys; print(sys.prefix)')"
for client in aiperf==0.13.0 guidellm==0.8.1; do
  name="${client%%=*}"
  if [ ! -x "$prefix/clients/$name/bin/$name" ]; then
    echo "install-test-tools: $client in $prefix/clients/$name"
    "$PY" -m venv "$prefix/clients/$name"
    "$prefix/clients/$name/bin/python" -m pip install -q "$client"
  fi
done
