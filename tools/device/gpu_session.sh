#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU runs of one device session, in the order that keeps the most evidence if time runs out:
#   step torch : profiler on a torch CUDA eager encoder (tools/device/profiler_gpu.py)
#   step build : llama-cpp-python with CUDA for sm_90 (tools/device/build_llamacpp_cuda.sh; kept in .llamacpp/wheel)
#   step p4    : P4 planner-vs-hand-tuned llama.cpp settings (tools/bench/bench_p4_h200.py)
#   step gguf  : profiler on GGUF bundles with the CUDA build (tools/device/profiler_gpu.py --gguf)
# Usage on the device machine: bash tools/device/gpu_session.sh "torch build p4"   then   "gguf"
# Call with carry [".whl", ".llamacpp"] for the first call; the second call must not carry .llamacpp, so the
# wheel built by the first stays in place (the machine is still warm).
set -uo pipefail
STEPS="${1:-torch build p4 gguf}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOG="$OUT/gpu_log.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv >> "$LOG"
step() { echo "=== $1 ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
filter() { grep -v 'it/s]' | grep -v '^llama_\|^load_tensors\|^print_info\|^llm_load\|^ggml_cuda_init'; }
for s in $STEPS; do
  case "$s" in
    torch) step torch; timeout "${TORCH_S:-90}" python3 tools/device/profiler_gpu.py 2>&1 | filter | tee -a "$LOG" ;;
    build) step build; OUT= timeout "${BUILD_S:-310}" bash tools/device/build_llamacpp_cuda.sh 90 2>&1 | tail -3 | tee -a "$LOG" ;;
    p4|gguf)
      ls .llamacpp/wheel/llama_cpp_python-*.whl >/dev/null 2>&1 || { echo "no CUDA wheel: $s skipped" | tee -a "$LOG"; continue; }
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .llamacpp/wheel/*.whl
      if [ "$s" = p4 ]; then
        step p4; timeout "${P4_S:-150}" python3 tools/bench/bench_p4_h200.py --out "$OUT/p4_h200.json" --work /tmp/p4 \
          --reps 2 2>&1 | filter | tee -a "$LOG"
      else
        # One process per quant type, no plot: a SIGSEGV after the first report (2026-12-02) lost the second.
        for q in Q4_K_M F16; do
          step "gguf $q"; timeout "${GGUF_S:-150}" python3 tools/device/profiler_gpu.py --gguf --skip-torch \
            --quant=$q --no-plot 2>&1 | filter | tee -a "$LOG"
        done
      fi ;;
  esac
done
step done
