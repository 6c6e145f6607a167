#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Before a GPU-machine session, on a host with PyPI access: make what the device scripts carry (the GPU machine
# has no network; docs/gpu-runs.md):
#   .dist/      a wheel of this checkout (the product as a user installs it)
#   .whl/       the CPython 3.12 manylinux wheels the machine's image lacks (no dependencies resolved: the
#               image has numpy, torch, transformers, onnx, onnxruntime, protobuf, grpcio, click, pyyaml,
#               tokenizers, Pillow), py-spy for tools/device/serve_diag.sh and nvidia-ml-py for the energy figures
#               (tools/bench/energy_check.py, the profiler's NVML readings)
#   .llamacpp/  the llama-cpp-python sdist without its test models and docs, as .tar.xz (fits a call's 64 MiB)
# Usage (repo root): bash tools/device/prepare.sh; then carry [".dist", ".whl", ".llamacpp"] in the first call.
set -euo pipefail
PY="${PY:-python3}"
rm -rf .dist && "$PY" -m pip wheel -q --no-deps . -w .dist/
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -d .whl \
  opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions opentelemetry-proto \
  opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-common opentelemetry-exporter-http-transport \
  opentelemetry-exporter-otlp-proto-grpc \
  opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-prometheus prometheus-client \
  license-expression boolean.py "gguf>=0.19,<0.20" diskcache starlette uvicorn h11 onnxslim \
  pydantic pydantic-core annotated-types typing-inspection \
  "cyclonedx-python-lib>=11,<12" packageurl-python py-serializable defusedxml sortedcontainers \
  googleapis-common-protos jsonschema jsonschema-specifications referencing rpds-py attrs typing_extensions \
  py-spy pytest pluggy iniconfig nvidia-ml-py
# opentelemetry-sdk pins opentelemetry-api to its own version; the newest api can be a patch ahead (1.45.3 beside
# sdk 1.45.2 left pip unable to resolve the install there): keep the api of the sdk's version only
sdk=$(ls .whl/opentelemetry_sdk-*.whl | sort -V | tail -1 | sed 's/.*opentelemetry_sdk-\([^-]*\)-.*/\1/')
for w in .whl/opentelemetry_sdk-*.whl .whl/opentelemetry_api-*.whl; do  # an older sdk, or an api of another version
  case "$w" in *"-$sdk-"*) ;; *) rm -f "$w" ;; esac
done
if ! ls ".whl/opentelemetry_api-$sdk-"*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl "opentelemetry-api==$sdk"
fi
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
