# SPDX-License-Identifier: Apache-2.0
# ruff: noqa: B023  (each closure is timed right where it is made)
"""Second H200 run of issue 13 (tools/device/onnx_gpu_session.sh ... product):

1. The optimize decision for GPU profiles, measured on the CUDA EP: the ORT-fused FP16 MiniLM graph
   (Attention/SkipLayerNormalization/BiasGelu contrib ops) against the standard-op graph that TensorRT takes
   whole (onnxslim), same weights: plain run / IO binding / CUDA graph, placement.
2. The product's own CUDA-graph path (edgesdk.runtime.backends.ort_buckets via ``load(..., cuda_graphs=...)``):
   report(), padded+masked output vs the plain session, and latency of ``backend.run`` and ``Session.run``
   for requests that fill a bucket and requests padded up to one.

Usage (device, from a folder outside the repo): python3 onnx_gpu_product.py --stage DIR --out DIR --profile YAML
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_gpu_bench import compare, minilm_feeds, ort_variants, placement, timeit  # noqa: E402


def decision(ort, stage: Path, out: Path, iters: int) -> dict:
    res = {}
    ref = np.load(stage / ".gpuw" / "reference_fp32.npz")
    feeds = {
        "input_ids": ref["input_ids"],
        "attention_mask": ref["attention_mask"],
        "token_type_ids": np.zeros_like(ref["input_ids"]),
    }
    for name in ("minilm-h200", "minilm-h200-std"):
        mp = stage / ".gpubundles" / name / "model.onnx"
        r = res.setdefault(name, {})
        try:
            sess = ort.InferenceSession(str(mp), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
            r["parity_vs_fp32_reference"] = compare(
                sess.run(None, feeds)[0], ref["last_hidden_state"], ref["attention_mask"]
            )
            r["placement"] = placement(ort, mp, minilm_feeds(1, 128), out)
            ort_variants(ort, mp, "minilm", [(1, 32), (1, 128), (1, 256), (8, 128)], iters, r)
        except Exception as exc:  # noqa: BLE001
            r["error"] = str(exc)[:500]
        print(name, json.dumps({k: v for k, v in r.items() if k != "latency_ms"}, default=str)[:900], flush=True)
    return res


def product(stage: Path, profile: str, iters: int) -> dict:
    from edgesdk.runtime.session import load

    res: dict = {}
    bundle = stage / ".gpubundles" / "minilm-h200"
    sess = load(bundle, profile=profile)  # auto: the h200 profile recommends CUDA graphs
    be = sess.backend
    res["auto_report"] = be.report()["cuda_graphs"]
    names = be.output_names
    for b, s in ((1, 128), (1, 100), (1, 20), (8, 128), (8, 77)):
        feeds = minilm_feeds(b, s, seed=b * 1000 + s)
        plain = dict(zip(names, be.session.run(names, feeds)))
        got = be.run(feeds)
        key = f"b{b}_s{s}"
        res.setdefault("parity_graph_vs_plain", {})[key] = {
            "shape": list(got[names[0]].shape),
            **compare(got[names[0]], plain[names[0]], feeds["attention_mask"]),
        }
        res.setdefault("latency_ms", {})[key] = {
            "plain_session_run": timeit(lambda: be.session.run(names, feeds), iters),
            "backend_run_cuda_graph": timeit(lambda: be.run(feeds), iters),
            "Session_run_cuda_graph": timeit(lambda: sess.run(feeds), iters),
        }
        print(
            key,
            {k: round(v["p50"], 4) for k, v in res["latency_ms"][key].items()},
            res["parity_graph_vs_plain"][key],
            flush=True,
        )
    res["report_after"] = be.report()["cuda_graphs"]
    off = load(bundle, profile=profile, cuda_graphs=False)
    res["off_report"] = off.backend.report()["cuda_graphs"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    t0 = time.time()
    res = {
        "onnxruntime": ort.__version__,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": __doc__.split("Usage")[0].strip(),
    }
    res["optimize_decision"] = decision(ort, a.stage, a.out, a.iters)
    try:
        res["product_cuda_graphs"] = product(a.stage, a.profile, a.iters)
    except Exception:  # noqa: BLE001
        import traceback

        res["product_error"] = traceback.format_exc()[-1500:]
        print(res["product_error"], flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    (a.out / "onnx_gpu_product.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
