#!/usr/bin/env bash
# Serve a small model with vLLM on one NVIDIA GPU and measure it with `kvstab bench`:
# prints the saturated throughput beside μ = M/(b̄·E[g]) from the M and b̄ read off /metrics.
#
# usage: scripts/gpu-check.sh [MODEL_DIR] [PYTHON]
#   MODEL_DIR  a local Hugging Face model folder; default: a tiny Llama config written here,
#              served with random weights (--load-format dummy) and no tokenizer
#              (--skip-tokenizer-init): kvstab sends token ids, so no weights or hub are needed.
#   PYTHON     an interpreter with vLLM (CUDA build) and kvstab installed (default python3)
# env: PORT (8011), OUT (gpu-check-out), BLOCKS (2049 → M = 2048·16 = 32768 tokens),
#      WORKLOAD ("s=U(10,800),o=U(10,800)"), DURATION per run (90 s)
#
# Two runs: a short one at a low rate reads M and b̄ and gives μ; the second offers 2·μ,
# so the queue grows and the throughput measured is the saturated rate.
set -euo pipefail
MODEL="${1:-}"
PY="${2:-python3}"
PORT="${PORT:-8011}"
OUT="${OUT:-gpu-check-out}"
BLOCKS="${BLOCKS:-2049}"
WORKLOAD="${WORKLOAD:-s=U(10,800),o=U(10,800)}"
DURATION="${DURATION:-90}"
BUDGET=512

command -v nvidia-smi >/dev/null || { echo "gpu-check: no NVIDIA GPU here (nvidia-smi not found)" >&2; exit 2; }
"$PY" -c "import vllm" 2>/dev/null || { echo "gpu-check: $PY has no vLLM (pip install 'kvstab[vllm]')" >&2; exit 2; }
mkdir -p "$OUT"
extra=()
if [ -z "$MODEL" ]; then
  MODEL="$OUT/tiny-llama"
  mkdir -p "$MODEL"
  cat > "$MODEL/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
 "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "rope_theta": 10000.0}
JSON
  extra=(--load-format dummy --skip-tokenizer-init)
fi

"$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --port "$PORT" "${extra[@]}" \
  --no-enable-prefix-caching --max-num-batched-tokens "$BUDGET" --max-num-seqs 256 --max-model-len 4096 \
  --num-gpu-blocks-override "$BLOCKS" --block-size 16 > "$OUT/vllm.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  "$PY" - "$PORT" <<'PY' 2>/dev/null && break
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
PY
  kill -0 "$server" 2>/dev/null || { echo "gpu-check: vLLM exited; see $OUT/vllm.log" >&2; tail -5 "$OUT/vllm.log" >&2; exit 2; }
  sleep 1
done

url="http://127.0.0.1:$PORT"
echo "gpu-check: calibration run (2 req/s, 30 s) for M and b̄"
kvstab_bench=("$PY" -m kvstab.cli bench --url "$url" --workload "$WORKLOAD" --chunk "$BUDGET" --no-progress)
"${kvstab_bench[@]}" --rate 2 --duration 30 --warmup 0.1 --out "$OUT/calibrate.json"
mu=$("$PY" -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(r['mu_per_s'] or '')" "$OUT/calibrate.json")
[ -n "$mu" ] || { echo "gpu-check: no μ from the calibration run (see $OUT/calibrate.json)" >&2; exit 2; }
rate=$("$PY" -c "print(round(2 * float('$mu'), 3))")
echo "gpu-check: μ ≈ $mu req/s; saturation run at $rate req/s for $DURATION s"
"${kvstab_bench[@]}" --rate "$rate" --duration "$DURATION" --requests 100000 \
  --out "$OUT/bench.json" --llmd-report "$OUT/llmd-report.json"
"$PY" - "$OUT/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
print(f"gpu-check: measured {r['throughput_per_s']:.3f} req/s, μ = {r['mu_per_s']:.3f} req/s "
      f"(M={r['M']}, b̄={r['bbar_s']:.5f} s): measured/μ = {r['measured_over_mu']:.4f}")
PY
