# SPDX-License-Identifier: Apache-2.0
"""Probe this machine for every backend the runtime can use, and say why each missing one is missing.

Host facts (GPUs, Jetson, TensorRT, ``trtexec``, versions) come from :func:`edgesdk.host.probe`; what is
added here is the diagnosis: whether each runtime library actually imports and each listed ONNX
Runtime execution provider actually initialises.
"""

from __future__ import annotations

import importlib
import platform
import shutil
from typing import Any

from edgesdk.host import HostFacts, probe, tool_versions


def _dist_version(*names: str) -> str | None:
    found = tool_versions(names)
    return next((found[n] for n in names if n in found), None)


def _ort_checks(host: HostFacts) -> list[dict[str, Any]]:
    out = []
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return [{"component": "onnxruntime", "available": False, "version": None, "detail": f"not importable: {exc}"}]
    from edgesdk.errors import EdgeSDKError
    from edgesdk.extras import check_onnxruntime

    version = ort.__version__
    listed = list(host.onnxruntime_providers)
    try:
        check_onnxruntime()
    except EdgeSDKError as exc:  # two ONNX Runtime builds installed: `run` refuses, say why here too
        return [{"component": "onnxruntime", "available": False, "version": version, "detail": exc.one_line()}]
    out.append(
        {
            "component": "onnxruntime",
            "available": True,
            "version": version,
            "detail": f"providers built in: {', '.join(listed)}",
        }
    )
    from edgesdk.runtime.backends.onnxruntime import probe_provider

    for ep in ("TensorrtExecutionProvider", "CUDAExecutionProvider"):
        if ep not in listed:
            out.append(
                {
                    "component": f"ORT {ep}",
                    "available": False,
                    "version": version,
                    "detail": "not built into this onnxruntime package (install onnxruntime-gpu)",
                }
            )
            continue
        ok, why = probe_provider(ep)
        out.append(
            {
                "component": f"ORT {ep}",
                "available": ok,
                "version": version,
                "detail": "initialised on a probe model" if ok else f"listed, but {why}",
            }
        )
    out.append(
        {
            "component": "ORT CPUExecutionProvider",
            "available": "CPUExecutionProvider" in listed,
            "version": version,
            "detail": "always last in every chain",
        }
    )
    return out


def _nvidia(host: HostFacts) -> dict[str, Any]:
    if host.jetson is not None:
        j = host.jetson
        return {
            "component": "NVIDIA GPU",
            "available": True,
            "version": f"L4T {j.l4t}" if j.l4t else None,
            "detail": f"Jetson {j.model or j.platform or 'unknown model'}"
            + (f", sm_{j.sm} ({j.sm_source})" if j.sm else ""),
        }
    if host.gpus:
        return {
            "component": "NVIDIA GPU",
            "available": True,
            "version": host.gpus[0].driver,
            "detail": ", ".join(f"{g.name} (sm_{g.sm})" for g in host.gpus),
        }
    smi = shutil.which("nvidia-smi")
    why = "nvidia-ml-py not installed" if "nvidia-ml-py" not in host.versions else "NVML unavailable or reports none"
    tegra = platform.machine() == "aarch64" and shutil.which("tegrastats")
    return {
        "component": "NVIDIA GPU",
        "available": bool(tegra),
        "version": None,
        "detail": "Jetson (tegrastats present; NVML is limited on Orin)"
        if tegra
        else f"none found ({why}{'; nvidia-smi present' if smi else '; no nvidia-smi, no driver'})",
    }


def _module(component: str, module: str, dists: tuple[str, ...], missing_hint: str) -> dict[str, Any]:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return {
            "component": component,
            "available": False,
            "version": None,
            "detail": f"{missing_hint} ({exc.__class__.__name__}: {exc})"[:200],
        }
    except OSError as exc:  # shared library present but unloadable
        return {
            "component": component,
            "available": False,
            "version": _dist_version(*dists),
            "detail": f"installed but its native library failed to load: {exc}"[:200],
        }
    return {"component": component, "available": True, "version": _dist_version(*dists), "detail": "importable"}


def _llama_cpp() -> dict[str, Any]:
    """llama-cpp-python: how its libraries are linked (read before loading them), then whether it imports."""
    from edgesdk.native import REBUILD_HINT, llama_cpp_build

    build = llama_cpp_build()
    if build["installed"] and build["problem"]:
        return {
            "component": "llama.cpp (llama-cpp-python)",
            "available": False,
            "version": _dist_version("llama-cpp-python"),
            "detail": f"{build['problem']}; edgesdk loads onnxruntime first to avoid it, but other orders "
            f"crash: {REBUILD_HINT}",
        }
    row = _module(
        "llama.cpp (llama-cpp-python)",
        "llama_cpp",
        ("llama-cpp-python",),
        "not installed: pip install 'edgesdk[gguf]' with CMAKE_ARGS=-DGGML_NATIVE=OFF",
    )
    if row["available"]:
        row["detail"] = ("importable, CUDA build" if build["cuda"] else "importable, CPU build") + (
            f", C++ runtime {', '.join(sorted(set(filter(None, build['cxx_runtime'].values()))))}"
            if build["cxx_runtime"]
            else ""
        )
    return row


def diagnose(host: HostFacts | None = None) -> list[dict[str, Any]]:
    """One row per component: usable here or not, its version, and why."""
    host = host if host is not None else probe()
    checks = _ort_checks(host)
    if host.tensorrt:
        checks.append(
            {"component": "TensorRT (Python API)", "available": True, "version": host.tensorrt, "detail": "importable"}
        )
    else:
        checks.append(
            {
                "component": "TensorRT (Python API)",
                "available": False,
                "version": _dist_version("tensorrt", "tensorrt-cu12", "tensorrt-cu13"),
                "detail": (
                    "TensorRT ships with JetPack and NVIDIA containers, not PyPI; bundles defer the "
                    f"engine build to the device ({host.tensorrt_reason})"
                )[:200],
            }
        )
    checks.append(
        {
            "component": "trtexec",
            "available": bool(host.trtexec),
            "version": None,
            "detail": host.trtexec or "not on PATH nor at /usr/src/tensorrt/bin/trtexec",
        }
    )
    checks.append(_llama_cpp())
    checks.append(
        _module(
            "PyTorch (eager backend, exporters)", "torch", ("torch",), "not installed: pip install 'edgesdk[build]'"
        )
    )
    checks.append(_nvidia(host))
    return checks
