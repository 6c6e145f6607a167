#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# edgesdk serve vs llama.cpp's own llama-server -np N on the GPU machine (issue 20's device table), after
# tools/device/smoke.sh ran on the same warm machine (the random-weight 1B llama GGUF and its h200 bundle in
# /tmp/smoke, edgesdk installed from the wheel) and llama-server was built with
# `OUT_DIR=/tmp/lls bash tools/device/build_llama_server.sh cuda 90`. Both bundles: the F16 one smoke.sh built
# and a Q4_K_M one built here; 1/4/16/64 streaming clients, 64 tokens each (tools/bench/bench_serve_llm.py:
# edgesdk serve batched, edgesdk serve --parallel 1, llama-server with edgesdk's slot count, the bare loop).
# Writes $OUT/serve_compare/*. Usage: bash tools/device/serve_compare.sh [llama-server binary]
set -uo pipefail
LS="${1:-/tmp/lls/llama-server}"
D="${OUT:-/tmp}/serve_compare"
mkdir -p "$D"
[ -x "$LS" ] || { echo "no llama-server at $LS (tools/device/build_llama_server.sh cuda 90)"; exit 2; }
[ -d /tmp/smoke/b-llama ] || { echo "run tools/device/smoke.sh first (no /tmp/smoke/b-llama)"; exit 2; }
if [ ! -d /tmp/smoke/b-llama-q4 ]; then
  edgesdk build /tmp/smoke/llama-1b-f16.gguf --profile h200 --quant-type Q4_K_M -o /tmp/smoke/b-llama-q4 \
    > "$D/build_q4.log" 2>&1 || { tail -5 "$D/build_q4.log"; }
fi
for b in b-llama b-llama-q4; do
  [ -d "/tmp/smoke/$b" ] || continue
  echo "== $b"
  python3 tools/bench/bench_serve_llm.py "/tmp/smoke/$b" --threads 8 --max-tokens 64 --concurrency 1,4,16,64 \
    --no-llama-cpp-server --turns 0 --llama-server "$LS" --out "$D/serve_llm_h200_$b.json" 2>&1 | tail -16
done
