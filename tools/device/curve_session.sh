#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The load-curve session on the GPU machine (issue 35), in calls on one warm machine (docs/gpu-runs.md):
#   bash tools/device/curve_session.sh build   # llama-cpp-python with CUDA (-> /tmp/llwheel, where smoke.sh looks)
#                                              # and llama-server (-> /tmp/lls) from the same stripped sdist, at once
#   bash tools/device/smoke.sh 590 install,llm,serve,curve   # the wheel, the F16 bundle, its curve vs llama-server
#   bash tools/device/curve_session.sh q4      # the Q4_K_M bundle of the same GGUF and its curve
# Carry [".dist", ".whl", ".llamacpp"] in the first call (tools/device/prepare.sh makes them).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUTD="${OUT:-/tmp}"
case "${1:-}" in
  build)
    start=$(date +%s)
    (WHEEL_DIR=/tmp/llwheel bash tools/device/build_llamacpp_cuda.sh 90 > "$OUTD/build_wheel.log" 2>&1; echo "llama-cpp-python CUDA wheel: rc=$? at $(( $(date +%s) - start )) s") &
    (OUT_DIR=/tmp/lls bash tools/device/build_llama_server.sh cuda 90 > "$OUTD/build_server.log" 2>&1; echo "llama-server: rc=$? at $(( $(date +%s) - start )) s") &
    wait
    tail -2 "$OUTD/build_wheel.log" "$OUTD/build_server.log"
    ls /tmp/llwheel /tmp/lls/llama-server
    ;;
  q4)
    BIN="$(dirname "$(command -v python3)")"
    [ -d /tmp/smoke/b-llama-q4 ] || "$BIN/edgesdk" build /tmp/smoke/llama-1b-f16.gguf --profile h200 --quant-type Q4_K_M \
      -o /tmp/smoke/b-llama-q4 --model-license Apache-2.0 --no-progress --force 2>&1 | tail -3
    python3 tools/bench/bench_serve_curve.py /tmp/smoke/b-llama-q4 --threads 8 --seconds 5 \
      --llama-server /tmp/lls/llama-server --out "$OUTD/serve_curve_q4.json"
    ;;
  *)
    echo "usage: $0 build | q4" >&2
    exit 2
    ;;
esac
