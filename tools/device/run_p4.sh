#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One device call for P4: carried wheels -> /tmp/site, llama-cpp-python built with CUDA (sm_90),
# then tools/bench/bench_p4_h200.py; the results JSON and the log land in $OUT.
# Call with carry [".llamacpp", ".whl"] (see tools/device/build_llamacpp_cuda.sh for .llamacpp/).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
bash tools/device/build_llamacpp_cuda.sh 90 2>&1 | tail -3 || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .llamacpp/wheel/*.whl || exit 1
python3 tools/bench/bench_p4_h200.py --out "$OUT/p4_h200.json" --work /tmp/p4 2>&1 | tee "$OUT/p4_log.txt"
