# SPDX-License-Identifier: Apache-2.0
"""Eager CUDA fallback on a GPU host whose onnxruntime is CPU-only (issue 13, item 4).

Loads an ``h200`` bundle (FP16 ONNX + eager weights) with ``edgesdk.load`` as a user would: the planned
TensorRT/CUDA EPs are absent, so the runtime measures CPU EP vs eager CUDA at load and keeps the faster.
Records the fallback record, load cost, parity of the eager path vs the CPU EP (32 sentences through
``embed``) and latency of both paths at batch 1/8 x seq 32/128/256 (``session.run``).

    python tools/device/eager_fallback_gpu.py BUNDLE --out DIR
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np


def _stats(samples: list[float]) -> dict:
    a = np.asarray(samples)
    return {
        "n": len(a),
        "p50": round(float(np.median(a)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
        "min": round(float(a.min()), 4),
    }


def _time(session, feeds, iters: int, warmup: int, budget_s: float) -> dict:
    for _ in range(warmup):
        session.run(feeds)
    out, start = [], time.perf_counter()
    while len(out) < iters and (len(out) < 5 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        session.run(feeds)
        out.append((time.perf_counter() - t0) * 1000)
    return _stats(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    import onnxruntime
    import torch
    import transformers

    import edgesdk
    from edgesdk.resources import data_file

    rec: dict = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": {
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "onnxruntime_providers": onnxruntime.get_available_providers(),
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "bundle": str(args.bundle),
        "method": __doc__,
    }
    t0 = time.perf_counter()
    sess = edgesdk.load(args.bundle)
    rec["load_s"] = round(time.perf_counter() - t0, 3)
    rep = sess.report()
    rec["chosen"] = {"backend": rep["backend"], "device": rep["device"]}
    rec["fallbacks"] = rep["fallbacks"]
    rec["eager_fallback"] = rep["backend_report"].get("eager_fallback")
    print("chosen:", rec["chosen"], "load", rec["load_s"], "s")
    for f in rec["fallbacks"]:
        print("fallback:", f["from"], "->", f["to"], ":", f["reason"])
    cpu = edgesdk.load(args.bundle, eager_fallback=False)
    sents = data_file("sample_sentences.txt").read_text(encoding="utf-8").splitlines()[:32]
    a, b = sess.embed(sents), cpu.embed(sents)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rec["parity_eager_vs_cpu_ep"] = {
        "sentences": len(sents),
        "min_cosine": round(float(cos.min()), 6),
        "max_abs": round(float(np.abs(a - b).max()), 6),
        "via": "Session.embed",
    }
    print("parity:", rec["parity_eager_vs_cpu_ep"])
    rng = np.random.default_rng(0)
    table = {}
    for bsz in (1, 8):
        for seq in (32, 128, 256):
            feeds = {
                "input_ids": rng.integers(1000, 30000, size=(bsz, seq)).astype(np.int64),
                "attention_mask": np.ones((bsz, seq), np.int64),
                "token_type_ids": np.zeros((bsz, seq), np.int64),
            }
            feeds = {k: v for k, v in feeds.items() if k in {s.name for s in sess.backend.inputs}}
            row = {"chosen": _time(sess, feeds, args.iters, 10, 20.0), "cpu_ep": _time(cpu, feeds, 30, 2, 6.0)}
            row["cpu_ep_over_chosen"] = round(row["cpu_ep"]["p50"] / row["chosen"]["p50"], 2)
            table[f"b{bsz}_s{seq}"] = row
            print(
                f"b{bsz} s{seq}: {rec['chosen']['backend']}/{rec['chosen']['device']} p50 {row['chosen']['p50']} ms,"
                f" CPU EP p50 {row['cpu_ep']['p50']} ms ({row['cpu_ep_over_chosen']}x)"
            )
    rec["latency_ms"] = table
    rec["host_cpu_threads"] = torch.get_num_threads()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "eager_cuda_h200.json").write_text(json.dumps(rec, indent=1, default=str))


if __name__ == "__main__":
    main()
