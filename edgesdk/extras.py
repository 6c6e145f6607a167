# SPDX-License-Identifier: Apache-2.0
"""The optional parts of edgesdk (pip extras), and the one way to say that one is missing.

``pip install edgesdk`` is the runtime: it loads, verifies and runs ONNX bundles on onnxruntime,
embeds text, reads profiles, runs ``doctor`` and ``check licenses``. Everything else is an extra
(pyproject.toml): code that needs one calls :func:`require` before it starts, so the user gets one
line naming the extra instead of a ``ModuleNotFoundError`` halfway through::

    require("build", BUILD_MODULES, "edgesdk build")
    # error: edgesdk build needs the build extra: pip install 'edgesdk[build]' (missing: torch, optimum)

:func:`check_onnxruntime` refuses an environment holding two builds of ONNX Runtime at once (they
install the same ``onnxruntime`` module, so which one loads depends on install order).
Imports nothing heavy and nothing from edgesdk but ``errors``, so every layer may use it.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from collections.abc import Iterable

from edgesdk.errors import ExternalToolError, MissingExtraError

# extra -> what it adds (for messages and docs; pyproject.toml is the source of the requirements).
EXTRAS: dict[str, str] = {
    "gpu": "onnxruntime-gpu instead of onnxruntime (CUDA and TensorRT execution providers)",
    "gguf": "the llama.cpp runtime for GGUF bundles (llama-cpp-python, gguf)",
    "otel": "the OpenTelemetry SDK and OTLP exporters (--trace-file, OTEL_EXPORTER_OTLP_*)",
    "build": "export, quantization, GGUF conversion, SBOM and SCANOSS for `edgesdk build`",
    "profiler": "the device profiler's graph analysis, NVML readings and plots",
    "serve": "the OpenAI-compatible HTTP server (`edgesdk serve`: Starlette, uvicorn, pydantic)",
    "sign": "OpenSSF model-signing: `edgesdk sign`, `push --sign`, `verify`, `pull --require-signature`",
    "bench": "tools/bench/bench_serve_llm.py's baseline: llama-cpp-python's own server (llama_cpp.server)",
}

# Top-level modules `edgesdk build` needs whatever the source (export, optimize/quantize, SBOM).
BUILD_MODULES = ("onnx", "onnxslim", "cyclonedx")
# Exporting a Hugging Face / PyTorch model additionally needs these.
EXPORT_MODULES = ("torch", "transformers", "optimum", "safetensors")

# Builds of ONNX Runtime that all install the module `onnxruntime`.
ONNXRUNTIME_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
)


def install_command(extra: str) -> str:
    return f"pip install 'edgesdk[{extra}]'"


def missing_modules(modules: str | Iterable[str]) -> list[str]:
    """The top-level modules of ``modules`` that cannot be found (nothing is imported)."""
    names = [modules] if isinstance(modules, str) else list(modules)
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that fails to import, or a broken spec
            found = False
        if not found:
            out.append(name)
    return out


def have(modules: str | Iterable[str]) -> bool:
    return not missing_modules(modules)


def require(extra: str, modules: str | Iterable[str], what: str) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` when any of ``modules`` is not installed.

    ``what`` is the thing the user asked for, as they typed it (``edgesdk build``, ``--plot``,
    ``a GGUF bundle``). Only looks the modules up; the caller imports them where it uses them.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    missing = missing_modules(modules)
    if missing:
        raise MissingExtraError(
            f"{what} needs the {extra} extra: {install_command(extra)}",
            hint=f"missing: {', '.join(missing)}",
            extra=extra,
        )


def installed_onnxruntimes() -> list[str]:
    """Which ONNX Runtime distributions are installed here (normally exactly one)."""
    found = []
    for name in ONNXRUNTIME_DISTRIBUTIONS:
        try:
            md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_onnxruntime() -> None:
    """Refuse two ONNX Runtime builds in one environment, with the commands that fix it.

    onnxruntime and onnxruntime-gpu write the same files; with both installed the module is whichever
    was installed last, and removing one breaks the other (ONNX Runtime's install guide: only one of
    them may be installed in an environment).
    """
    found = installed_onnxruntimes()
    if len(found) <= 1:
        return
    keep = "onnxruntime-gpu" if "onnxruntime-gpu" in found else found[-1]
    raise ExternalToolError(
        f"{' and '.join(found)} are both installed: they share the `onnxruntime` module, so which one runs is "
        f"undefined",
        hint=f"keep one: pip uninstall -y {' '.join(found)} && pip install --no-deps {keep} (README: GPU hosts)",
    )
