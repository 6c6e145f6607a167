#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Before a GPU-machine session, on a host with PyPI access: make what the device scripts carry (the GPU machine
# has no network; docs/gpu-runs.md):
#   .dist/      a wheel of this checkout (the product as a user installs it)
#   .whl/       the CPython 3.12 manylinux wheels the machine's image lacks, one set resolved with dependencies
#               (below; the image has numpy, torch, transformers, onnx, onnxruntime, protobuf, grpcio, click,
#               pyyaml, tokenizers, Pillow), py-spy for tools/device/serve_diag.sh and nvidia-ml-py for the energy
#               figures (tools/bench/energy_check.py, the profiler's NVML readings), checked to install offline;
#               py-spy then moves to .whl-diag/ (carried only by tools/device/serve_diag.sh calls)
#   .llamacpp/  the llama-cpp-python sdist without its test models and docs, as .tar.xz (fits a call's 64 MiB)
# Usage (repo root): bash tools/device/prepare.sh; then carry [".dist", ".whl", ".llamacpp"] in the first call.
set -euo pipefail
PY="${PY:-python3}"
rm -rf .dist && "$PY" -m pip wheel -q --no-deps . -w .dist/
# One resolved set (pip's resolver, with dependencies) for CPython 3.12 manylinux: the wheel's extras the smoke
# installs (serve, otel; gguf's own packages beside the CUDA llama-cpp-python built there) and the tools the device
# scripts run. The packages the machine's image already has are then moved to .whl-image/ (not carried): the big
# ones would not fit a call's 64 MiB beside .llamacpp.
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any)
WANT=("$(ls .dist/edgesdk-*.whl)[serve,otel]" "gguf>=0.19,<0.20" diskcache jinja2 onnxslim "cyclonedx-python-lib>=11,<12"
  opentelemetry-exporter-prometheus prometheus-client httpx py-spy pytest nvidia-ml-py)
rm -rf .whl .whl-image && mkdir -p .whl .whl-image
"$PY" -m pip download -q "${PLATFORM[@]}" -d .whl "${WANT[@]}"
rm -f .whl/edgesdk-*.whl
# the image's packages and theirs (torch: sympy, mpmath, jinja2, fsspec, filelock; transformers: huggingface-hub,
# hf-xet, requests, tqdm; onnx: ml-dtypes), by distribution name as in the wheel's file name
IMAGE_HAS="numpy torch transformers onnx onnxruntime protobuf grpcio click pyyaml tokenizers pillow sympy mpmath
  jinja2 markupsafe fsspec filelock huggingface-hub hf-xet requests urllib3 certifi charset-normalizer idna tqdm
  ml-dtypes flatbuffers"
for name in $IMAGE_HAS; do
  for w in .whl/*.whl; do
    dist=$(basename "$w" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
    if [ "$dist" = "$name" ]; then mv "$w" .whl-image/; fi
  done
done
# the check: the carried set plus the image's stand-ins resolve to an install of what the smoke installs, offline
"$PY" -m pip install -q --dry-run --target "$(mktemp -d)" --ignore-requires-python --no-index --find-links .whl --find-links .whl-image \
  --find-links .dist "${PLATFORM[@]}" "${WANT[@]}"
# py-spy (2.9 MB) only serves tools/device/serve_diag.sh: kept in .whl-diag/, carried by those calls alone, so the
# smoke's carry set (.whl, .dist, .llamacpp) stays under a call's 64 MiB (with it the tree was just over, 2026-12-07)
rm -rf .whl-diag && mkdir -p .whl-diag && mv .whl/py_spy-*.whl .whl-diag/
echo "resolved: $(ls .whl | wc -l) wheels carried in .whl/, $(ls .whl-image | wc -l) the image has (.whl-image/, not carried), py-spy in .whl-diag/"
if ! ls .llamacpp/llama_cpp_python-0.3.36-stripped.tar.xz >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  rm -rf "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/*.gguf* "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/docs
  mkdir -p .llamacpp
  tar cJf .llamacpp/llama_cpp_python-0.3.36-stripped.tar.xz -C "$tmp" llama_cpp_python-0.3.36
  rm -rf "$tmp"
fi
du -sh .dist .whl .llamacpp
