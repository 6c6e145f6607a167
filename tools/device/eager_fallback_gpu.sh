#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Eager CUDA fallback on the H200 (issue 13, item 4): the image's onnxruntime is CPU-only, torch sees the GPU.
# Prepared here (no device time): bash tools/device/eager_fallback_gpu.sh prepare BUNDLE
#   splits the h200 bundle into .e4p1/ (eager/ weights) and .e4p2/ (the rest), each < 64 MiB with the tree.
# Device calls (the machine stays warm between them; parts go to /tmp/stage, outside the repo):
#   bash tools/device/eager_fallback_gpu.sh stage 1          carry [".e4p1"]
#   bash tools/device/eager_fallback_gpu.sh stage 2 run      carry [".e4p2", ".whl"]
# edgesdk runs from this working tree (PYTHONPATH); .whl brings the small pure-Python packages the image lacks.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
REPO="$(pwd)"
ST=/tmp/stage
if [ "${1:-}" = prepare ]; then
  src="${2:?bundle}"
  rm -rf .e4p1 .e4p2 && mkdir -p .e4p1 .e4p2
  name="$(basename "$src")"
  tar -cf .e4p1/part1.tar -C "$(dirname "$src")" "$name/eager"
  tar -cf .e4p2/part2.tar -C "$(dirname "$src")" --exclude "$name/eager" "$name"
  for d in .e4p1 .e4p2; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  du -sh .e4p1 .e4p2
  exit 0
fi
mkdir -p "$ST"
if [ "${1:-}" = stage ]; then
  tar -xf ".e4p$2"/part"$2".tar -C "$ST" && echo "staged part $2: $(du -sh "$ST" | cut -f1)"
  shift 2
fi
[ $# -eq 0 ] && exit 0
OUTD="${OUT:-/tmp/out}"
mkdir -p "$OUTD"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls "$REPO"/.whl/*.whl | grep -v edgesdk-) 2>&1 | tail -2
export PYTHONPATH="$REPO:/tmp/site"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import onnxruntime as o, torch; print('onnxruntime', o.__version__, o.get_available_providers(), '| torch', torch.__version__, torch.cuda.is_available())"
B="$(ls -d "$ST"/*/ | head -1)"
cd /tmp || exit 1
timeout 400 python3 "$REPO/tools/device/eager_fallback_gpu.py" "$B" --out "$OUTD" 2>&1 | grep -v Warning
timeout 150 python3 -m edgesdk profiler run "$B" --iterations 200 --op-profile-runs 0 --no-progress --json \
  -o "$OUTD/profiler_eager_cuda_h200.json" > /dev/null 2> "$OUTD/profiler_stderr.txt"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('profiler run:', r['runtime']['backend'], r['runtime']['device'], 'p50', round(r['latency_ms']['p50'],3), 'ms; prediction', json.dumps((r.get('prediction') or {}).get('encoder'))[:400])" "$OUTD/profiler_eager_cuda_h200.json" || tail -5 "$OUTD/profiler_stderr.txt"
