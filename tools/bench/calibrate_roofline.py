# SPDX-License-Identifier: Apache-2.0
"""Per-backend-class encoder calibration of the roofline (issue 13, item 5), validated on held-out shapes.

Model: latency = graph nodes x overhead per node + max(bytes / bandwidth, FLOPs / peak) / efficiency.
Per backend class (ORT CPU, ORT CUDA, torch eager) and model family, two parameters fitted (least squares,
both >= 0) on the points marked ``calibration``; every other point is predicted and its error recorded.
Work facts (nodes, bytes, FLOPs) come from the bundles' ONNX graphs at each shape (edgesdk's onnx_work).

    python tools/bench/calibrate_roofline.py --measure-cpu CPU_FP32.onnx FP16.onnx   # ORT CPU here, then fit
    python tools/bench/calibrate_roofline.py                                          # refit from the file
Inputs: tools/bench/results/onnx_gpu_h200.json (ORT CUDA EP, torch eager), eager_cuda_h200.json (torch eager),
H200 ONNX bundles (.gpubundles/, for the work facts). Output: tools/bench/results/roofline_calibration.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

RES = Path(__file__).resolve().parent / "results"
OUT = RES / "roofline_calibration.json"
H200 = {"bandwidth_gbps": 4800.0, "peak_flops": 989e12}


def _work(onnx_path: str, batch: int, seq: int) -> dict:
    from edgesdk.profiler.roofline import onnx_work

    w = onnx_work(onnx_path, batch=batch, seq=seq)
    return {"nodes": w.nodes, "weight_bytes": w.weight_bytes, "flops": w.flops}


def measure_cpu(paths: list[str], threads: int = 2) -> list[dict]:
    import onnxruntime as ort

    from edgesdk.profiler.device import measure_cpu_peak_flops, measure_memory_bandwidth

    bw, peak = measure_memory_bandwidth()["value_gbps"], measure_cpu_peak_flops()["value_tflops"] * 1e12
    pts = []
    for path in paths:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        prec = "fp16" if "h200" in path or "fp16" in path else "fp32"
        for batch, seq in ((1, 32), (1, 64), (1, 128), (1, 256), (4, 128)):
            rng = np.random.default_rng(0)
            feeds = {
                "input_ids": rng.integers(1000, 30000, (batch, seq)).astype(np.int64),
                "attention_mask": np.ones((batch, seq), np.int64),
                "token_type_ids": np.zeros((batch, seq), np.int64),
            }
            feeds = {k: v for k, v in feeds.items() if k in names}
            for _ in range(3):
                sess.run(None, feeds)
            t, start = [], time.perf_counter()
            while len(t) < 30 and (len(t) < 5 or time.perf_counter() - start < 4):
                t0 = time.perf_counter()
                sess.run(None, feeds)
                t.append((time.perf_counter() - t0) * 1e3)
            pts.append(
                {
                    "backend_class": "onnxruntime-cpu",
                    "family": "transformer-encoder",
                    "model": "minilm",
                    "precision": prec,
                    "batch": batch,
                    "seq": seq,
                    "measured_ms": float(np.median(t)),
                    "onnx": path,
                    "bandwidth_gbps": bw,
                    "peak_flops": peak,
                    "threads": threads,
                    "load_avg": os.getloadavg()[0],
                    "source": f"measured here {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, ORT "
                    f"{ort.__version__} CPU EP, {threads} threads, median of <=30 runs",
                }
            )
    return pts


def gpu_points() -> list[dict]:
    pts = []
    rec = json.loads((RES / "onnx_gpu_h200.json").read_text())
    for model, onnx_dir, fam in (("minilm", "minilm-h200", "transformer-encoder"), ("resnet", "resnet-h200", "cnn")):
        for key, row in rec["models"][model]["latency_ms"].items():
            b, s = (int(x[1:]) for x in key.split("_"))
            for col, cls in (("ort_cuda_run", "onnxruntime-cuda"), ("torch_eager", "torch")):
                pts.append(
                    {
                        "backend_class": cls,
                        "family": fam,
                        "model": model,
                        "precision": "fp16",
                        "batch": b,
                        "seq": s,
                        "measured_ms": row[col]["p50"],
                        "onnx": f".gpubundles/{onnx_dir}/model.onnx",
                        "source": f"H200 {rec['date_utc']} (onnx_gpu_h200.json, {col} p50)",
                        **H200,
                    }
                )
    eager = json.loads((RES / "eager_cuda_h200.json").read_text())
    for key, row in eager["latency_ms"].items():
        b, s = (int(x[1:]) for x in key.split("_"))
        pts.append(
            {
                "backend_class": "torch",
                "family": "transformer-encoder",
                "model": "minilm",
                "precision": "fp16",
                "batch": b,
                "seq": s,
                "measured_ms": row["chosen"]["p50"],
                "onnx": ".gpubundles/minilm-h200/model.onnx",
                "source": f"H200 {eager['date_utc']} (eager_cuda_h200.json: edgesdk eager CUDA fallback p50)",
                **H200,
            }
        )
    return pts


# (backend_class, family, precision) -> shapes used for calibration; every other point is held out
CALIBRATE = {
    ("onnxruntime-cuda", "transformer-encoder", "fp16"): {(1, 128), (8, 128)},
    ("onnxruntime-cuda", "cnn", "fp16"): {(1, 224), (8, 224)},
    ("torch", "transformer-encoder", "fp16"): {(1, 128), (8, 128)},
    ("torch", "cnn", "fp16"): {(1, 224), (8, 224)},
    ("onnxruntime-cpu", "transformer-encoder", "fp32"): {(1, 32), (1, 256)},
    ("onnxruntime-cpu", "transformer-encoder", "fp16"): {(1, 32), (1, 256)},
}


def bound_ms(p: dict) -> float:
    return max(p["weight_bytes"] / (p["bandwidth_gbps"] * 1e9), p["flops"] / p["peak_flops"]) * 1e3


def fit(points: list[dict]) -> dict:
    """Least squares for t = nodes * a + bound * x (a, x >= 0); efficiency = 1 / x."""
    A = np.array([[p["nodes"], bound_ms(p)] for p in points], dtype=float)
    y = np.array([p["measured_ms"] for p in points], dtype=float)
    sol, *_ = np.linalg.lstsq(A, y, rcond=None)
    a, x = sol
    if x <= 0 or a < 0:  # constrain: one term only
        a1 = float(np.dot(A[:, 0], y) / np.dot(A[:, 0], A[:, 0]))
        x1 = float(np.dot(A[:, 1], y) / np.dot(A[:, 1], A[:, 1]))
        e_a = np.abs(A[:, 0] * a1 - y).sum()
        e_x = np.abs(A[:, 1] * x1 - y).sum()
        a, x = (a1, 1e-9) if e_a <= e_x else (0.0, x1)
    return {"overhead_us_per_node": round(float(a) * 1e3, 3), "efficiency": round(float(1 / x), 5)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure-cpu", nargs="*")
    args = ap.parse_args()
    old = json.loads(OUT.read_text()) if OUT.is_file() else {"points": []}
    cpu = (
        measure_cpu(args.measure_cpu)
        if args.measure_cpu
        else [p for p in old["points"] if p["backend_class"] == "onnxruntime-cpu"]
    )
    points = gpu_points() + cpu
    OUT.write_text(json.dumps({"points": points}, indent=1))  # measurements first: a failed fit keeps them
    for p in points:
        if "nodes" not in p:
            p.update(_work(p["onnx"], p["batch"], p["seq"]))
    fits = {}
    for key, shapes in CALIBRATE.items():
        group = [p for p in points if (p["backend_class"], p["family"], p["precision"]) == key]
        if not group:
            continue
        cal = [p for p in group if (p["batch"], p["seq"]) in shapes]
        f = fit(cal)
        fits["/".join(key)] = {**f, "calibrated_on": sorted(shapes)}
        for p in group:
            p["role"] = "calibration" if (p["batch"], p["seq"]) in shapes else "validation"
            pred = p["nodes"] * f["overhead_us_per_node"] / 1e3 + bound_ms(p) / f["efficiency"]
            p["predicted_ms"] = round(pred, 4)
            p["error_pct"] = round(100 * (pred - p["measured_ms"]) / p["measured_ms"], 1)
    held = [p for p in points if p.get("role") == "validation"]
    out = {
        "method": __doc__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fits": fits,
        "validation_within_25pct": f"{sum(abs(p['error_pct']) <= 25 for p in held)}/{len(held)}",
        "points": points,
    }
    OUT.write_text(json.dumps(out, indent=1))
    for k, f in fits.items():
        print(k, f)
    for p in points:
        print(
            f"{p['backend_class']:17s} {p['model']:7s} {p['precision']} b{p['batch']} s{p['seq']:<4d} "
            f"{p.get('role', '-'):11s} measured {p['measured_ms']:8.3f} predicted {p.get('predicted_ms', 0):8.3f} "
            f"{p.get('error_pct')}%"
        )
    print("held-out within 25 %:", out["validation_within_25pct"])


if __name__ == "__main__":
    main()
