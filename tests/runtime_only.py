# SPDX-License-Identifier: Apache-2.0
"""Run Python code as on a device that installed the wheel without the build extra (issue 40, item 3).

:func:`run_runtime_only` runs ``code`` in a fresh interpreter (``python -X importtime``) whose first act is to put
a meta path finder in front of every other: it refuses (ImportError, as on a device where they are not installed)
and records every import of the build extra's packages and of edgesdk's build-side modules. The child prints one
JSON line last: the refused imports, and the edgesdk modules and third-party top-level packages it loaded, with
``-X importtime``'s module list as a second witness (it names every import tried, refused ones included).

Build side: ``edgesdk.build``, ``edgesdk.plan``, ``edgesdk.inspect`` and every module below a format's face
(``edgesdk.formats.<name>.<module>``: converters, exports, plans, facts, the VLM family build records); a format's
face (``edgesdk.formats.<name>``) stays, since the runtime asks the registry for its loader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# what `pip install edgesdk[build]` adds (pyproject's build extra) and transformers / optimum pull in
BUILD_PACKAGES = (
    "torch",
    "transformers",
    "optimum",
    "onnx",
    "onnxslim",
    "gguf",
    "cyclonedx",
    "scanoss",
    "safetensors",
    "accelerate",
)
BUILD_MODULES = ("edgesdk.build", "edgesdk.plan", "edgesdk.inspect")

_PRELUDE = """
import importlib.abc, json, sys
BUILD_PACKAGES, BUILD_MODULES = {packages!r}, {modules!r}
REFUSED = []

def build_side(name):
    top = name.split(".")[0]
    if top in BUILD_PACKAGES:
        return True
    if any(name == m or name.startswith(m + ".") for m in BUILD_MODULES):
        return True
    parts = name.split(".")
    return parts[:2] == ["edgesdk", "formats"] and len(parts) > 3

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if build_side(name):
            REFUSED.append(name)
            raise ImportError(f"{{name}}: not installed on this device (runtime-only test)", name=name)
        return None

sys.meta_path.insert(0, Refuse())

def report():
    loaded = sorted(m for m in sys.modules if m.startswith("edgesdk"))
    tops = sorted({{m.split(".")[0] for m in sys.modules}})
    print(json.dumps({{"refused": REFUSED, "edgesdk": loaded, "packages": tops}}))
"""


def run_runtime_only(code: str, *, timeout: float = 300) -> tuple[dict, list[str], subprocess.CompletedProcess]:
    """Run ``code`` under the finder (the prelude's ``report()`` runs after it). Returns the
    JSON report, the modules ``-X importtime`` saw imported and the finished process."""
    prelude = _PRELUDE.format(packages=BUILD_PACKAGES, modules=BUILD_MODULES)
    source = prelude + "\n" + code + "\nreport()\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    imported = [
        line.split("|")[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and not line.rstrip().endswith("imported package")
    ]
    return report, imported, proc


def build_side_names(names: list[str]) -> list[str]:
    """The names among ``names`` that are build-side (the finder's rule, for ``-X importtime``'s list)."""
    out = []
    for name in names:
        parts = name.split(".")
        if (
            parts[0] in BUILD_PACKAGES
            or any(name == m or name.startswith(m + ".") for m in BUILD_MODULES)
            or (parts[:2] == ["edgesdk", "formats"] and len(parts) > 3)
        ):
            out.append(name)
    return out
