#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU smoke run, in one device call: build llama-cpp-python with CUDA the documented way (reused while the
# machine is warm), then tools/device/smoke.py: edgesdk from a wheel of this checkout in a fresh venv, the
# README/docs commands as a user types them, no environment tweaks. Writes $OUT/device_smoke.json and
# $OUT/import_matrix.json; commit the first as tools/bench/results/device_smoke.json and quote its summary line.
# Here (before the call): pip wheel --no-deps . -w .dist/ and the wheels docs/gpu-runs.md lists in .whl/;
# carry [".dist", ".whl", ".llamacpp"] (.llamacpp holds the stripped llama-cpp-python sdist).
# Usage on the device machine: bash tools/device/smoke.sh [total_seconds, build included] [steps]
# Split over two calls on a warm machine (the build alone can take 300 s): the first with steps
# install,llm,serve,vlm, the second within the machine's warm window with SMOKE_RESUME=1 and matrix,profiler,onnx;
# the second call's device_smoke.json holds the steps of both.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
TOTAL="${1:-540}"
STEPS="${2:-install,llm,serve,vlm,matrix,profiler,onnx}"
LLWHEEL=/tmp/llwheel
if ! ls "$LLWHEEL"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  start=$(date +%s)
  WHEEL_DIR="$LLWHEEL" OUT= bash tools/device/build_llamacpp_cuda.sh 90 2>&1 | tail -3
  echo "llama-cpp-python CUDA build: $(( $(date +%s) - start )) s"
fi
DEADLINE=$(( TOTAL - ($(date +%s) - T0) - 10 ))
COMMIT="${SMOKE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
python3 tools/device/smoke.py --wheel "$(ls .dist/edgesdk-*.whl | head -1)" --find-links .whl --find-links "$LLWHEEL" \
  --commit "$COMMIT" --deadline "$DEADLINE" --steps "$STEPS" ${SMOKE_RESUME:+--resume}
