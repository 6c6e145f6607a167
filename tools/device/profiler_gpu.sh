#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for the profiler (issue 7): torch CUDA eager encoder first (its JSON lands in $OUT even if
# the rest runs out of time), then llama-cpp-python built with CUDA (sm_90) from the carried stripped sdist
# (tools/device/build_llamacpp_cuda.sh), then the GGUF bundles through the profiler.
# Call with carry [".llamacpp", ".whl"]; each step has its own time limit so the call ends inside ~8 minutes.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.txt"
timeout 150 python3 tools/device/profiler_gpu.py 2>&1 | grep -v 'it/s]' | tee "$OUT/profiler_torch_log.txt"
start=$(date +%s)
# OUT unset: the build script would otherwise split the wheel into $OUT (8 files come back at most)
OUT= timeout "${BUILD_LIMIT_S:-300}" bash tools/device/build_llamacpp_cuda.sh 90 2>&1 | tail -3
echo "llama.cpp build: $(( $(date +%s) - start )) s" | tee -a "$OUT/profiler_torch_log.txt"
ls .llamacpp/wheel/*.whl >/dev/null 2>&1 || { echo "no CUDA llama-cpp-python wheel: GGUF part skipped"; exit 0; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .llamacpp/wheel/*.whl || exit 1
timeout "${GGUF_LIMIT_S:-150}" python3 tools/device/profiler_gpu.py --gguf --skip-torch 2>&1 \
  | grep -v 'it/s]' | grep -v '^llama_\|^load_tensors\|^print_info' | tee "$OUT/profiler_gguf_log.txt"
