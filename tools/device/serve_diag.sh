#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Where a batched `edgesdk serve` spends a decode step on the GPU machine (issue 20), after tools/device/smoke.sh
# ran on the same warm machine (it leaves the random-weight 1B llama GGUF and its h200 bundle in /tmp/smoke and
# edgesdk installed from the wheel):
#   1. the engine alone (tools/bench/bench_batching.py: BatchEngine vs plain Llama one request after another;
#      llama_decode ms and host ms per call) at 1, 16 and 64 concurrent requests, 16 slots, for four admission
#      settings (below);
#   2. `edgesdk serve` as a user starts it, under 1, 16 and 64 steady streaming clients
#      (tools/device/serve_load.py), sampled with py-spy during the 16-client load where py-spy is carried
#      (.whl-diag/py_spy-*.whl, made by tools/device/prepare.sh: carry .whl-diag) and the machine allows it.
# Writes $OUT/serve_diag/*. Usage: bash tools/device/serve_diag.sh [seconds per load]
set -uo pipefail
SECS="${1:-8}"
D="${OUT:-/tmp}/serve_diag"
mkdir -p "$D"
GGUF=/tmp/smoke/llama-1b-f16.gguf
BUNDLE=/tmp/smoke/b-llama
[ -f "$GGUF" ] && [ -d "$BUNDLE" ] || { echo "run tools/device/smoke.sh first (no $GGUF / $BUNDLE)"; exit 2; }
# the engine's admission settings, each a separate run on the same requests: one prompt per step in its own
# decode (the CPU default), all waiting prompts in the generating tokens' decode (the GPU default), the same with
# one unified KV stream, and all prompts per step in a decode of their own
sweep=("pps1:--prompts-per-step 1" "mixed:--prompts-per-step 16 --mixed-prefill"
       "mixed_kvu:--prompts-per-step 16 --mixed-prefill --kv-unified" "pps16:--prompts-per-step 16")
for entry in "${sweep[@]}"; do
  name=${entry%%:*}; flags=${entry#*:}
  echo "== engine $name ($flags)"
  # shellcheck disable=SC2086
  python3 tools/bench/bench_batching.py --gguf "$GGUF" --n-gpu-layers -1 --flash-attn --threads 8 --slots 16 \
    --max-tokens 64 --concurrency "${SWEEP_C:-1,16,64}" --rounds 1 $flags --out "$D/batching_h200_$name.json" 2>&1 | tail -7
done
PYSPY=""
if ls .whl-diag/py_spy-*.whl >/dev/null 2>&1; then
  rm -rf /tmp/pyspy && python3 -m zipfile -e "$(ls .whl-diag/py_spy-*.whl | head -1)" /tmp/pyspy \
    && PYSPY=$(ls /tmp/pyspy/py_spy-*.data/scripts/py-spy) && chmod +x "$PYSPY"
fi
edgesdk serve "$BUNDLE" --port 8765 > "$D/serve.log" 2>&1 &
SRV=$!
for _ in $(seq 1 120); do curl -sf localhost:8765/health >/dev/null 2>&1 && break; sleep 0.5; done
for c in 1 16 64; do
  if [ "$c" = 16 ] && [ -n "$PYSPY" ]; then
    (sleep 2; timeout 20 "$PYSPY" record --pid "$SRV" -d 4 -f raw -o "$D/pyspy_16.txt" --nonblocking \
      > "$D/pyspy.log" 2>&1) &
  fi
  python3 tools/device/serve_load.py --port 8765 --clients "$c" --seconds "$SECS" --max-tokens 64 \
    | tee -a "$D/serve_load.jsonl"
done
wait 2>/dev/null
curl -s localhost:8765/metrics > "$D/metrics.txt"
kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
if [ -s "$D/pyspy_16.txt" ]; then
  python3 - "$D/pyspy_16.txt" <<'EOF'
import sys
from collections import Counter
leaf = Counter()
for line in open(sys.argv[1]):
    stack, n = line.rsplit(" ", 1)
    leaf[stack.split(";")[-1][:120]] += int(n)
print("py-spy, 16 clients, most sampled frames:")
for frame, n in leaf.most_common(15):
    print(f"  {n:5d} {frame}")
EOF
else
  echo "py-spy: no samples ($(tail -1 "$D/pyspy.log" 2>/dev/null))"
fi
