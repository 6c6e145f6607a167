# SPDX-License-Identifier: Apache-2.0
"""Peak memory of ``Session.embed`` on many texts (issue 14: 1,000 texts in one call took > 5 GB).

Each setting runs in its own child process (peak RSS is per process): load the bundle, embed 4 texts
(warm-up), read ``ru_maxrss``, embed N texts, read it again. Settings: ``embed()``'s default batching
(the verified ``embed_max_batch``) and ``max_batch=N`` (one batch per length group: what an unchunked
call costs). Texts: lines of edgesdk/data/sample_sentences.txt repeated 1-4 times (varied lengths).

    HF_HUB_OFFLINE=1 .venv/bin/python tools/bench/bench_embed_memory.py BUNDLE [--texts 1000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _child(bundle: str, n: int, max_batch: str) -> dict:
    import edgesdk

    session = edgesdk.load(bundle)
    lines = (ROOT / "edgesdk/data/sample_sentences.txt").read_text(encoding="utf-8").splitlines()
    texts = [lines[i % len(lines)] * (1 + i % 4) for i in range(n)]
    session.embed(texts[:4])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    out = session.embed(texts, max_batch=None if max_batch == "default" else int(max_batch))
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "texts": n,
        "max_batch": max_batch,
        "shape": list(out.shape),
        "rss_after_load_mib": round(before, 1),
        "peak_rss_mib": round(peak, 1),
        "embed_peak_above_load_mib": round(peak - before, 1),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.bundle, args.texts, args.child)))
        return
    runs = []
    for setting in ("default", str(args.texts)):
        proc = subprocess.run(
            [sys.executable, __file__, args.bundle, "--texts", str(args.texts), "--child", setting],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(runs[-1])
    result = {
        "benchmark": "Session.embed peak memory (issue 14)",
        "bundle": str(args.bundle),
        "machine": {"cpu": platform.processor() or platform.machine()},
        "runs": runs,
        "ratio_unchunked_over_default": round(
            runs[1]["embed_peak_above_load_mib"] / max(runs[0]["embed_peak_above_load_mib"], 0.1), 1
        ),
    }
    print(
        f"peak above load: default {runs[0]['embed_peak_above_load_mib']} MiB, max_batch={args.texts} "
        f"{runs[1]['embed_peak_above_load_mib']} MiB ({result['ratio_unchunked_over_default']}x)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
