# SPDX-License-Identifier: Apache-2.0
"""The runtime install, for real: build the wheel, install it with NO extras into a fresh venv, and
use the installed `edgesdk` command the way a device would.

Needs pip to reach the package index (or its cache) for the runtime dependencies. Bundles are built
with this checkout's own CLI (the dev environment has every extra); everything after that runs in
the runtime-only venv. The venv's installed size is printed (docs/benchmarks.md records it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
# What `pip install edgesdk` must NOT pull in: each belongs to an extra (pyproject.toml).
NOT_IN_RUNTIME = (
    "onnxruntime-gpu",
    "onnx",
    "torch",
    "transformers",
    "optimum",
    "grpcio",
    "cyclonedx-python-lib",
    "scanoss",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "llama-cpp-python",
    "matplotlib",
    "nvidia-ml-py",
    "psutil",
    "starlette",
    "uvicorn",
)


def _run(cmd: list, *, timeout: float = 900, env: dict | None = None, cwd: Path | None = None):
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        cwd=cwd,
    )


def _dist_names(python: Path) -> set[str]:
    done = _run([python, "-m", "pip", "list", "--format=json"], timeout=120)
    assert done.returncode == 0, done.stderr
    return {d["name"].lower().replace("_", "-") for d in json.loads(done.stdout)}


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory) -> Path:
    """A fresh venv holding only `pip install <the wheel>`; returns its bin directory."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", REPO, "-w", dist],
        timeout=600,
        cwd=root,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("edgesdk-*.whl")
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", venv], timeout=300)
    assert made.returncode == 0, made.stderr
    bindir = venv / "bin"
    installed = _run([bindir / "python", "-m", "pip", "install", "-q", wheel], timeout=1200)
    if installed.returncode != 0 and "No matching distribution" in installed.stderr + installed.stdout:
        pytest.skip(f"the package index is not reachable: {installed.stderr.strip().splitlines()[-1]}")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site = Path(
        _run([bindir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    total = _du_mb(site)
    tooling_paths = [
        p for p in site.iterdir() if p.name.split("-")[0] in ("pip", "setuptools", "pkg_resources", "_distutils_hack")
    ]
    tooling = _du_mb(*tooling_paths) if tooling_paths else 0.0
    print(
        f"\nruntime-only venv: site-packages {total:.0f} MB ({total - tooling:.0f} MB without pip/setuptools, "
        f"which `python -m venv` puts there); {sysconfig.get_platform()}, Python {sys.version.split()[0]}"
    )
    return bindir


def _du_mb(*paths: Path) -> float:
    """Disk use in MB of ``paths`` together, as `du -smc` reports it (docs/benchmarks.md uses the same)."""
    if shutil.which("du"):
        return float(_run(["du", "-smc", *paths], timeout=120).stdout.splitlines()[-1].split()[0])
    files = [f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file() and not f.is_symlink()]
    return sum(f.stat().st_size for f in files) / 2**20


@pytest.fixture(scope="module")
def minilm_cpu_bundle(minilm_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel-bundles") / "minilm-cpu"
    done = _run(
        [sys.executable, "-m", "edgesdk", "build", minilm_dir, "--profile", "cpu-x86_64", "-o", out, "--no-progress"]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def gguf_bundle(gemma_gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel-bundles") / "gemma-cpu"
    done = _run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "build",
            gemma_gguf,
            "--profile",
            "cpu-x86_64",
            "-o",
            out,
            "--accept-license",
            "LicenseRef-gemma",
            "--no-progress",
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _cli(bindir: Path, *args, cwd: Path | None = None):
    return _run([bindir / "edgesdk", *args], timeout=600, cwd=cwd)


def _one_error_line(done) -> str:
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_runtime_install_leaves_the_extras_out(runtime_venv):
    names = _dist_names(runtime_venv / "python")
    assert {"edgesdk", "onnxruntime", "tokenizers", "numpy", "opentelemetry-api"} <= names
    assert not names & set(NOT_IN_RUNTIME), sorted(names & set(NOT_IN_RUNTIME))


def test_profiles_ship_in_the_wheel(runtime_venv, tmp_path):
    done = _cli(runtime_venv, "profiles", "list", "--json", cwd=tmp_path)  # not the checkout: no profiles/ here
    assert done.returncode == 0, done.stderr
    profiles = json.loads(done.stdout)
    assert len(profiles) == 11
    venv_root = runtime_venv.parent.resolve()
    assert all(Path(p["path"]).resolve().is_relative_to(venv_root) for p in profiles)
    shown = _cli(runtime_venv, "profiles", "show", "orin", cwd=tmp_path)
    assert shown.returncode == 0 and "orin-agx-64gb" in shown.stdout


def test_doctor(runtime_venv, tmp_path):
    done = _cli(runtime_venv, "doctor", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    row = next(ln for ln in done.stdout.splitlines() if ln.startswith("onnxruntime "))
    assert " yes " in row


def test_run_and_check_licenses_of_a_cpu_bundle(runtime_venv, minilm_cpu_bundle, tmp_path):
    done = _cli(runtime_venv, "run", minilm_cpu_bundle, "--input", "some text", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 x 384" in done.stdout
    checked = _cli(runtime_venv, "check", "licenses", minilm_cpu_bundle, "--summary", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("license verdict: PASS"), checked.stdout


def test_build_names_the_build_extra(runtime_venv, minilm_cpu_bundle, tmp_path):
    done = _cli(
        runtime_venv,
        "build",
        minilm_cpu_bundle / "model.onnx",
        "--profile",
        "cpu-x86_64",
        "-o",
        tmp_path / "out",
        cwd=tmp_path,
    )
    assert done.returncode == 10
    line = _one_error_line(done)
    assert line.startswith("error: edgesdk build needs the build extra: pip install 'edgesdk[build]'"), line
    assert not (tmp_path / "out").exists()


def test_gguf_bundle_names_the_gguf_extra(runtime_venv, gguf_bundle, tmp_path):
    done = _cli(runtime_venv, "run", gguf_bundle, "--prompt", "hi", cwd=tmp_path)
    assert done.returncode == 10
    line = _one_error_line(done)
    assert line.startswith("error: a GGUF bundle needs the gguf extra: pip install 'edgesdk[gguf]'"), line


def test_plot_names_the_profiler_extra(runtime_venv, minilm_cpu_bundle, tmp_path):
    done = _cli(
        runtime_venv, "profiler", "run", minilm_cpu_bundle, "--plot", tmp_path / "p.png", "--no-progress", cwd=tmp_path
    )
    assert done.returncode == 10
    line = _one_error_line(done)
    assert line.startswith("error: --plot needs the profiler extra: pip install 'edgesdk[profiler]'"), line
    assert not (tmp_path / "p.png").exists()


def test_trace_file_names_the_otel_extra(runtime_venv, minilm_cpu_bundle, tmp_path):
    done = _cli(
        runtime_venv, "run", minilm_cpu_bundle, "--input", "x", "--trace-file", tmp_path / "t.jsonl", cwd=tmp_path
    )
    assert done.returncode == 10
    assert "needs the otel extra: pip install 'edgesdk[otel]'" in _one_error_line(done)


def test_two_onnxruntime_builds_are_refused(runtime_venv, minilm_cpu_bundle, tmp_path):
    """What `pip install 'edgesdk[gpu]'` leaves behind (pip cannot drop the base onnxruntime): both
    distributions recorded as installed. A stand-in onnxruntime-gpu record (metadata only) is enough
    for the check, which reads distribution metadata."""
    purelib = Path(
        _run(
            [runtime_venv / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    record = purelib / "onnxruntime_gpu-1.31.1.dist-info"
    record.mkdir()
    try:
        (record / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.31.1\n")
        done = _cli(runtime_venv, "run", minilm_cpu_bundle, "--input", "x", cwd=tmp_path)
    finally:
        shutil.rmtree(record)
    assert done.returncode == 10
    line = _one_error_line(done)
    assert "onnxruntime and onnxruntime-gpu are both installed" in line
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install --no-deps onnxruntime-gpu" in line
