# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the CLI reliability tests: the edgesdk CLI in a child process, a tiny real ONNX bundle built
by it, and the peak RSS of `edgesdk check traces` in a child."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from edgesdk.host import thread_cap

#: llama.cpp threads for the tests that name a count: the product's own cap (OMP_NUM_THREADS, host.thread_cap), which
#: tests/conftest.py sets to 1 under pytest-xdist (`make test`: two workers on two cores, where two threads per
#: llama.cpp context waited on each other's barriers while the other worker held a core: a json_schema test took 51 s
#: with 2 threads beside a busy core, 23 s with 1); else 2, the 2-core machines this suite targets.
THREADS = thread_cap() or 2


def cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m edgesdk ARGS`` in a child process, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "edgesdk", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def build_matmul_bundle(root: Path, weight: np.ndarray, timeout: float = 300) -> Path:
    """A real bundle of x[N,4] @ W[4,4] (neither an LLM nor an embedding model), built by ``edgesdk build`` into
    ``root/bundle`` from ``root/src/model.onnx``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(weight.astype(np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.metadata_props.add(key="license", value="apache-2.0")
    (root / "src").mkdir()
    onnx.save(model, str(root / "src" / "model.onnx"))
    res = cli(
        "build",
        root / "src" / "model.onnx",
        "-p",
        "cpu-x86_64",
        "--precision",
        "fp32",
        "-o",
        root / "bundle",
        "--no-progress",
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr
    return root / "bundle"


def check_traces_peak_rss_mb(path: Path) -> tuple[float, subprocess.CompletedProcess]:
    """`edgesdk check traces PATH` in a child that reports its own peak RSS (MB) on stdout's last line."""
    code = textwrap.dedent(f"""
        import resource, sys
        from edgesdk.cli import main
        sys.argv = ["edgesdk", "check", "traces", {str(path)!r}]
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
        print("peak_rss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        sys.exit(code)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return int(res.stdout.strip().splitlines()[-1].split()[1]) / 1024, res
