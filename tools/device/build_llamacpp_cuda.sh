#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build llama-cpp-python with CUDA (sm_90) on the GPU machine from the stripped sdist carried in .llamacpp/.
# Why a script: the machine has no internet, so the sdist travels with the call (recipe in docs/versions.md), and the
# built wheel is kept in .llamacpp/ (reused while the machine stays warm) and split into <=15 MiB parts in $OUT.
# Usage (on the device machine, repo root): bash tools/device/build_llamacpp_cuda.sh [cuda_arch]
set -euo pipefail
ARCH="${1:-90}"
HERE="$(pwd)"
WHEEL_DIR="$HERE/.llamacpp/wheel"
if ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "wheel already built: $(ls "$WHEEL_DIR")"
  exit 0
fi
if ls "$HERE"/.llamacpp/parts/llama_cpp_python-*.whl.part* >/dev/null 2>&1; then
  mkdir -p "$WHEEL_DIR"
  first=$(ls "$HERE"/.llamacpp/parts/*.part* | head -1)
  name=$(basename "${first%.part*}")
  cat "$HERE"/.llamacpp/parts/"$name".part* > "$WHEEL_DIR/$name"
  echo "wheel reassembled from carried parts: $name"
  exit 0
fi
SRC=/tmp/llamacpp-src
rm -rf "$SRC" && mkdir -p "$SRC"
tar xJf "$HERE"/.llamacpp/llama_cpp_python-0.3.36-stripped.tar.xz -C "$SRC"
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${ARCH} -DGGML_NATIVE=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
start=$(date +%s)
python3 -m pip wheel -q --no-build-isolation --no-deps -w "$WHEEL_DIR" "$SRC"/llama_cpp_python-0.3.36
echo "build_seconds=$(( $(date +%s) - start ))"
ls -la "$WHEEL_DIR"
if [ -n "${OUT:-}" ]; then
  whl=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -1)
  [ "${SPLIT_WHEEL:-0}" = 1 ] && split -b 15M -d "$whl" "$OUT/$(basename "$whl").part"
  sha256sum "$whl" > "$OUT/wheel.sha256"
fi
