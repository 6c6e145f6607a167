#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The model-family measurements of docs/benchmarks.md on the GPU machine, in calls on one warm machine:
#   bash tools/device/measure_h200.sh families [seconds]   CUDA llama-cpp-python (built the documented way,
#        tools/device/build_llamacpp_cuda.sh, reused while the machine is warm), edgesdk from the wheel in .dist/
#        with its gguf extra into the image's python3, then the text families (bench_text_families.py) and the VLM
#        families named by VLM_FAMILIES (bench_vlm_families.py), each built for the h200 profile with every parity
#        gate and measured with every layer on the GPU;
#   bash tools/device/measure_h200.sh p9 [seconds]         P9 on a ~1 B decoder (tools/bench/bench_vlm.py --size
#        large): mixed vs all-F16 vs all-4-bit and image-prefix reuse.
# Carry [".dist", ".whl", ".llamacpp"] (tools/device/prepare.sh makes them). Writes $OUT/*.json.
set -uo pipefail
export PYTHONUNBUFFERED=1
WHAT="${1:-families}"
LIMIT="${2:-560}"
T0=$(date +%s)
D="${OUT:-/tmp/measure}"
mkdir -p "$D"
left() { echo $(( LIMIT - ($(date +%s) - T0) - 10 )); }
LLWHEEL=/tmp/llwheel
if ! ls "$LLWHEEL"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  start=$(date +%s)
  WHEEL_DIR="$LLWHEEL" OUT= bash tools/device/build_llamacpp_cuda.sh 90 2>&1 | tail -3
  echo "llama-cpp-python CUDA build: $(( $(date +%s) - start )) s"
fi
if ! python3 -c "import edgesdk, llama_cpp" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links .whl --find-links "$LLWHEEL" \
    "$(ls .dist/edgesdk-*.whl | head -1)[gguf]" onnxslim cyclonedx-python-lib 2>&1 | tail -3
fi
python3 -c "import edgesdk, llama_cpp, transformers, torch; print('edgesdk', edgesdk.__version__, 'llama_cpp', \
llama_cpp.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, \
'gpu offload', llama_cpp.llama_supports_gpu_offload())"
if [ "$WHAT" = families ]; then
  timeout "$(( $(left) / 3 ))" python3 tools/bench/bench_text_families.py /tmp/tf --profile h200 --n-gpu-layers -1 \
    --threads 8 --out "$D/text_families_h200.json" 2>&1 | cut -c1-400
  timeout "$(left)" python3 tools/bench/bench_vlm_families.py --profile h200 --n-gpu-layers -1 --threads 8 \
    --rounds 3 --families "${VLM_FAMILIES:-gemma3,qwen25vl,qwen2vl}" --out "$D/vlm_families_h200_b.json" 2>&1 \
    | tail -8 | cut -c1-600
elif [ "$WHAT" = p9 ]; then
  timeout "$(left)" python3 tools/bench/bench_vlm.py --size large --profile h200 --n-gpu-layers 99 --threads 8 \
    --rounds 3 --work /tmp/vlm-large --reuse --out "$D/vlm_h200_large.json" 2>&1 | tail -20 | cut -c1-600
fi
echo "measure_h200 $WHAT: $(( $(date +%s) - T0 )) s"
