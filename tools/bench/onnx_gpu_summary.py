# SPDX-License-Identifier: Apache-2.0
"""Merge the two phases of tools/device/onnx_gpu_bench.py into one results file with the item-3 table.

Usage: python tools/bench/onnx_gpu_summary.py ORT_JSON TORCH_JSON [--out tools/bench/results/onnx_gpu_h200.json]
Prints the markdown table (p50 / p99 in ms) and, per bucket, edgesdk's best ORT variant over the best torch one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ORT = ["ort_cuda_run", "ort_cuda_iobinding", "ort_cuda_graph"]
TORCH = ["torch_eager", "torch_compile", "torch_compile_cudagraphs"]
LABEL = {
    "ort_cuda_run": "ORT CUDA EP",
    "ort_cuda_iobinding": "+ IO binding",
    "ort_cuda_graph": "+ CUDA graph",
    "torch_eager": "torch eager",
    "torch_compile": "torch.compile",
    "torch_compile_cudagraphs": "compile + CUDA graphs",
}


def merge(ort: dict, torch: dict) -> dict:
    out = {
        "date_utc": ort["date_utc"],
        "device": ort["torch"]["device"],
        "onnxruntime": ort["onnxruntime"],
        "torch": ort["torch"]["version"],
        "ep_probe": ort.get("ep_probe"),
        "method": ort["method"] + "\n\n" + torch["method"].split("\n\n")[-1],
        "models": {},
    }
    for kind in ("minilm", "resnet"):
        o, t = ort[kind], torch[kind]
        lat = {k: {**v} for k, v in o["latency_ms"].items()}
        for k, v in t["latency_ms"].items():
            lat.setdefault(k, {}).update(v)
        ratios = {}
        for k, row in lat.items():
            best_ort = min(ORT, key=lambda n: row[n]["p50"] if n in row else float("inf"))
            best_t = min(TORCH, key=lambda n: row[n]["p50"] if n in row else float("inf"))
            if best_ort in row and best_t in row:
                ratios[k] = {
                    "edgesdk_best": best_ort,
                    "torch_best": best_t,
                    "ratio_p50": row[best_ort]["p50"] / row[best_t]["p50"],
                    "ratio_plain_run_p50": row["ort_cuda_run"]["p50"] / row[best_t]["p50"],
                }
                # torch's inputs already live on the GPU; the same for the captured graph (no host copy)
                if "ort_cuda_graph_no_input_copy" in row:
                    ratios[k]["ratio_graph_inputs_resident_p50"] = (
                        row["ort_cuda_graph_no_input_copy"]["p50"] / row[best_t]["p50"]
                    )
        out["models"][kind] = {
            "parity": o.get("parity"),
            "placement": o.get("placement"),
            "torch_model": o.get("torch_model"),
            "latency_ms": lat,
            "one_session_multi_graph": o.get("one_session_multi_graph"),
            "compile_s": t.get("compile_s"),
            "ratio_vs_best_torch": ratios,
        }
    return out


def table(res: dict) -> str:
    lines = [
        "| model | batch × seq | " + " | ".join(LABEL[n] for n in ORT + TORCH) + " | best ORT / best torch |",
        "|---|---|" + "---:|" * (len(ORT) + len(TORCH) + 1),
    ]
    for kind, m in res["models"].items():
        for k, row in m["latency_ms"].items():
            b, s = k[1:].split("_s")
            cells = [f"{row[n]['p50']:.3f} / {row[n]['p99']:.3f}" if n in row else "n/a" for n in ORT + TORCH]
            r = m["ratio_vs_best_torch"].get(k, {}).get("ratio_p50")
            shape = f"{b} × {s}" if kind == "minilm" else f"{b} × 3×224×224"
            lines.append(f"| {kind} | {shape} | " + " | ".join(cells) + f" | {r:.2f}× |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ort", type=Path)
    ap.add_argument("torch", type=Path)
    ap.add_argument("--profiler", type=Path, help="summary of the `edgesdk profiler run` reports of the same run")
    ap.add_argument("--out", type=Path, default=Path("tools/bench/results/onnx_gpu_h200.json"))
    a = ap.parse_args()
    res = merge(json.loads(a.ort.read_text()), json.loads(a.torch.read_text()))
    if a.profiler:
        res["edgesdk_profiler_run"] = json.loads(a.profiler.read_text())
    res["table_md"] = table(res)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(res["table_md"])


if __name__ == "__main__":
    main()
