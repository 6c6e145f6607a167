# SPDX-License-Identifier: Apache-2.0
"""Every import order of numpy, torch, onnxruntime, llama_cpp and edgesdk, then a GGUF and a VLM bundle.

120 permutations, one child process each (a crash costs that order only and is recorded with its signal).
Each child imports the five modules in its order, initialises CUDA through torch where it has a GPU, then
loads the GGUF bundle and generates greedily, then loads the VLM bundle and answers about an image. Every
child's texts and greedy token ids must equal the first passing child's (same weights, greedy). Run by
tools/device/smoke.sh:

    python tools/device/import_matrix.py --gguf B1 --vlm B2 --image x.png [--jobs 12] [--out matrix.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MODULES = ("numpy", "torch", "onnxruntime", "llama_cpp", "edgesdk")

CHILD = """
import importlib, json, sys
order, gguf, vlm, image = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
for name in order:
    importlib.import_module(name)
import torch
if torch.cuda.is_available():
    (torch.ones(4, device="cuda") * 2).sum().item()  # torch's CUDA libraries loaded and used
import edgesdk
out = {}
s = edgesdk.load(gguf)
out["gguf"] = s.generate("The harbour town", max_tokens=8, temperature=0)
out["gguf_placement"] = s.report()["backend_report"].get("placement")
# the token ids too (the engine's result): a random model's greedy text can decode to an empty string
ids = list(s.backend.engine.generate(prompt="The harbour town", max_tokens=16, temperature=0).tokens)
out["gguf_ids"] = ids
s.close()
if vlm:
    v = edgesdk.load(vlm)
    out["vlm"] = v.generate("What is in the picture?", images=[image], max_tokens=8, temperature=0)
    v.close()
print(json.dumps(out))
"""


def run_one(order: tuple[str, ...], gguf: str, vlm: str, image: str, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(order), gguf, vlm, image],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = 124, "", "timed out"
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if rc == 0 and lines else None
    tail = [ln for ln in err.splitlines() if ln.strip()][-2:]
    return {
        "order": list(order),
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "result": result,
        **({} if rc == 0 else {"stderr_tail": tail}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--vlm", default="")
    ap.add_argument("--image", default="")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--limit", type=int, default=0, help="first N orders only (0: all 120)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    orders = list(itertools.permutations(MODULES))
    if args.limit:
        orders = orders[: args.limit]
    t0 = time.perf_counter()
    runs: list[dict] = []
    lock = threading.Lock()

    def summarize() -> dict:
        passed = [r for r in runs if r["rc"] == 0]
        reference = passed[0]["result"] if passed else None
        return {
            "orders": len(orders),
            "finished": len(runs),
            "passed": len(passed),
            "same_text_as_first": sum(1 for r in passed if r["result"] == reference),
            "failed": [
                {"order": r["order"], "rc": r["rc"], "stderr_tail": r.get("stderr_tail")} for r in runs if r["rc"] != 0
            ][:10],
            "reference": reference,
            "wall_s": round(time.perf_counter() - t0, 1),
        }

    def one(order: tuple[str, ...]) -> None:
        r = run_one(order, args.gguf, args.vlm, args.image, args.timeout)
        with lock:  # written after every child, so a run cut short still says how far it got
            runs.append(r)
            if args.out:
                Path(args.out).write_text(json.dumps({"summary": summarize(), "runs": runs}, indent=1))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, orders))
    summary = summarize()
    print(json.dumps(summary))
    return 0 if summary["same_text_as_first"] == len(orders) else 1


if __name__ == "__main__":
    sys.exit(main())
