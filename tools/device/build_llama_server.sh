#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build llama.cpp's own OpenAI-compatible server (`llama-server`, continuous batching with -np N) from the
# llama.cpp sources that llama-cpp-python vendors (the stripped sdist in .llamacpp/, docs/versions.md says how
# to make it), without network: the comparison point for `edgesdk serve` in tools/bench/bench_serve_llm.py
# (issue 20 part 3).
#
# Usage (repo root):
#   bash tools/device/build_llama_server.sh cpu          # -> .llamacpp/server-cpu/llama-server
#   bash tools/device/build_llama_server.sh cuda [ARCH]  # -> .llamacpp/server-cuda<ARCH>/llama-server (ARCH 90)
# Environment: OUT_DIR (where the binary and its shared libraries go), JOBS (parallel compile jobs; default
# nproc), SDIST (the stripped sdist), KEEP_SRC=1 (keep the temporary source/build tree and print its path).
# A finished build in OUT_DIR (its llama-server answers --version) is reused: delete OUT_DIR to rebuild.
#
# What the configure line turns off, and why:
# - GGML_NATIVE=OFF: a -march=native build segfaults on the Sapphire Rapids CPUs here (AMX path); OFF gives the
#   same CPU kernels (AVX2/FMA/F16C, OpenMP, llamafile) as the llama-cpp-python the bench compares against.
# - LLAMA_OPENSSL=OFF: no HTTPS (and no libssl requirement); the model is a local file. LLAMA_CURL, the old
#   name, is deprecated in this llama.cpp (a warning and ignored).
# - LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF: the embedded web UI is either built with npm or downloaded;
#   neither is possible offline. The stripped sdist also lacks tools/ui/ entirely, while tools/server links a
#   `llama-ui` library and depends on a `llama-ui-assets` target; when tools/ui/CMakeLists.txt is missing this
#   script writes a stand-in with no assets (the same interface llama.cpp's tools/ui embed step generates when
#   it has no assets: llama_ui_get_assets() returns an empty table, so no UI routes are registered and the
#   server runs with its API only).
# - tests, examples, the unified `llama` app: not needed; only the `llama-server` target is built.
set -euo pipefail
KIND="${1:-cpu}"
HERE="$(pwd)"
SDIST="${SDIST:-$HERE/.llamacpp/llama_cpp_python-0.3.36-stripped.tar.xz}"
JOBS="${JOBS:-$(nproc)}"
case "$KIND" in
  cpu)
    OUT_DIR="${OUT_DIR:-$HERE/.llamacpp/server-cpu}"
    GPU_ARGS=(-DGGML_CUDA=OFF)
    ;;
  cuda)
    ARCH="${2:-90}"
    OUT_DIR="${OUT_DIR:-$HERE/.llamacpp/server-cuda${ARCH}}"
    GPU_ARGS=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${ARCH}")
    # The system compiler, whose C++ runtime is the libstdc++.so.6 everything else uses (build_llamacpp_cuda.sh
    # says why: the H200 image points CXX at another GCC).
    export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
    ;;
  *)
    echo "usage: $0 cpu | cuda [ARCH]" >&2
    exit 2
    ;;
esac

if [ -x "$OUT_DIR/llama-server" ] && "$OUT_DIR/llama-server" --version >/dev/null 2>&1; then
  echo "llama-server already built: $OUT_DIR/llama-server (delete $OUT_DIR to rebuild)"
  "$OUT_DIR/llama-server" --version 2>&1 | sed 's/^/  /'
  exit 0
fi
[ -f "$SDIST" ] || { echo "error: $SDIST not found (docs/versions.md says how to make the stripped sdist)" >&2; exit 1; }

WORK="$(mktemp -d /tmp/llama-server-build.XXXXXX)"
if [ "${KEEP_SRC:-0}" != 1 ]; then
  trap 'rm -rf "$WORK"' EXIT
fi
tar xJf "$SDIST" -C "$WORK"
SRC="$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
[ -f "$SRC/tools/server/CMakeLists.txt" ] || { echo "error: $SRC has no tools/server" >&2; exit 1; }

if [ ! -f "$SRC/tools/ui/CMakeLists.txt" ]; then
  echo "tools/ui/ is missing from the sdist: writing a stand-in without web UI assets"
  mkdir -p "$SRC/tools/ui"
  cat >"$SRC/tools/ui/ui.h" <<'EOF'
// Stand-in written by edgesdk's tools/device/build_llama_server.sh: no embedded web UI assets (the interface
// llama.cpp's tools/ui embed step generates with zero assets; LLAMA_UI_HAS_ASSETS stays undefined).
#pragma once

#include <array>
#include <string>

struct llama_ui_asset {
    std::string           name;
    const unsigned char * data;
    std::size_t           size;
    std::string           etag;
    std::string           type;
};

const llama_ui_asset * llama_ui_find_asset(const std::string & name);
bool llama_ui_use_gzip();
const std::array<llama_ui_asset, 0> & llama_ui_get_assets();
EOF
  cat >"$SRC/tools/ui/ui.cpp" <<'EOF'
// Stand-in written by edgesdk's tools/device/build_llama_server.sh: an empty asset table.
#include "ui.h"

const llama_ui_asset * llama_ui_find_asset(const std::string &) { return nullptr; }
bool llama_ui_use_gzip() { return false; }
const std::array<llama_ui_asset, 0> & llama_ui_get_assets() {
    static const std::array<llama_ui_asset, 0> empty{};
    return empty;
}
EOF
  cat >"$SRC/tools/ui/CMakeLists.txt" <<'EOF'
# Stand-in written by edgesdk's tools/device/build_llama_server.sh: the llama-ui library with no assets, and an
# empty llama-ui-assets target (tools/server depends on both).
add_library(llama-ui STATIC ui.cpp)
set_target_properties(llama-ui PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(llama-ui PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_features(llama-ui PUBLIC cxx_std_17)
add_custom_target(llama-ui-assets)
EOF
fi

BUILD="$WORK/build"
# No .git in the sdist: name the source in --version ("commit unknown" otherwise).
ORIGIN_NAME="vendored-in-$(basename "$(dirname "$(dirname "$SRC")")")"
start=$(date +%s)
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${GPU_ARGS[@]}" \
  "-DLLAMA_BUILD_COMMIT=$ORIGIN_NAME" \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' >"$WORK/configure.log" 2>&1 \
  || { tail -40 "$WORK/configure.log" >&2; echo "error: cmake configure failed" >&2; exit 1; }
cmake --build "$BUILD" --config Release --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; echo "error: build failed" >&2; exit 1; }
build_seconds=$(( $(date +%s) - start ))

BIN="$BUILD/bin/llama-server"
[ -x "$BIN" ] || { echo "error: $BIN was not built" >&2; exit 1; }
rm -rf "$OUT_DIR.tmp" && mkdir -p "$OUT_DIR.tmp"
cp -a "$BIN" "$OUT_DIR.tmp/"
# The shared libraries it loads from the build tree (libllama, libggml*, llama-common, mtmd, ...), with their
# versioned symlinks; system libraries (libc, libstdc++, libgomp, CUDA) stay where they are.
for lib in $(LD_LIBRARY_PATH="$BUILD/bin" ldd "$BIN" | awk -v b="$BUILD/" 'index($3, b) == 1 {print $3}'); do
  base="$(basename "$lib")"
  cp -a "$(dirname "$lib")/${base%%.so*}".so* "$OUT_DIR.tmp/"
done
rm -rf "$OUT_DIR" && mv "$OUT_DIR.tmp" "$OUT_DIR"
if ldd "$OUT_DIR/llama-server" | grep -q "not found"; then
  ldd "$OUT_DIR/llama-server" >&2
  echo "error: $OUT_DIR/llama-server misses a library" >&2
  exit 1
fi
echo "build_seconds=$build_seconds (kind $KIND, $JOBS jobs, configure + llama-server target)"
"$OUT_DIR/llama-server" --version 2>&1 | sed 's/^/  /'
ls -la "$OUT_DIR"
[ "${KEEP_SRC:-0}" = 1 ] && echo "source and build tree kept: $WORK"
exit 0
