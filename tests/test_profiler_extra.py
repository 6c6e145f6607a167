# SPDX-License-Identifier: Apache-2.0
"""The ``[profiler]`` extra holds what the profiler imports (issue 24: README said it adds onnx; pyproject's extra
did not, so ``pip install 'edgesdk[profiler]'``, which ``profiler predict``'s own exit-10 message advises,
left ``profiler predict`` without onnx). Every module a ``require("profiler", ...)`` names, and the graph
analysis' onnx and sympy, come from a distribution the extra lists; README's row lists exactly the extra; the
graph analysis still works where sympy is absent (ONNX's own shape inference)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def _extra(name: str) -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]
    return {re.split(r"[<>=!~; \[]", d, maxsplit=1)[0].lower() for d in deps}


def _required_modules(extra: str) -> set[str]:
    """Top-level modules of every ``require(extra, ...)`` call with literal arguments in edgesdk/."""
    found = set()
    for path in (REPO / "edgesdk").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "require"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == extra
            ):
                mods = node.args[1]
                values = (
                    [mods.value]
                    if isinstance(mods, ast.Constant)
                    else [e.value for e in getattr(mods, "elts", []) if isinstance(e, ast.Constant)]
                )
                found |= {v.split(".")[0] for v in values}
    return found


def test_the_profiler_extra_provides_what_the_profiler_needs():
    extra = _extra("profiler")
    needed = _required_modules("profiler") | {"onnx", "sympy"}  # roofline: onnx graphs, onnxruntime's symbolic shapes
    assert {"onnx", "matplotlib"} <= needed
    owners = md.packages_distributions()
    for module in sorted(needed):
        dists = {d.lower() for d in owners.get(module, [])}
        assert dists, f"{module} is not installed here: cannot tell its distribution"
        assert dists & extra, f"{module} (from {sorted(dists)}) is not in the [profiler] extra {sorted(extra)}"


def test_readme_row_lists_the_profiler_extra():
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `[profiler]` |"))
    listed = {x.strip().lower() for x in row.split("|")[2].split(",")}
    assert listed == _extra("profiler"), row


def test_graph_analysis_without_sympy_falls_back_to_onnx_inference(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.5] * 32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code = (
        "import sys; sys.modules['sympy'] = None\n"  # as on a device where sympy is not installed
        "from edgesdk.profiler.roofline import onnx_work\n"
        f"w = onnx_work({str(path)!r}, batch=2, seq=3)\n"
        "print(w.flops, w.weight_bytes)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    flops, weight_bytes = map(float, done.stdout.split())
    assert flops == 2 * 2 * 3 * 8 * 4 and weight_bytes == 8 * 4 * 4
