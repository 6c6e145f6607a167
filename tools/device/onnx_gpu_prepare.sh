#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build-host side of tools/device/onnx_gpu_session.sh (no device time): pack the onnxruntime-gpu wheel's files,
# the h200 bundles, FP16 torch weights and FP32 references into one payload.tar and split it into .gpupN/
# folders of 58 MiB (a device call carries at most 64 MiB with the working tree).
# Usage: bash tools/device/onnx_gpu_prepare.sh [PATH ...]   (default: .gpubundles .gpuw; the product run used
#        .gpubundles/minilm-h200 .gpubundles/minilm-h200-std .gpuw/reference_fp32.npz)
# Expects: /tmp/ortdl/ortgpu-1.31.1-cp312-site.tar.xz (the wheel unzipped, then `tar -c . | xz -6`),
#          .gpubundles/{minilm,resnet}-h200 (edgesdk build ... --profile h200), .gpuw/ (FP16 weights, references).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .gpup[0-9]* /tmp/payload && mkdir -p /tmp/payload
cp /tmp/ortdl/ortgpu-1.31.1-cp312-site.tar.xz /tmp/payload/
tar -cf /tmp/payload/payload.tar -C /tmp/payload ortgpu-1.31.1-cp312-site.tar.xz -C "$PWD" ${@:-.gpubundles .gpuw}
(cd /tmp/payload && sha256sum payload.tar > payload.tar.sha256 && split -b 58M -d payload.tar payload.tar.part)
i=1
for p in /tmp/payload/payload.tar.part*; do
  mkdir -p ".gpup$i" && mv "$p" ".gpup$i/"
  grep -qx "/.gpup$i/" .git/info/exclude || echo "/.gpup$i/" >> .git/info/exclude
  i=$((i + 1))
done
cp /tmp/payload/payload.tar.sha256 .gpup1/
du -sh .gpup* .whl
