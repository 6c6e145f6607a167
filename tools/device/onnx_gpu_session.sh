#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU run of the ONNX path (issue 13) on the H200, in a few device calls while the machine stays warm.
#
# Prepared on the build host (no device time), by tools/device/onnx_gpu_prepare.sh:
#   - onnxruntime-gpu 1.31.1 cp312 wheel, its files re-packed as tar.xz (255 MB wheel -> ~190 MB), plus the
#     h200 bundles (MiniLM FP16, ResNet-18-shaped FP16), FP16 torch weights of the same models and FP32
#     reference outputs: one payload.tar split into parts .gpup1/ .. .gpupN/ (each < 64 MiB with the tree)
#   - .whl/: edgesdk (built from a clean checkout) + the small packages the image lacks (opentelemetry)
# Device calls (each carries one part; the parts are copied to /tmp/stage, outside the repo):
#   bash tools/device/onnx_gpu_session.sh stage 1          carry [".gpup1"]
#   ...
#   bash tools/device/onnx_gpu_session.sh stage N ort      carry [".gpupN", ".whl"]   (assemble, install, run)
#   bash tools/device/onnx_gpu_session.sh torch            (torch.compile variants; machine still warm)
# A later session (payload: the fused and the standard-op h200 MiniLM bundles + references) ends with
#   bash tools/device/onnx_gpu_session.sh stage N product  (tools/device/onnx_gpu_product.py)
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
REPO="$(pwd)"
ST=/tmp/stage
mkdir -p "$ST/parts"
if [ "${1:-}" = stage ]; then
  cp ".gpup$2"/* "$ST/parts/" && echo "staged part $2: $(ls "$ST/parts" | tr '\n' ' ')"
  shift 2
fi
[ $# -eq 0 ] && exit 0
OUTD="${OUT:-/tmp/out}"
mkdir -p "$OUTD"
LOG="$OUTD/onnx_gpu_log.txt"

assemble() {
  [ -f "$ST/.assembled" ] && return 0
  cd "$ST" || return 1
  cat parts/payload.tar.part* > payload.tar && sha256sum -c parts/payload.tar.sha256 || return 1
  tar -xf payload.tar && rm -f payload.tar
  mkdir -p /tmp/ortgpu && tar -xJf ortgpu-1.31.1-cp312-site.tar.xz -C /tmp/ortgpu || return 1
  # the tar holds the wheel's files: check every one against the wheel's own RECORD (sha256)
  python3 - <<'EOF' || return 1
import base64, csv, hashlib, pathlib
root = pathlib.Path("/tmp/ortgpu")
rec = next(root.glob("onnxruntime_gpu-*.dist-info/RECORD"))
bad = n = 0
for path, digest, _ in csv.reader(rec.read_text().splitlines()):
    if not digest:
        continue
    algo, want = digest.split("=", 1)
    got = base64.urlsafe_b64encode(hashlib.new(algo, (root / path).read_bytes()).digest()).rstrip(b"=").decode()
    n += 1
    bad += got != want
print(f"onnxruntime-gpu files checked against the wheel RECORD: {n}, mismatches: {bad}")
raise SystemExit(1 if bad else 0)
EOF
  touch "$ST/.assembled"
}

step() { echo "=== $1 ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
case "$1" in
  ort)
    step assemble
    assemble 2>&1 | tee -a "$LOG" || { echo "assemble failed" | tee -a "$LOG"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/.whl/*.whl 2>&1 | tail -2
    # edgesdk refuses to load ONNX bundles while both onnxruntime and onnxruntime-gpu are installed (they share
    # the module): drop the image's CPU build on this throwaway machine (2026-12-02 run: the check fired)
    python3 -m pip uninstall -y -q onnxruntime 2>&1 | tail -1
    # onnxruntime-gpu FIRST on PYTHONPATH, ahead of the image's CPU-only onnxruntime 1.30
    export PYTHONPATH=/tmp/ortgpu:/tmp/site
    cd "$ST" || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG"
    step "onnxruntime-gpu: import, preload_dlls, EP probes"
    python3 - 2>&1 <<'EOF' | tee -a "$LOG"
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.__file__)
print("available:", ort.get_available_providers())
ort.preload_dlls()
from edgesdk.runtime.backends.onnxruntime import probe_provider
for ep in ("TensorrtExecutionProvider", "CUDAExecutionProvider"):
    print(ep, probe_provider(ep))
EOF
    # profiles/ is not inside the wheel: name the YAML (cwd is outside the repo so the wheel's edgesdk is used)
    step "edgesdk profiler run (the product as is: it does not call preload_dlls)"
    timeout 120 python3 -m edgesdk profiler run "$ST/.gpubundles/minilm-h200" -p "$REPO/profiles/h200.yaml" --iterations 50 \
      --op-profile-runs 0 --no-progress --json -o "$OUTD/profiler_minilm_h200_nopreload.json" 2>&1 \
      | grep -i 'provider\|fallback\|p50\|error' | head -20 | tee -a "$LOG"
    step "edgesdk profiler run after onnxruntime.preload_dlls()"
    for sq in 128 32; do
      timeout 120 python3 -c "import onnxruntime as o; o.preload_dlls(); from edgesdk.cli import main; main()" \
        profiler run "$ST/.gpubundles/minilm-h200" -p "$REPO/profiles/h200.yaml" --seq-len $sq --no-progress --json \
        -o "$OUTD/profiler_minilm_h200_s$sq.json" >/dev/null 2>>"$LOG"
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({k: r.get(k) for k in ('latency_ms','fallbacks','backend','runtime')}, default=str)[:1500])" \
        "$OUTD/profiler_minilm_h200_s$sq.json" 2>&1 | tee -a "$LOG"
    done
    step "bench: ORT CUDA EP variants + torch eager"
    timeout "${ORT_S:-330}" python3 "$REPO/tools/device/onnx_gpu_bench.py" ort --stage "$ST" --out "$OUTD" \
      --iters "${ITERS:-300}" 2>&1 | grep -v '^\s*$' | tee -a "$LOG"
    rm -f "$OUTD"/ortprof_*.json
    ;;
  product)
    step assemble
    assemble 2>&1 | tee -a "$LOG" || { echo "assemble failed" | tee -a "$LOG"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/.whl/*.whl 2>&1 | tail -2
    # edgesdk refuses to load ONNX bundles while both onnxruntime and onnxruntime-gpu are installed (they share
    # the module): drop the image's CPU build on this throwaway machine (2026-12-02 run: the check fired)
    python3 -m pip uninstall -y -q onnxruntime 2>&1 | tail -1
    export PYTHONPATH=/tmp/ortgpu:/tmp/site
    cd "$ST" || exit 1
    step "optimize decision (fused vs standard-op graph on the CUDA EP) + the product's CUDA-graph buckets"
    timeout "${PRODUCT_S:-300}" python3 "$REPO/tools/device/onnx_gpu_product.py" --stage "$ST" --out "$OUTD" \
      --profile "$REPO/profiles/h200.yaml" --iters "${ITERS:-300}" 2>&1 | grep -v '^\s*$' | tee -a "$LOG"
    rm -f "$OUTD"/ortprof_*.json
    ;;
  torch)
    export PYTHONPATH=/tmp/ortgpu:/tmp/site
    cd "$ST" || exit 1
    step "bench: torch.compile / + CUDA graphs"
    timeout "${TORCH_S:-540}" python3 "$REPO/tools/device/onnx_gpu_bench.py" torch --stage "$ST" --out "$OUTD" \
      --iters "${ITERS:-300}" --budget-s "${BUDGET_S:-450}" 2>&1 | grep -v '^\s*$' | grep -v 'W1\|warn' \
      | tee -a "$LOG"
    ;;
esac
step done
