#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build llama-cpp-python with CUDA (sm_90 by default) on a GPU host without network, from the stripped sdist
# carried in .llamacpp/ (docs/versions.md says how to make it), with the system C/C++ compiler.
#
# Why the compiler is named: a host whose environment points CC/CXX at another GCC (the H200 image sets
# CXX=/opt/gcc/bin/g++) builds libraries that carry their own partial copy of that GCC's C++ runtime instead
# of linking libstdc++.so.6; such a build crashed next to onnxruntime, numpy and torch in one process
# (docs/native-libraries.md). The check at the end refuses such a wheel.
# Usage (repo root): bash tools/device/build_llamacpp_cuda.sh [cuda_arch]; WHEEL_DIR picks where the wheel goes.
set -euo pipefail
ARCH="${1:-90}"
HERE="$(pwd)"
WHEEL_DIR="${WHEEL_DIR:-$HERE/.llamacpp/wheel}"
if ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "wheel already built: $(ls "$WHEEL_DIR")"
  exit 0
fi
SRC=/tmp/llamacpp-src
rm -rf "$SRC" && mkdir -p "$SRC"
tar xJf "$HERE"/.llamacpp/llama_cpp_python-0.3.36-stripped.tar.xz -C "$SRC"
# The system compiler, whose C++ runtime is the libstdc++.so.6 every other extension in the process uses.
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${ARCH} -DGGML_NATIVE=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
start=$(date +%s)
python3 -m pip wheel -q --no-build-isolation --no-deps -w "$WHEEL_DIR" "$SRC"/llama_cpp_python-0.3.36
echo "build_seconds=$(( $(date +%s) - start ))"
whl=$(ls "$WHEEL_DIR"/llama_cpp_python-*.whl | head -1)
# Refuse a wheel whose C++ libraries do not link the shared C++ runtime (edgesdk.native reads the same thing).
check=$(mktemp -d)
python3 -m zipfile -e "$whl" "$check" >/dev/null
for lib in libllama.so libggml-base.so; do
  if ! readelf -d "$check/llama_cpp/lib/$lib" | grep -q 'NEEDED.*libstdc++.so.6'; then
    echo "error: $lib in $whl does not link libstdc++.so.6 (second C++ runtime): not using it" >&2
    rm -f "$whl"; rm -rf "$check"; exit 1
  fi
done
rm -rf "$check"
ls -la "$WHEEL_DIR"
