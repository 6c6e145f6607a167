#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The VLM measurements of issue 21 on the GPU machine, after tools/device/smoke.sh installed edgesdk from the wheel
# on the same warm machine (and the CUDA llama-cpp-python):
#   1. every VLM family's random-weight test model (tests/vlm_fixtures.py, tests/test_qwen25vl.py) built for the
#      h200 profile with every parity gate, then TTFT and decode tok/s with every layer on the GPU
#      (tools/bench/bench_vlm_families.py --profile h200);
#   2. P9 on a ~1 B decoder: mixed (F16 mmproj + Q4_K_M decoder) vs all-F16 vs all-4-bit
#      (tools/bench/bench_vlm.py --size large --profile h200 --n-gpu-layers 99).
# The families import pytest (tests/test_qwen25vl.py): carry its wheel (and pluggy, iniconfig) in .whl/ where the
# image lacks it. Writes $OUT/vlm_h200/*. Usage: bash tools/device/vlm_h200.sh [families|p9|both]
set -uo pipefail
WHAT="${1:-both}"
D="${OUT:-/tmp}/vlm_h200"
mkdir -p "$D"
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-index --find-links .whl pytest || true
if [ "$WHAT" != p9 ]; then
  python3 tools/bench/bench_vlm_families.py --profile h200 --n-gpu-layers -1 --threads 8 --rounds 5 \
    --out "$D/vlm_families_h200.json" 2>&1 | tail -12
fi
if [ "$WHAT" != families ]; then
  python3 tools/bench/bench_vlm.py --size large --profile h200 --n-gpu-layers 99 --threads 8 --rounds 5 \
    --work /tmp/vlm-large --reuse --out "$D/vlm_h200_large.json" 2>&1 | tail -20
fi
