# SPDX-License-Identifier: Apache-2.0
"""Issue 25, "also open": ``edgesdk serve`` start-up failures are one ``error:`` line with exit 3.

The port-in-use case is in tests/test_reliability_r2_serve.py; these are the other ways start-up fails
before a model is loaded: an address that is not this machine's, a name that does not resolve, a port
out of range, a bundle that is missing or not servable, negative threads. Each runs the real CLI.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from cli_fixtures import build_matmul_bundle, cli

pytest.importorskip("onnx")
pytest.importorskip("uvicorn")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def matmul_bundle(tmp_path_factory) -> Path:
    """A real bundle of x[N,4] @ W[4,4] (neither an LLM nor an embedding model: serve refuses it)."""
    return build_matmul_bundle(tmp_path_factory.mktemp("i25-startup"), np.eye(4))


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--host", "192.0.2.1", "--port", "8123"],  # TEST-NET-1 (RFC 5737): never this machine's
            "error: cannot listen on 192.0.2.1:8123: the address is not one of this machine's (check --host)",
        ),
        (
            ["--host", "no-such-host.invalid", "--port", "8123"],  # .invalid never resolves (RFC 2606)
            "error: cannot listen on no-such-host.invalid:8123: ",
        ),
        (["--port", "70000"], "error: Invalid value for '--port': 70000 is not in the range 0<=x<=65535."),
        (["--port", "0", "--threads", "-4"], "error: threads must be a positive integer (CPU threads), got -4"),
        (
            ["--port", "0"],
            "error: bundle BUNDLE (onnx, task 'other') is neither an LLM (GGUF), a VLM nor a text-embedding model",
        ),
    ],
)
def test_serve_start_up_failure_is_one_error_line_and_exit_3(matmul_bundle, args, says):
    res = cli("serve", matmul_bundle, *args)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 3, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(says.replace("BUNDLE", str(matmul_bundle))), res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "INFO" not in res.stderr and "Errno" not in res.stderr


def test_serve_of_a_missing_bundle_is_one_error_line(tmp_path):
    res = cli("serve", tmp_path / "nope", "--port", "0")
    assert res.returncode == 3, res.stderr
    assert res.stderr.strip().splitlines() == [f"error: bundle not found: {tmp_path / 'nope'}"]
